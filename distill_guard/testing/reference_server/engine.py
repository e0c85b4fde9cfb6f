"""The emulated SGLang engine behind the reference server: scoring, pause, sleep and wake, weights.

Not SGLang. It holds a :class:`~distill_guard.teachers.TorchTeacher` and answers each native
endpoint's request as the SGLang version it is set to would, errors and deaths included: every
per-version behaviour comes from ``capabilities_for(version)``, the rows of
``docs/sglang-contract.md`` §7.2 (:mod:`distill_guard.teachers.sglang_versions`). The request
lifecycle is in :mod:`.scheduler`, the ``/generate`` bodies in :mod:`.scoring`, the checksum in
:mod:`.checksum`, the HTTP routes in :mod:`.app`, the serving in :mod:`.serve`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable
from typing import Any

from distill_guard._version import __version__
from distill_guard.teachers.base import TeacherError, normalize_tags
from distill_guard.teachers.capabilities import capabilities_for
from distill_guard.teachers.sglang_versions import Checksum, IdleCheck, Outcome, Pause
from distill_guard.teachers.torch_teacher import TorchTeacher
from distill_guard.testing.reference_server import scoring
from distill_guard.testing.reference_server.checksum import checksum_answer
from distill_guard.testing.reference_server.errors import (  # the old import path of the errors
    BodyInvalid,
    Busy,
    ContractError,
    SchedulerDead,
    SchedulerKilled,
    Unhealthy,
)
from distill_guard.testing.reference_server.scheduler import (
    UNLIMITED,
    Ending,
    PauseMode,
    Scheduler,
)

__all__ = [
    "ADMIN_PATHS",
    "NO_AUTH_PATHS",
    "Busy",
    "ContractError",
    "ReferenceServer",
    "SchedulerDead",
    "SchedulerKilled",
]

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

FLUSHED = (
    "Cache flushed.\nPlease check backend logs for more details. (When there are running "
    "or waiting requests, the operation will not be performed.)\n"
)
"""``/flush_cache``'s body: on success, and on ≤0.5.9 on refusal too (0.4.8 ``http_server.py
:404-411``, 0.5.9 ``:710-719``)."""
FLUSH_FAILED = "Flush cache failed.\n"
"""An immediate refusal from 0.5.10 (``http_server.py:718-733``), with ``?timeout=``."""
FLUSH_TIMED_OUT = "Timed out waiting for idle state."
"""A ``?timeout=S`` that ran out (0.5.10 ``scheduler.py:2845-2887``)."""
RELOAD_FLUSH_REFUSED = (
    "Weights were updated, but the cache was not flushed because requests are still running "
    "or queued. Retract or finish them, then call /flush_cache."
)
"""0.5.22+ (0.5.23 ``weight_updater.py:120-133``): HTTP 400, the new weights in."""


class ReferenceServer:
    """The state behind the app: the teacher, the version it answers as, what is in flight.

    ``version`` picks the SGLang release whose behaviour is emulated (``docs/sglang-contract.md``
    §7.2). Where SGLang's server process dies (a failed release assert, a forward over released
    memory, a resume of a tag that is not released, a second release, a reload whose flush is
    refused before 0.5.22), this one calls ``on_fatal``: in a thread it stops serving, as a
    command it exits. ``latency_s``: how long each ``/generate`` runs before its forward;
    ``max_running_requests``: how many run at once (the rest wait in the queue).
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
        max_running_requests: int = UNLIMITED,
    ) -> None:
        self.teacher = teacher
        self.version = version
        self.caps = capabilities_for(version)
        self.api_key = api_key
        self.admin_api_key = admin_api_key
        self.launch_command = launch_command
        self.scheduler = Scheduler(latency_s=latency_s, max_running_requests=max_running_requests)
        self.launch_model_path = teacher.model_path
        """``/server_info``'s ``model_path``: the launch path, which never changes."""
        self.weight_version = "default"
        self.started = time.time()
        self.on_fatal: Callable[[], None] = lambda: None
        """Set by the serving layer: what happens to the process when the scheduler dies."""
        self.health_timeout_s = 20.0
        """How long ``/health`` waits for an answer: SGLang's ``SGLANG_HEALTH_CHECK_TIMEOUT``
        (20 s); tests shorten it."""

    @property
    def latency_s(self) -> float:
        """Extra seconds each ``/generate`` runs (so tests can have requests in flight)."""
        return self.scheduler.latency_s

    @latency_s.setter
    def latency_s(self, value: float) -> None:
        self.scheduler.latency_s = value

    @property
    def dead_reason(self) -> str | None:
        return self.scheduler.dead

    def check_alive(self) -> None:
        self.scheduler.check_alive()

    def fatal(self, reason: str) -> SchedulerKilled:
        """The scheduler died: SGLang SIGQUITs its parent and kills the process tree."""
        self.scheduler.kill(f"scheduler died: {reason}; the server process is gone")
        self.on_fatal()
        return SchedulerKilled(str(self.dead_reason))

    def _forward_guard(self, what: str, tags: Iterable[str]) -> None:
        """A forward, or a read or write of the weights, over released memory kills SGLang: no
        gate reads ``offload_tags``, and the CUDA error leaves the scheduler loop
        (``fatal_forward_released``, measured on an H200)."""
        released = sorted(set(tags) & self.teacher.sleep_state.released)
        if released:
            raise self.fatal(
                f"{what}: a forward over released memory ({released}): illegal memory access"
            )

    # -- /generate ---------------------------------------------------------------------------

    def generate(self, body: Any) -> Any:
        """Checked first (400s), then held, queued, run and forwarded (:mod:`.scheduler`). A
        request a pause aborts is answered 200 with an abort ``finish_reason``."""
        self.check_alive()
        vocab = self.teacher.vocab_size
        p = scoring.plan(body, vocab=vocab, context_len=self.context_len)
        if self.caps.token_id_past_vocab is Outcome.REFUSED_400:  # _validate_token_ids_logprob
            bad = [t for ids in p.token_ids if ids for t in ids if t < 0 or t >= (vocab or t + 1)]
            if bad:
                raise TeacherError(
                    f"token_ids_logprob must hold token ids in [0, {vocab}), got {bad[0]}"
                )
        ending, items = self.scheduler.run(lambda: self._forward(p), mark=p.prefill)
        if ending is Ending.ABORTED_WAITING:
            # the waiting-queue abort message changed in 0.5.5 (answers Q3), where the release
            # got its assert: release_check is NOTHING on exactly 0.4.7-0.5.4
            before = self.caps.release_check is IdleCheck.NOTHING
            return scoring.aborted_in_waiting_queue(p, before_0_5_5=before)
        return scoring.answer(p, items, aborted=ending is Ending.ABORTED_RUNNING)

    def _forward(self, p: scoring.Plan) -> list[dict[str, Any]]:
        self._forward_guard("a /generate", self.teacher.sleep_state.released)
        batch = [p.prefill, *self.scheduler.batch]
        if self.caps.mixed_token_ids_batch is Outcome.KILLS and scoring.mixed_token_ids(batch):
            raise self.fatal(
                "a prefill batch mixing a token_ids_logprob request with a logprob request "
                "without it: torch.tensor(None) in get_token_ids_logprobs_raw (TypeError)"
            )
        outside = p.ids_outside(self.teacher.vocab_size)
        if outside:
            raise self.fatal(
                f"a /generate asked token_ids_logprob for id {outside[0]}, past the vocabulary "
                f"({self.teacher.vocab_size}): device-side assert, index out of bounds"
            )
        return scoring.forward(self.teacher, p)

    @property
    def context_len(self) -> int:
        """The model's ``max_position_embeddings``, as SGLang derives its context length."""
        config = getattr(self.teacher.model, "config", None)
        return int(getattr(config, "max_position_embeddings", None) or 4096)

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

    def release(self, body: Any) -> None:
        """Asserts ``caps.release_check`` of the scheduler (a failed assert kills); a second
        release of a released tag kills (torch_memory_saver ``exit(1)``)."""
        self.check_alive()
        tags = self._tags(body)
        check = self.caps.release_check
        with self.scheduler.loop:
            self.check_alive()
            why = self.scheduler.refusal(check)
            if why:
                raise self.fatal(
                    f"release_memory_occupation with {why} (SGLang asserts {check.value})"
                )
            again = sorted(set(tags) & self.teacher.sleep_state.released)
            if again:
                raise self.fatal(f"second release of {again} (torch_memory_saver exit(1)s)")
            self.teacher.release(tags)

    def resume(self, body: Any) -> None:
        """A resume of a tag that is not released kills (``KeyError`` in the scheduler)."""
        self.check_alive()
        tags = self._tags(body)  # untagged: every default tag, each of which must be released
        with self.scheduler.loop:
            self.check_alive()
            missing = [t for t in tags if t not in self.teacher.sleep_state.released]
            if missing:
                raise self.fatal(f"KeyError: {missing[0]!r} (resume of a tag that is not released)")
            self.teacher.resume(tags)

    # -- pause -------------------------------------------------------------------------------

    def pause_generation(self, body: Any) -> None:
        """``/pause_generation`` (no route while ``caps.pause`` is NONE, ≤0.4.8).

        ABORT_ALL (0.4.9–0.5.5) reads no body, holds new requests, aborts what is in flight and
        answers at once, before the running requests' last forward. MODES (0.5.6+): ``abort``
        answers once nothing is in flight and leaves the engine unpaused; ``in_place`` freezes
        the running requests; ``retract`` puts them back in the waiting queue, applied before
        any later release or flush.
        """
        self.check_alive()
        mode = self._pause_mode(body)
        self.scheduler.pause(mode)
        if mode is PauseMode.ABORT and self.caps.pause is Pause.MODES:
            self.scheduler.wait_idle(None)

    def _pause_mode(self, body: Any) -> PauseMode:
        if self.caps.pause is not Pause.MODES:
            return PauseMode.ABORT
        if not isinstance(body, dict):
            raise BodyInvalid("body: Input should be a valid dictionary")
        raw = body.get("mode", PauseMode.ABORT.value)
        try:
            return PauseMode(raw)
        except ValueError as e:
            raise BodyInvalid(
                f"mode: Input should be 'abort', 'retract' or 'in_place', got {raw!r}"
            ) from e

    def continue_generation(self, body: Any) -> None:
        """Held, frozen and retracted requests go on; a no-op when nothing is paused."""
        self.check_alive()
        self.scheduler.resume_generation()

    # -- flush -------------------------------------------------------------------------------

    def flush_cache(self, timeout_s: float = 0.0) -> None:
        """``/flush_cache``: refused (:class:`Busy`) unless ``caps.flush_check`` passes. Where
        ``caps.flush_timeout`` (0.5.10+), ``timeout_s`` > 0 waits for fully idle, waiting
        counted even while paused (0.5.23 ``scheduler.py:1340-1343``)."""
        self.check_alive()
        with self.scheduler.loop:
            if timeout_s > 0 and self.caps.flush_timeout:
                if not self.scheduler.wait_idle(timeout_s):
                    raise Busy(FLUSH_TIMED_OUT)
            elif self.scheduler.refusal(self.caps.flush_check):
                raise Busy(FLUSH_FAILED if self.caps.flush_timeout else FLUSHED)
            self.teacher.flush_cache()

    # -- weights -----------------------------------------------------------------------------

    def update_weights_from_disk(self, body: Any) -> tuple[int, dict[str, Any]]:
        """In place, from ``model_path``. Unpaused it first waits until nothing runs or waits
        (the writer lock; new requests are held behind it); paused on 0.5.6+ it loads at once.
        Then its own flush, where asked (always before 0.5.6): refused, it kills
        (``assert flush_cache_success``) until 0.5.22, which answers 400, the weights in."""
        self.check_alive()
        path = body.get("model_path") if isinstance(body, dict) else None
        if not path:
            return 400, _reload_answer(False, "model_path is required")
        fields = self.caps.reload_fields
        flush = "flush_cache" not in fields or bool(body.get("flush_cache", True))
        with self.scheduler.loop:
            at_once = self.caps.pause is Pause.MODES and self.scheduler.hold
            with contextlib.nullcontext() if at_once else self.scheduler.writer():
                self._forward_guard("update_weights_from_disk", ("weights",))
                try:
                    self.teacher.reload_weights(str(path))
                except TeacherError as e:
                    return 400, _reload_answer(False, f"Failed to update weights: {e}")
                self.teacher.model_path = str(path)
                if flush and self.scheduler.refusal(self.caps.flush_check):
                    if self.caps.reload_flush_refused is Outcome.KILLS:
                        raise self.fatal(
                            "Cache flush failed after updating weights (assert flush_cache_success)"
                        )
                    return 400, _reload_answer(False, RELOAD_FLUSH_REFUSED)
                if flush:
                    self.teacher.flush_cache()
        message = "Succeeded to update model weights."
        version = body.get("weight_version")
        if "weight_version" in fields and version is not None:
            self.weight_version = str(version)
            message += f" Weight version updated to {version}."
        return 200, _reload_answer(True, message)

    def weights_checker(self, body: Any) -> tuple[int, dict[str, Any]]:
        """``/weights_checker`` (0.5.6+). ``action`` is required until 0.5.13, which defaults it
        to ``checksum``. The checksum reads the weights, no forward pass: over released weights
        it kills. Only ``checksum`` is emulated (not ``snapshot``, ``compare``,
        ``reset_tensors``); anything else is SGLang's 400 ``Unsupported action=...``."""
        self.check_alive()
        action = self._checker_action(body)
        if action != "checksum" or not self.caps.checksum:
            return 400, {"success": False, "message": f"Unsupported action={action!r}"}
        with self.scheduler.loop:
            self.check_alive()
            self._forward_guard("a /weights_checker checksum", ("weights",))
            return 200, checksum_answer(self.teacher.model, self.caps.checksum_shape)

    def _checker_action(self, body: Any) -> Any:
        optional = self.caps.checksum_shape is Checksum.PER_ENGINE_STRING  # 0.5.13+
        if body is None and optional:
            return "checksum"
        if not isinstance(body, dict):
            raise BodyInvalid("body: Field required")
        if "action" not in body and not optional:
            raise BodyInvalid("action: Field required")
        action = body.get("action", "checksum")
        if not isinstance(action, str):
            raise BodyInvalid(f"action: Input should be a valid string, got {action!r}")
        return action

    # -- health and info ---------------------------------------------------------------------

    def health(self) -> None:
        """``/health``, ``/health_generate``: awake, 200 without looking at the output (zeroed
        weights pass). Released, per ``caps.health_while_released``: KILLS_FORWARD runs the
        1-token request over released memory; SKIPPED_503 (0.5.1–0.5.9) skips it and SGLang
        answers 503 after its 20 s timeout, here at once.

        While paused, its 1-token request is held like any generation (the version table's
        ``held_while_paused`` row; ``docs/sglang-contract.md`` §7.6): the forward runs once
        ``/continue_generation`` comes within :attr:`health_timeout_s`, over whatever memory
        the server has then; otherwise 503 and the request is dropped, never run."""
        self.check_alive()
        with self.scheduler.loop:
            if self.scheduler.hold:  # only ever set where a pause exists (0.4.9+)
                let_go = self.scheduler.loop.wait_for(
                    lambda: not self.scheduler.hold or self.scheduler.dead is not None,
                    timeout=self.health_timeout_s,
                )
                self.check_alive()
                if not let_go:
                    raise Unhealthy(
                        "the health check's generation was held by the pause for "
                        f"{self.health_timeout_s:g} s (SGLANG_HEALTH_CHECK_TIMEOUT)"
                    )
            released = self.teacher.sleep_state.released
            if released and self.caps.health_while_released is Outcome.SKIPPED_503:
                raise Unhealthy("the health check's generation was skipped: memory is released")
            self._forward_guard("a health check's generation", released)

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


def _reload_answer(success: bool, message: str) -> dict[str, Any]:
    return {"success": success, "message": message, "num_paused_requests": 0}
