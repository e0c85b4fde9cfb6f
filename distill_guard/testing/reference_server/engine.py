"""The emulated SGLang engine behind the reference server: scoring, sleep and wake, weights.

Not SGLang. It holds a :class:`~distill_guard.teachers.TorchTeacher` and answers each native
endpoint's request as SGLang's engine would, errors included (see ``docs/sglang-contract.md``).
The HTTP routes are in :mod:`.app`, the serving in :mod:`.serve`.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from distill_guard import __version__
from distill_guard.teachers._sglang_wire import build_score_item, json_safe
from distill_guard.teachers.base import ALL_TAGS, TeacherError, TeacherStateError, normalize_tags
from distill_guard.teachers.torch_teacher import TorchTeacher

NO_AUTH_PATHS = frozenset({"/health", "/health_generate", "/ready"})


class ContractError(Exception):
    """A request that breaks the API contract: 400 ``{"error": "<msg>"}`` as SGLang sends it."""


class SchedulerDead(Exception):
    """The emulated scheduler is dead: 503 to everything."""


class SchedulerKilled(SchedulerDead):
    """This request killed the scheduler (a second release): 500, then dead."""


class ReferenceServer:
    """The state behind the app: the teacher, whether the scheduler is dead, the server's settings."""

    def __init__(
        self,
        teacher: TorchTeacher,
        *,
        old_api: bool = False,
        api_key: str | None = None,
        launch_command: str = "",
    ) -> None:
        self.teacher = teacher
        self.old_api = old_api
        self.api_key = api_key
        self.launch_command = launch_command
        self.dead_reason: str | None = None
        self.started = time.time()

    def check_alive(self) -> None:
        if self.dead_reason is not None:
            raise SchedulerDead(self.dead_reason)

    # -- /generate ---------------------------------------------------------------------------

    def generate(self, body: Any) -> Any:
        self.check_alive()
        if not isinstance(body, dict):
            raise ContractError("request body must be a JSON object")
        ids = body.get("input_ids")
        if ids is None:
            if body.get("text") is not None:
                raise TeacherError("the reference server has no tokenizer: send input_ids")
            raise ContractError("one of text or input_ids is required")
        single = isinstance(ids, list) and (len(ids) == 0 or isinstance(ids[0], int))
        batch = [ids] if single else ids
        if (
            not isinstance(batch, list)
            or not batch
            or not all(
                isinstance(s, list) and s and all(isinstance(t, int) for t in s) for s in batch
            )
        ):
            raise ContractError("input_ids must be a non-empty list of ints or of int lists")
        n = len(batch)
        sampling = _per_item(body.get("sampling_params") or {}, n, "sampling_params")
        for sp in sampling:
            if (sp or {}).get("max_new_tokens", 128) != 0:
                raise TeacherError(
                    "the reference server only scores: set sampling_params.max_new_tokens to 0"
                )
        want_lp = _per_item(body.get("return_logprob", False), n, "return_logprob")
        starts = _per_item(body.get("logprob_start_len", -1), n, "logprob_start_len")
        topks = _per_item(body.get("top_logprobs_num", 0) or 0, n, "top_logprobs_num")
        t0 = time.perf_counter()
        items: list[dict[str, Any] | None] = [None] * n
        groups: dict[tuple[int, int], list[int]] = {}
        for i, seq in enumerate(batch):
            start = len(seq) if (starts[i] is None or starts[i] == -1) else int(starts[i])
            if start > len(seq):
                raise TeacherError(
                    f"logprob_start_len ({start}) is greater than the input length ({len(seq)})"
                )
            if not want_lp[i]:
                items[i] = _strip_logprobs(build_score_item(seq, _empty(), None, None, len(seq)))
            elif start == len(seq):
                items[i] = build_score_item(seq, _empty(), None, None, start)
            else:
                groups.setdefault((start, int(topks[i])), []).append(i)
        for (start, k), idx in groups.items():
            res = self.teacher.score([batch[i] for i in idx], top_k=k, logprob_start_len=start)
            for j, i in enumerate(idx):
                items[i] = build_score_item(
                    batch[i],
                    res.token_logprobs[j],
                    res.topk_logprobs[j] if res.topk_logprobs else None,
                    res.topk_ids[j] if res.topk_ids else None,
                    start,
                    latency_s=time.perf_counter() - t0,
                )
        out = json_safe(items)
        return out[0] if single else out

    # -- memory ------------------------------------------------------------------------------

    def _tags(self, body: Any) -> tuple[str, ...]:
        if self.old_api or not isinstance(body, dict):
            return ALL_TAGS
        try:
            return normalize_tags(body.get("tags"))
        except (TypeError, ValueError) as e:
            raise TeacherError(str(e)) from e

    def release(self, body: Any) -> None:
        self.check_alive()
        tags = self._tags(body)
        try:
            self.teacher.release(tags)
        except TeacherStateError as e:
            self.dead_reason = (
                f"scheduler died: release of {sorted(set(tags) & self.teacher.sleep_state.released)} "
                "that was already released (in SGLang torch_memory_saver exit(1)s here); "
                "restart the server"
            )
            raise SchedulerKilled(self.dead_reason) from e

    def resume(self, body: Any) -> None:
        self.check_alive()
        tags = self._tags(body)
        missing = [t for t in tags if t not in self.teacher.sleep_state.released]
        if missing:
            raise TeacherError(f"KeyError: {missing[0]!r} (resume of a tag that is not released)")
        self.teacher.resume(tags)

    def update_weights_from_disk(self, body: Any) -> tuple[int, dict[str, Any]]:
        self.check_alive()
        path = body.get("model_path") if isinstance(body, dict) else None
        if not path:
            return 400, {
                "success": False,
                "message": "model_path is required",
                "num_paused_requests": 0,
            }
        try:
            self.teacher.reload_weights(str(path))
        except TeacherError as e:
            return 400, {
                "success": False,
                "message": f"Failed to update weights: {e}",
                "num_paused_requests": 0,
            }
        self.teacher.model_path = str(path)
        return 200, {
            "success": True,
            "message": "Succeeded to update model weights.",
            "num_paused_requests": 0,
        }

    def server_info(self) -> dict[str, Any]:
        self.check_alive()
        info = dict(self.teacher.server_info())
        info.update(
            {
                "launch_command": self.launch_command,
                "status": "ready",
                "max_total_num_tokens": 4096,
                "max_req_input_len": 4096,
                "internal_states": [{"released_tags": sorted(self.teacher.sleep_state.released)}],
                "version": f"distill_guard-reference-server {__version__} (not SGLang)",
                "startup_time": self.started,
            }
        )
        return info

    def model_info(self) -> dict[str, Any]:
        self.check_alive()
        config = getattr(self.teacher.model, "config", None)
        return {
            "model_path": self.teacher.model_path,
            "served_model_name": self.teacher.model_path,
            "tokenizer_path": None,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "load_format": "safetensors",
            "model_type": getattr(config, "model_type", None),
            "architectures": getattr(config, "architectures", None),
            "has_image_understanding": False,
            "has_audio_understanding": False,
        }


def _empty() -> torch.Tensor:
    return torch.empty(0)


def _strip_logprobs(item: dict[str, Any]) -> dict[str, Any]:
    meta = item["meta_info"]
    for key in [k for k in meta if "logprobs" in k]:
        del meta[key]
    return item


def _per_item(value: Any, n: int, name: str) -> list[Any]:
    if isinstance(value, list):
        if len(value) != n:
            raise ContractError(f"{name} has {len(value)} entries for {n} inputs")
        return value
    return [value] * n
