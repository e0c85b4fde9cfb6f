"""The emulated SGLang engine behind the reference server: scoring, sleep and wake, weights.

Not SGLang. It holds a :class:`~distill_guard.teachers.TorchTeacher` and answers each native
endpoint's request as SGLang's engine would, errors included (see ``docs/sglang-contract.md``).
The HTTP routes are in :mod:`.app`, the serving in :mod:`.serve`, the request-field checks in
:mod:`.request_fields`, the refusals in :mod:`.errors`.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from distill_guard._version import __version__
from distill_guard.teachers._sglang_wire import build_score_item, json_safe
from distill_guard.teachers.base import TeacherError, normalize_tags
from distill_guard.teachers.capabilities import capabilities_for
from distill_guard.teachers.torch_teacher import TorchTeacher
from distill_guard.testing.reference_server.errors import (
    Busy,
    ContractError,
    SchedulerDead,
    SchedulerKilled,
)
from distill_guard.testing.reference_server.request_fields import input_batch, scoring_fields

NO_AUTH_PATHS = frozenset({"/health", "/health_generate", "/ready"})
ADMIN_PATHS = frozenset(
    {
        "/release_memory_occupation",
        "/resume_memory_occupation",
        "/update_weights_from_disk",
        "/flush_cache",
        "/weights_checker",
        "/pause_generation",
        "/continue_generation",
    }
)
"""Endpoints that take only ``--admin-api-key`` when the server has one (SGLang ≥ 0.5.6)."""


class ReferenceServer:
    """The state behind the app: the teacher, the version it answers as, what is in flight.

    ``version`` picks the SGLang release whose behaviour is emulated (``docs/sglang-contract.md``
    §7.2): whether memory tags are honoured, the default tags, ``/server_info`` and
    ``/model_info``, the ``/weights_checker`` checksum. Where SGLang's server process dies (a
    resume of a tag that is not released, a release while requests are in flight, a second
    release), this one calls ``on_fatal``: in a thread it stops serving, as a command it exits.
    """

    def __init__(
        self,
        teacher: TorchTeacher,
        *,
        version: str = "0.5.23",
        api_key: str | None = None,
        admin_api_key: str | None = None,
        launch_command: str = "",
        latency_s: float = 0.0,
    ) -> None:
        self.teacher = teacher
        self.version = version
        self.caps = capabilities_for(version)
        self.api_key = api_key
        self.admin_api_key = admin_api_key
        self.launch_command = launch_command
        self.latency_s = latency_s
        """Extra seconds each ``/generate`` takes (so tests can have requests in flight)."""
        self.launch_model_path = teacher.model_path
        """``/server_info``'s ``model_path``: the launch path, which never changes."""
        self.weight_version = "default"
        self.dead_reason: str | None = None
        self.started = time.time()
        self.on_fatal: Callable[[], None] = lambda: None
        """Set by the serving layer: what happens to the process when the scheduler dies."""
        self._state = threading.Condition()
        self._in_flight = 0
        self._paused = False

    def check_alive(self) -> None:
        if self.dead_reason is not None:
            raise SchedulerDead(self.dead_reason)

    # -- /generate ---------------------------------------------------------------------------

    def generate(self, body: Any) -> Any:
        self.check_alive()
        with self._state:
            self._state.wait_for(lambda: not self._paused or self.dead_reason is not None)
            self.check_alive()
            self._in_flight += 1
        try:
            if self.latency_s:
                time.sleep(self.latency_s)
            return self._generate(body)
        finally:
            with self._state:
                self._in_flight -= 1
                self._state.notify_all()

    def _generate(self, body: Any) -> Any:
        batch, single = input_batch(body)
        n = len(batch)
        self._check_lengths_and_ids(batch)
        want_lp, starts, topks = scoring_fields(body, n)
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

    @property
    def context_len(self) -> int:
        """The model's ``max_position_embeddings``, as SGLang derives its context length."""
        config = getattr(self.teacher.model, "config", None)
        return int(getattr(config, "max_position_embeddings", None) or 4096)

    def _check_lengths_and_ids(self, batch: list[list[int]]) -> None:
        """SGLang refuses an input of ``context_len`` tokens or more (``_validate_one_request``,
        a 400). An id outside the vocabulary is refused too: SGLang does not check it, and on a
        GPU it ends in a device-side assert, so our client must never send one."""
        vocab = self.teacher.vocab_size
        for seq in batch:
            if len(seq) >= self.context_len:
                raise TeacherError(
                    f"The input ({len(seq)} tokens) is longer than the model's context length "
                    f"({self.context_len} tokens)."
                )
            bad = [t for t in seq if t < 0 or (vocab is not None and t >= vocab)]
            if bad:
                raise TeacherError(
                    f"input_ids hold {len(bad)} id(s) outside the vocabulary "
                    f"[0, {vocab}), first {bad[0]}"
                )

    # -- memory ------------------------------------------------------------------------------

    def _tags(self, body: Any) -> tuple[str, ...]:
        all_tags = self.caps.memory_tags
        if not self.caps.tags or not isinstance(body, dict) or not body.get("tags"):
            return self.caps.default_tags if self.caps.tags else all_tags
        try:
            tags = normalize_tags(body.get("tags"))
        except (TypeError, ValueError) as e:
            raise TeacherError(str(e)) from e
        unknown = [t for t in tags if t not in all_tags]
        if unknown:
            raise TeacherError(f"unknown memory tags {unknown} on SGLang {self.version}")
        return tags

    def fatal(self, reason: str) -> SchedulerKilled:
        """The scheduler died: SGLang SIGQUITs its parent and kills the process tree."""
        with self._state:
            self.dead_reason = f"scheduler died: {reason}; the server process is gone"
            self._state.notify_all()
        self.on_fatal()
        return SchedulerKilled(self.dead_reason)

    def release(self, body: Any) -> None:
        self.check_alive()
        tags = self._tags(body)
        with self._state:
            busy = self._in_flight
        if busy:
            raise self.fatal(
                f"release_memory_occupation with {busy} request(s) in flight (SGLang asserts "
                "is_fully_idle)"
            )
        again = sorted(set(tags) & self.teacher.sleep_state.released)
        if again:
            raise self.fatal(f"second release of {again} (torch_memory_saver exit(1)s in SGLang)")
        self.teacher.release(tags)

    def resume(self, body: Any) -> None:
        self.check_alive()
        tags = self._tags(body)  # untagged: every default tag, each of which must be released
        missing = [t for t in tags if t not in self.teacher.sleep_state.released]
        if missing:
            raise self.fatal(f"KeyError: {missing[0]!r} (resume of a tag that is not released)")
        self.teacher.resume(tags)

    def pause_generation(self, body: Any) -> None:
        """``/pause_generation``: new and waiting requests hold until ``/continue_generation``;
        the server is idle once the running ones finish (they finish; none is dropped)."""
        self.check_alive()
        with self._state:
            self._paused = True
            self._state.wait_for(lambda: self._in_flight == 0, timeout=60)

    def continue_generation(self, body: Any) -> None:
        self.check_alive()
        with self._state:
            self._paused = False
            self._state.notify_all()

    def flush_cache(self, timeout_s: float | None) -> None:
        """``/flush_cache``: refused (400) while requests run; ``?timeout=S`` waits for idle."""
        self.check_alive()
        with self._state:
            if not self._state.wait_for(lambda: self._in_flight == 0, timeout=timeout_s or 0):
                raise Busy("Cache not flushed: there are running or waiting requests")
        self.teacher.flush_cache()

    def weights_checker(self, body: Any) -> dict[str, Any]:
        """``/weights_checker {"action": "checksum"}``: hashes of the parameters, no forward
        pass. Non-persistent buffers (RoPE's ``inv_freq``) are not covered, as in SGLang."""
        self.check_alive()
        if not isinstance(body, dict) or body.get("action") != "checksum":
            raise ContractError("action must be 'checksum'")
        if "weights" in self.teacher.sleep_state.released:
            raise TeacherError("weights are released: resume before checking them")
        per_tensor = {}
        total = hashlib.sha256()
        for name, p in self.teacher.model.named_parameters():
            digest = hashlib.sha256(
                p.detach().cpu().contiguous().view(torch.uint8).numpy()
            ).hexdigest()
            per_tensor[name] = digest
            total.update(digest.encode())
        return {
            "success": True,
            "checksums": per_tensor,
            "per_engine_checksum": [total.hexdigest()],
        }

    def update_weights_from_disk(self, body: Any) -> tuple[int, dict[str, Any]]:
        """In place, from ``model_path``; with the default ``flush_cache`` it reports failure
        when the flush is refused by running requests, although the new weights are in."""
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
        self.weight_version = str(body.get("weight_version") or self.weight_version)
        if body.get("flush_cache", True):
            with self._state:
                busy = self._in_flight
            if busy:
                return 200, {
                    "success": False,
                    "message": "Succeeded to update model weights, but failed to flush the cache: "
                    "there are running requests.",
                    "num_paused_requests": 0,
                }
            self.teacher.flush_cache()
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
                "model_path": self.launch_model_path,
                "launch_command": self.launch_command,
                "api_key": self.api_key,
                "admin_api_key": self.admin_api_key,
                "status": "ready",
                "max_total_num_tokens": 4096,
                "max_req_input_len": self.context_len - 1,
                "internal_states": [{"last_gen_throughput": 0.0}],
                "version": self.version,
                "emulated_by": f"distill_guard reference server {__version__} (NOT SGLang)",
                "startup_time": self.started,
            }
        )
        if not self.caps.weights_cpu_backup:
            info.pop("enable_weights_cpu_backup", None)
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
            "weight_version": self.weight_version,
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
