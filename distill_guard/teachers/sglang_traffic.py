"""The admin calls whose safe form depends on the SGLang version: holding and letting go of the
server's traffic around a release, the idle checks, the cache flush, and the weights checksum.

:class:`SGLangTraffic` is a part of
:class:`~distill_guard.teachers.sglang_http.SGLangHTTPTeacher`, which provides what it reads: the
version's :class:`~distill_guard.teachers.capabilities.Capabilities`, the request function, the
timeouts and whether its pause holds the traffic.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Any

import httpx

from distill_guard.teachers.base import (
    ReleaseUnsafe,
    TeacherError,
    TeacherHTTPError,
    TrackedTeacher,
)
from distill_guard.teachers.capabilities import Capabilities, SleepPlan, plan_sleep
from distill_guard.teachers.sglang_transport import answer_json
from distill_guard.teachers.sglang_versions import Pause


def checksum_of(body: Any) -> str | None:
    """The weights' checksum from a ``/weights_checker`` answer: ``per_engine_checksum`` as it is
    (a string from 0.5.13), else (0.5.12) the per-tensor hashes of every rank
    (``ranks[].checksums``) hashed in rank and name order."""
    if not isinstance(body, dict):
        return None
    total = body.get("per_engine_checksum")
    if isinstance(total, str) and total:
        return total
    ranks = body.get("ranks")
    if not isinstance(ranks, list) or not ranks:
        return None
    digest = hashlib.sha256()
    for i, rank in enumerate(ranks):
        sums = rank.get("checksums") if isinstance(rank, dict) else None
        if not isinstance(sums, dict) or not sums:
            return None
        for name in sorted(sums):
            digest.update(f"{i}:{name}={sums[name]};".encode())
    return digest.hexdigest()


class SGLangTraffic(TrackedTeacher):
    """Drain, undrain, flush and checksum of an SGLang server, per version."""

    # provided by the client (SGLangHTTPTeacher)
    capabilities: Capabilities
    timeout_s: float
    drain_timeout_s: float
    _paused: bool
    """The guard's ``/pause_generation`` holds the server's traffic (until :meth:`undrain`)."""
    _request: Callable[..., httpx.Response]

    @property
    def paused(self) -> bool:
        """This client's ``/pause_generation`` holds the server's traffic (until :meth:`undrain`):
        a guard attached to the client meanwhile (restored after a restart) must let it go."""
        return self._paused

    def drain(self) -> bool:
        """Hold new requests and make sure the release's idle check will pass, per version
        (``docs/sglang-contract.md`` §7.2), or raise :class:`ReleaseUnsafe` with the server left
        serving. A release with a request running kills SGLang (its assert, or the request's
        forward over released memory), and a pause that is safe on one version kills on another:

        - no ``/pause_generation`` (≤ 0.4.8): never released.
        - a ``retract`` pause, after which the release does not count what it put back in the
          waiting queue (0.5.6–0.5.9, 0.5.21+): released at once.
        - 0.4.9–0.5.5: the pause aborts what is in flight (as that version always does) and
          answers before its running requests' last forward, so the release waits until the
          scheduler is idle, seen twice in a row.
        - 0.5.10–0.5.20: the release counts the requests a ``retract`` pause puts back in the
          waiting queue, so the guard first lets the server go quiet (``/flush_cache?timeout=``),
          then pauses, and releases only if nothing runs or waits; else it lets the traffic run
          on and does not release this time.
        """
        caps = self.capabilities
        plan = plan_sleep(caps)
        if plan is SleepPlan.NEVER:
            raise ReleaseUnsafe(
                f"{caps.note} has no /pause_generation the guard can make safe, so nothing can "
                "hold its traffic while it is released, and a request that runs on released "
                "memory kills it: the guard does not release it (it stays awake; its memory is "
                "not freed). Upgrade SGLang to 0.4.9 or later, or let the framework release it "
                "between its own steps."
            )
        if plan is SleepPlan.ONLY_IF_IDLE and caps.flush_timeout:
            self._idle(wait_s=self.drain_timeout_s)  # let in-flight requests finish first
        body = {"mode": "retract"} if caps.pause is Pause.MODES else {}
        self._request("POST", "/pause_generation", json=body, admin=True)
        self._paused = True
        if plan is SleepPlan.AT_ONCE:
            return True
        try:
            idle = (
                self._idle_twice(time.monotonic() + self.drain_timeout_s)
                if plan is SleepPlan.AFTER_ABORT
                else self._idle(wait_s=0.0)
            )
        except TeacherError:  # the idle test failed: never leave its traffic held
            self.undrain()
            raise
        if not idle:
            self.undrain()
            raise ReleaseUnsafe(
                f"requests were still running or waiting after /pause_generation, and on "
                f"{caps.note} the release asserts {caps.release_check.value} (a failed assert "
                "kills the server): the guard did not release it this time and let its traffic "
                "run on (nothing lost). It tries again at the next sleep."
            )
        return True

    def _idle_twice(self, deadline: float) -> bool:
        """Idle at two checks 0.1 s apart before ``deadline``: the aborted requests' last forward
        is done, and none that had passed the pause's gate is still on its way."""
        seen = 0
        while seen < 2:
            seen = seen + 1 if self._idle(wait_s=0.0) else 0
            if seen < 2:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.1)
        return True

    def _idle(self, *, wait_s: float) -> bool:
        """Whether nothing runs or waits: ``/flush_cache`` is refused (400) unless the server is
        idle, and dropping the caches is all it does (``docs/sglang-contract.md`` §7.2).
        ``wait_s`` > 0 waits for idle where the version takes ``?timeout=``."""
        try:
            self._flush(wait_s)
        except TeacherHTTPError as e:
            if e.status == 400:
                return False
            raise
        return True

    def _flush(self, wait_s: float) -> None:
        """One ``/flush_cache``, waiting up to ``wait_s`` for idle where the version takes
        ``?timeout=`` (0.5.10+; before, the parameter is ignored, so it is not sent)."""
        path = (
            f"/flush_cache?timeout={wait_s:g}"
            if self.capabilities.flush_timeout
            else "/flush_cache"
        )
        self._request("POST", path, admin=True, timeout_s=wait_s + self.timeout_s)

    def undrain(self) -> None:
        """``/continue_generation``: the requests the pause held run again (a no-op when
        nothing is paused, on every version that has it)."""
        if self.capabilities.pause is Pause.NONE:
            return
        self._request("POST", "/continue_generation", json={}, admin=True)
        self._paused = False

    @property
    def reload_flushes(self) -> bool:
        """The reload flushes the cache itself: the version takes no ``flush_cache`` field
        (before 0.5.6), and its flush is asserted, so a reload that answered did flush."""
        return "flush_cache" not in self.capabilities.reload_fields

    def flush_cache(self, timeout_s: float | None = None) -> None:
        """Drop the prefix cache. While the guard's pause holds the traffic, at once (the
        scheduler then has nothing running, and nothing waiting the flush counts). Otherwise it
        waits up to ``timeout_s`` (default the client's ``timeout_s``) for the running requests:
        ``?timeout=S`` where the version takes it (0.5.10+), else asked again until idle (before,
        a busy server answers 400 at once). Still busy at the end: :class:`TeacherHTTPError`."""
        self.sleep_state.check_awake("flush the cache")
        wait = 0.0 if self._paused else self.timeout_s if timeout_s is None else timeout_s
        if self.capabilities.flush_timeout:
            self._flush(wait)
            return
        deadline = time.monotonic() + wait
        while True:
            try:
                self._flush(0.0)
                return
            except TeacherHTTPError as e:
                if e.status != 400 or time.monotonic() >= deadline:
                    raise
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))

    def checksum(self) -> str | None:
        """``/weights_checker {"action": "checksum"}``: an exact, forward-free hash of the
        weights (SGLang 0.5.12+); None where the version has none. It reads the weights, so it is
        never sent to a teacher that may be released. 0.5.13+ answer ``per_engine_checksum``, a
        string; 0.5.12 only per-tensor hashes, which are combined here in name order."""
        if not self.capabilities.checksum:
            return None
        self.sleep_state.check_awake("read the weights checksum")
        resp = self._request("POST", "/weights_checker", json={"action": "checksum"}, admin=True)
        body = answer_json(resp, "/weights_checker")
        checksum = checksum_of(body)
        if checksum is None:  # the version has one: an answer without it is not "no checksum"
            raise TeacherError(
                f"/weights_checker answered without a checksum on {self.capabilities.note} "
                f"(no per_engine_checksum string, no ranks[].checksums): {str(body)[:200]}"
            )
        return checksum
