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

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

from distill_guard.findings import Code, Finding, Severity
from distill_guard.live.canary import Canary, teacher_error_finding
from distill_guard.live.incidents import IncidentTracker
from distill_guard.live.repair import EventSink, Reloader, RepairOutcome, repair_teacher
from distill_guard.policy import Action, Decision
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
        self._drained = False
        self._checksum: str | None = None
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
        findings = self.fingerprint(step)
        if release is not None:
            self._timed("release", release)  # the host's own call: its errors are its own
            self.teacher.mark_released(self.tags)
            return findings
        try:  # SGLang's release asserts an idle server: drain first, or do not release
            self.teacher.drain()
        except TeacherError as e:
            findings.append(
                teacher_error_finding(
                    e, step, during="drain before release (not released)", severity=Severity.WARN
                )
            )
            return findings
        self._drained = True
        try:
            self._timed("release", lambda: self.teacher.release(self.tags))
        except TeacherError as e:  # it stays awake: nothing it scores is wrong, memory is not freed
            findings.append(
                teacher_error_finding(e, step, during="release", severity=Severity.WARN)
            )
            self._undrain(findings, step)
        return findings

    def _undrain(self, findings: list[Finding], step: int) -> None:
        if not self._drained:
            return
        try:
            self.teacher.undrain()
            self._drained = False
        except TeacherError as e:
            findings.append(
                teacher_error_finding(e, step, during="continue generation", severity=Severity.WARN)
            )

    def fingerprint(self, step: int) -> list[Finding]:
        """Take the reference the next wake is held against (canary, and the weights checksum
        where the server has one). Where the host sleeps the teacher itself, call it at a point
        where the teacher is awake and nothing else releases it meanwhile."""
        try:
            self.canary.fingerprint(self.teacher, step=step)
            self._checksum = self._weights_checksum()
        except TeacherError as e:
            # a stale reference would judge the next wake against weights the teacher no longer
            # has (an EMA teacher moves every step): without one, the wake checks only for
            # uniform and non-finite values
            self.canary.forget()
            self._checksum = None
            return [
                teacher_error_finding(
                    e, step, during="fingerprint before sleep", severity=Severity.WARN
                )
            ]
        return []

    def wake(self, step: int, resume: Callable[[], Any] | None = None) -> list[Finding]:
        """Resume the teacher (or run the host's ``resume``), then verify it with the canary.

        The guard resumes only a teacher it knows is asleep, and asks a server first (a release
        that failed left it awake, someone else may have woken it, and resuming a tag that is
        not released kills an SGLang server)."""
        try:
            if resume is not None:
                self._timed("resume", resume)
                self.teacher.mark_resumed(self.tags)
            elif self.asleep and (self._drained or self.teacher.confirm_asleep()):
                # drained by the guard: it holds the teacher, no one else woke it
                self._timed("resume", lambda: self.teacher.resume(self.tags))
        except TeacherError as e:
            return [teacher_error_finding(e, step, during="resume")]
        undrained: list[Finding] = []
        self._undrain(undrained, step)
        if undrained:
            return undrained
        try:
            findings = self.canary.verify(self.teacher, step=step)
            findings += self._verify_checksum(step)
        except TeacherError as e:
            return [
                teacher_error_finding(e, step, during="canary after wake", severity=Severity.WARN)
            ]
        if not findings:
            self.incidents.on_clean_wake(step)
        return findings

    def _weights_checksum(self) -> str | None:
        """SGLang 0.5.23's exact, forward-free ``/weights_checker`` checksum, where there is one."""
        checksum = getattr(self.teacher, "checksum", None)
        return checksum() if callable(checksum) else None

    def _verify_checksum(self, step: int) -> list[Finding]:
        """Beside the canary: the checksum is exact for the parameters but skips RoPE-style
        buffers, which the canary sees; either one failing is a changed teacher."""
        before, self._checksum = self._checksum, None
        if before is None:
            return []
        after = self._weights_checksum()
        if after is None or after == before:
            return []
        return [
            Finding(
                Code.TEACHER_FINGERPRINT_MISMATCH,
                Severity.CRITICAL,
                "The teacher's weights checksum (/weights_checker) changed across sleep and wake: "
                f"{before[:16]}… before, {after[:16]}… after (bound: bit-exact). Its weights are "
                "not the ones it slept with. Rewake it (reload, verify) and relaunch it with "
                "--enable-weights-cpu-backup.",
                step,
                {"checksum_before": before, "checksum_after": after, "source": "weights_checker"},
            )
        ]

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

    def rewake(
        self, decision: Decision, on_event: EventSink | None = None
    ) -> tuple[Decision, list[Finding]]:
        """Carry out a ``rewake`` decision: the decision as carried out (``repaired`` when the
        reload verified, a halt when it did not) and the repair's findings. An asleep teacher
        is left to the canary at its next wake: the trainer holds its memory now."""
        if self.asleep:
            message = f"{decision.message}; teacher asleep, the canary at its next wake will "
            return dataclasses.replace(decision, message=message + "repair it if needed"), []
        outcome, notice = self.repair(decision.step, list(decision.reasons), on_event)
        if not outcome.ok:
            halt = Decision(
                decision.step,
                Action.HALT,
                (*outcome.findings[:1], *decision.reasons),
                message=f"halt: teacher repair failed after {outcome.attempts} attempt(s) "
                f"({decision.message})",
            )
            return halt, outcome.findings
        repaired = dataclasses.replace(
            decision,
            reasons=(*decision.reasons, notice) if notice is not None else decision.reasons,
            message=f"{decision.message}; teacher repaired in {outcome.attempts} attempt(s), "
            f"{outcome.seconds:.2f} s (repair {self.repairs} of this run)",
            repaired=True,
            notify=notice is not None,
        )
        return repaired, outcome.findings

    def state_dict(self) -> dict[str, Any]:
        return {"canary": self.canary.state_dict(), "incidents": self.incidents.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "canary" in state:
            self.canary.load_state_dict(state["canary"])
        if "incidents" in state:
            self.incidents.load_state_dict(state["incidents"])
