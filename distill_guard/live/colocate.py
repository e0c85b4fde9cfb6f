"""The colocated teacher: put to sleep after each step, woken before the next, checked at each wake.

This is the one implementation of the teacher's side of a colocated step. The guard drives it
(:meth:`DistillGuard.sleep <distill_guard.guard.DistillGuard.sleep>` and
:meth:`~distill_guard.guard.DistillGuard.wake`); examples and integrations call the guard, never
the teacher's release and resume themselves::

    wake:  resume ─► canary (vs. the fingerprint) ─► [repair: reload, flush, canary]
    sleep: fingerprint ─► release

Where the host framework sleeps and wakes the teacher itself (Relax's teacher manager), it passes
its own ``release`` / ``resume`` call; the teacher's tracked sleep state follows it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from distill_guard.findings import Finding, Severity
from distill_guard.live.canary import Canary, teacher_error_finding
from distill_guard.live.incidents import IncidentTracker
from distill_guard.live.repair import EventSink, Reloader, RepairOutcome, repair_teacher
from distill_guard.teachers.base import Teacher, TeacherError


class ColocatedTeacher:
    """A live teacher with its canary, its repair and its incident record.

    Args:
        teacher: the teacher (``distill_guard.teachers``).
        canary: the canary; a default :class:`Canary` if None.
        reloader: replaces the default reload (``reload_weights()``, the server's own
            ``model_path``), for EMA or tensor-pushed teachers.
        repair_attempts, repair_backoff_s: bounds of one repair.
        tags: the memory tags to release and resume (None: all of them).
    """

    def __init__(
        self,
        teacher: Teacher,
        canary: Canary | None = None,
        *,
        reloader: Reloader | None = None,
        repair_attempts: int = 3,
        repair_backoff_s: float = 1.0,
        tags: Sequence[str] | None = None,
    ) -> None:
        self.teacher = teacher
        self.tags = tags
        self.canary = canary if canary is not None else Canary()
        self.reloader = reloader
        self.repair_attempts = repair_attempts
        self.repair_backoff_s = repair_backoff_s
        self.incidents = IncidentTracker()
        self.seconds: dict[str, float] = {}
        """Wall time of the last ``release`` and ``resume`` calls (the host's, where it made them)."""

    @property
    def asleep(self) -> bool:
        return bool(getattr(self.teacher, "asleep", False))

    @property
    def repairs(self) -> int:
        """Successful repairs over the run."""
        return self.incidents.total_repairs

    def sleep(self, step: int, release: Callable[[], Any] | None = None) -> list[Finding]:
        """Fingerprint the teacher, then release it (or run the host's ``release``)."""
        findings: list[Finding] = []
        try:
            self.canary.fingerprint(self.teacher, step=step)
        except TeacherError as e:
            findings.append(
                teacher_error_finding(
                    e, step, during="fingerprint before sleep", severity=Severity.WARN
                )
            )
        try:
            if release is not None:
                self._timed("release", release)  # the host's own call: its errors are its own
                self.teacher.mark_released(self.tags)
            else:
                self._timed("release", lambda: self.teacher.release(self.tags))
        except TeacherError as e:  # it stays awake: nothing it scores is wrong, memory is not freed
            findings.append(
                teacher_error_finding(e, step, during="release", severity=Severity.WARN)
            )
        return findings

    def wake(self, step: int, resume: Callable[[], Any] | None = None) -> list[Finding]:
        """Resume the teacher (or run the host's ``resume``), then verify it with the canary.

        The guard resumes only a teacher it knows is asleep (a release that failed left it
        awake, and resuming an unreleased tag kills an SGLang server)."""
        try:
            if resume is not None:
                self._timed("resume", resume)
                self.teacher.mark_resumed(self.tags)
            elif self.asleep:
                self._timed("resume", lambda: self.teacher.resume(self.tags))
        except TeacherError as e:
            return [teacher_error_finding(e, step, during="resume")]
        try:
            findings = self.canary.verify(self.teacher, step=step)
        except TeacherError as e:
            return [
                teacher_error_finding(e, step, during="canary after wake", severity=Severity.WARN)
            ]
        if not findings:
            self.incidents.on_clean_wake(step)
        return findings

    def _timed(self, what: str, call: Callable[[], Any]) -> None:
        t0 = time.perf_counter()
        try:
            call()
        finally:
            self.seconds[what] = time.perf_counter() - t0

    def repair(
        self, step: int | None, cause: list[Finding], on_event: EventSink | None = None
    ) -> tuple[RepairOutcome, Finding | None]:
        """Reload and verify; the outcome, and the incident's alert finding (None for a repeat)."""
        outcome = repair_teacher(
            self.teacher,
            self.canary,
            reloader=self.reloader,
            max_attempts=self.repair_attempts,
            backoff_s=self.repair_backoff_s,
            step=step,
            on_event=on_event,
        )
        return outcome, self.incidents.on_repair(outcome, step=step, cause=cause)

    def state_dict(self) -> dict[str, Any]:
        return {"canary": self.canary.state_dict(), "incidents": self.incidents.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "canary" in state:
            self.canary.load_state_dict(state["canary"])
        if "incidents" in state:
            self.incidents.load_state_dict(state["incidents"])
