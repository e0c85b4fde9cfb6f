"""The colocated teacher: put to sleep after each step, woken before the next, checked at each wake.

This is the one implementation of the teacher's side of a colocated step. The guard drives it
(:meth:`DistillGuard.sleep <distill_guard.guard.DistillGuard.sleep>` and
:meth:`~distill_guard.guard.DistillGuard.wake`); examples and integrations call the guard, never
the teacher's release and resume themselves::

    sleep: fingerprint (canary, checksum) ─► drain (per version) ─► release
    wake:  resume ─► checksum (traffic still held) ─► continue ─► canary
           └► [repair: reload ─► checksum ─► continue ─► flush ─► canary]

A teacher is never sent a call that can kill it: no forward or checksum while it may be
released, no resume unless it is known released, no release unless that version's release will
find it idle (``docs/teachers.md`` §7).

Where the host framework sleeps and wakes the teacher itself (Relax's teacher manager), it passes
its own ``release`` / ``resume`` call; the teacher's tracked sleep state follows it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from distill_guard.findings import Finding, Severity
from distill_guard.live import colocated_findings
from distill_guard.live.canary import Canary, teacher_error_finding
from distill_guard.live.incidents import IncidentTracker
from distill_guard.live.preflight import keeps_weights
from distill_guard.live.repair import EventSink, Reloader, RepairOutcome, repair_teacher
from distill_guard.policy import Action, Decision
from distill_guard.teachers.base import (
    ReleaseUnsafe,
    Teacher,
    TeacherError,
    TeacherStateError,
    TeacherUnreachable,
    unknown_state,
)

log = logging.getLogger("distill_guard")

CHECKSUM = "weights checksum"
"""The optional check :meth:`ColocatedTeacher._unavailable` names when ``/weights_checker``
cannot be read."""


def _episode(check: str) -> str:
    """The ``_said`` key of ``check`` being unavailable (one finding per episode)."""
    return f"unavailable:{check}"


def _named(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


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
        self.held = bool(getattr(teacher, "paused", False))
        """The guard's pause holds the teacher's traffic (from its drain until the wake has
        verified it): requests sent meanwhile wait, and run once it is released. A client
        whose pause still holds (a guard restored onto it after a restart) starts held, so
        its first wake lets the traffic go."""
        self._checksum: str | None = None
        self._slept_checksum: str | None = None
        self._keeps_weights: bool | None = None
        self._said: set[str] = set()
        self.seconds: dict[str, float] = {}
        """Wall time of the last ``release`` and ``resume`` calls (the host's, where it made them)."""

    @property
    def asleep(self) -> bool:
        return bool(getattr(self.teacher, "asleep", False))

    @property
    def repairs(self) -> int:
        """Successful repairs over the run."""
        return self.incidents.total_repairs

    def sleep(
        self, step: int, release: Callable[[], Any] | None = None, *, fingerprint: bool = True
    ) -> list[Finding]:
        """Fingerprint the teacher, then release it (or run the host's ``release``).

        The guard's own release is made only where the teacher's version lets it be safe
        (:meth:`~distill_guard.teachers.TrackedTeacher.drain`); otherwise the teacher stays
        awake and the first time is said (``teacher.release_skipped``). ``fingerprint=False``
        takes none (a quarantined replica: its wake is judged against the checkpoint's
        reference alone, and a canary on a teacher the guard's pause still holds would wait)."""
        if fingerprint:
            findings = self.fingerprint(step)
        else:
            findings = []
            self.canary.forget()
            self._checksum = None
        if release is not None:
            try:
                self._timed("release", release)
            except Exception as e:  # noqa: BLE001 - the host's call: the state is now unknown
                return [*findings, self._unknown(step, f"the host's release raised {_named(e)}")]
            self.teacher.mark_released(self.tags)
            return findings
        unknown = unknown_state(self.teacher)
        if unknown:
            return [*findings, self._unknown(step, str(unknown))]
        try:
            held = bool(self.teacher.drain())
        except ReleaseUnsafe as e:
            return [*findings, *self._once(step, "release_skipped", str(e))]
        except TeacherError as e:
            findings.append(
                teacher_error_finding(
                    e, step, during="drain before release (not released)", severity=Severity.WARN
                )
            )
            return findings
        self.held = held
        try:
            self._timed("release", lambda: self.teacher.release(self.tags))
        except TeacherError as e:
            if unknown_state(self.teacher):  # no answer: left held, not resumed
                return [*findings, self._unknown(step, str(e))]
            # an error answer: not released, it stays awake and serving; memory is not freed
            findings.append(
                teacher_error_finding(e, step, during="release", severity=Severity.WARN)
            )
            self._release_hold(findings, step)
            return findings
        return findings

    def fingerprint(self, step: int) -> list[Finding]:
        """Take the reference the next wake is held against (canary, and the weights checksum
        where the server has one). Where the host sleeps the teacher itself, call it at a point
        where the teacher is awake and nothing else releases it meanwhile."""
        findings: list[Finding] = []
        try:
            self.canary.fingerprint(self.teacher, step=step)
        except TeacherError as e:
            # a stale reference would judge the next wake against weights the teacher no longer
            # has (an EMA teacher moves every step): without one, the wake checks only for
            # uniform and non-finite values (and against the checkpoint's reference, if any)
            self.canary.forget()
            findings.append(
                teacher_error_finding(
                    e, step, during="fingerprint before sleep", severity=Severity.WARN
                )
            )
            if isinstance(e, TeacherUnreachable):  # no answer: the checksum would wait as long
                self._checksum = None
                return findings
        # each check on its own: a checksum that cannot be read leaves the canary its reference,
        # and a canary that could not score leaves the wake the checksum
        try:
            self._checksum = self._weights_checksum()
        except TeacherError as e:
            self._checksum = None
            still = (
                "the canary still judges the wake"
                if self.canary.last_fingerprint is not None
                else "the wake is judged by the server's arguments and the canary's absolute tests"
            )
            findings += self._unavailable(step, CHECKSUM, e, still)
        else:
            self._said.discard(_episode(CHECKSUM))
        return findings

    def wake(self, step: int, resume: Callable[[], Any] | None = None) -> list[Finding]:
        """Resume the teacher (or run the host's ``resume``), verify it, then let its traffic
        run, then the canary.

        The guard resumes only a teacher released through the teacher itself; one the host
        released with its own handle is woken by the host (``resume``), and where nobody says,
        the state is unknown and nothing is sent (``teacher.state_unknown``: a resume of an
        awake teacher and a forward on a released one both kill SGLang). While the guard's pause holds the traffic, the weights checksum
        (where the version has one) is checked first: a teacher that fails it stays held for
        the repair, so no request runs on weights nobody verified."""
        teacher = self.teacher
        if resume is not None:
            try:
                self._timed("resume", resume)
            except Exception as e:  # noqa: BLE001 - the host's call: the state is now unknown
                return [self._unknown(step, f"the host's resume raised {_named(e)}")]
            teacher.mark_resumed(self.tags)
        elif unknown_state(teacher):
            return [self._unknown(step, str(unknown_state(teacher)))]
        elif self.asleep and getattr(teacher, "released_by_host", False):
            return [
                self._unknown(
                    step,
                    "the host released it (sleep(release=...)) and this wake passed no resume=, "
                    "so whether the host has woken it is not known. Pass the host's own onload "
                    "as wake(step, resume=...), or call teacher.mark_resumed() after it",
                )
            ]
        elif self.asleep:
            try:
                self._timed("resume", lambda: teacher.resume(self.tags))
            except TeacherError as e:
                if unknown_state(teacher):
                    return [self._unknown(step, str(e))]
                return [teacher_error_finding(e, step, during="resume")]
        findings: list[Finding] = []
        if self.held:
            checked, matched = self._checked_checksum(step)
            if not matched and not any(f.severity is Severity.CRITICAL for f in checked):
                checked += self._weights_kept(step)  # no exact answer: its configuration's
            if any(f.severity is Severity.CRITICAL for f in checked):
                return checked  # held: the repair (or the halt) decides what runs next
            findings += checked
            if not self._release_hold(findings, step):
                return findings
        else:
            findings += self._checked_checksum(step)[0]
        try:
            findings = self.canary.verify(teacher, step=step) + findings
        except TeacherError as e:
            findings.append(
                teacher_error_finding(e, step, during="canary after wake", severity=Severity.WARN)
            )
        if not findings:
            self.incidents.on_clean_wake(step)
        return findings

    def settle(self, decision: Decision) -> None:
        """After the wake's decision: a teacher still held (its checksum failed and no repair
        released it) is let go when the run goes on, its traffic is the host's again; at a halt
        it stays paused, and the log says how to let it go."""
        if not self.held:
            return
        if decision.action is Action.HALT:
            log.error(
                "distill_guard: the teacher is left paused (/pause_generation): the requests it "
                "holds would run on weights that failed their check. Repair or restart it, then "
                "POST /continue_generation."
            )
            return
        self._release_hold([], decision.step)

    def _release_hold(self, findings: list[Finding], step: int | None) -> bool:
        """Let go of the guard's pause (:meth:`_let_go`); a failure is a finding (or, onto a
        teacher that may be released, an error in the log), and the teacher stays held."""
        try:
            self._let_go()
        except TeacherStateError as e:
            log.error("distill_guard: the teacher's traffic stays held: %s", e)
            return False
        except TeacherError as e:
            findings.append(
                teacher_error_finding(e, step, during="continue generation", severity=Severity.WARN)
            )
            return False
        return True

    def _let_go(self) -> None:
        """``/continue_generation`` after the guard's pause, only onto an awake teacher: a
        request on released memory kills it. The repair calls it once the weights passed their
        checksum, before the canary (which the pause would hold too)."""
        if not self.held:
            return
        if self.asleep or unknown_state(self.teacher):
            raise TeacherStateError(
                "refusing /continue_generation: the teacher is released, or may be, and its "
                "held requests would run on released memory. Resume it, then POST "
                "/continue_generation."
            )
        self.teacher.undrain()
        self.held = False

    def _unknown(self, step: int | None, why: str) -> Finding:
        mark = getattr(self.teacher, "mark_unknown", None)
        if callable(mark):
            mark(why)
        return colocated_findings.state_unknown(step, why)

    def _weights_kept(self, step: int) -> list[Finding]:
        """Before the held traffic runs, where no checksum answered: a teacher whose server
        keeps no weights across a release (memory saver on, no CPU backup) woke without them,
        which its configuration says for certain; it stays held for the repair."""
        if self._released_tags_keep_weights():
            return []
        return [colocated_findings.weights_not_kept(step)]

    def _released_tags_keep_weights(self) -> bool:
        """The last release kept the weights: it did not name them, or the server keeps them."""
        if self.tags is not None and "weights" not in self.tags:
            return True
        if self._keeps_weights is None:
            try:
                self._keeps_weights = keeps_weights(self.teacher.server_info())
            except TeacherError:
                return True  # unknown: the canary, after the traffic, is the judge
        return self._keeps_weights

    def _unavailable(self, step: int, check: str, error: Exception, still: str) -> list[Finding]:
        """``teacher.check_unavailable`` once per episode of ``check`` failing (a later success
        ends the episode); the repeats are logged at INFO."""
        kind = _episode(check)
        if kind in self._said:
            log.info("distill_guard: step %s: the %s is still unavailable (%s)", step, check, error)
            return []
        self._said.add(kind)
        return [colocated_findings.check_unavailable(step, check, error, still)]

    def _once(self, step: int, kind: str, message: str) -> list[Finding]:
        """A finding the run needs to hear once (a version on which the guard never releases);
        later occurrences are logged at INFO."""
        if kind in self._said:
            log.info("distill_guard: step %s: %s", step, message)
            return []
        self._said.add(kind)
        return [colocated_findings.release_skipped(step, kind, message)]

    def _checked_checksum(self, step: int) -> tuple[list[Finding], bool]:
        """The checksum across the sleep, where the teacher has one, and whether it matched.
        Beside the canary: it is exact for the parameters but skips RoPE-style buffers, which
        the canary sees; either one failing is a changed teacher. One that cannot be read is a
        finding of its own and leaves the canary to judge."""
        before, self._checksum = self._checksum, None
        self._slept_checksum = before  # the repair's reference until the next sleep
        try:
            compared = self._compare_checksum(step, before)
        except TeacherError as e:
            still = "the server's arguments and the canary still judge the wake"
            return self._unavailable(step, CHECKSUM, e, still), False
        if before is not None:  # read on both sides: the episode, if any, is over
            self._said.discard(_episode(CHECKSUM))
        return compared

    def _weights_checksum(self) -> str | None:
        """SGLang's exact, forward-free ``/weights_checker`` checksum, where there is one."""
        checksum = getattr(self.teacher, "checksum", None)
        return checksum() if callable(checksum) else None

    def _compare_checksum(self, step: int | None, before: str | None) -> tuple[list[Finding], bool]:
        """The checksum now against ``before``: a finding if it changed, and whether the two
        were compared and agreed (not where either is missing)."""
        after = self._weights_checksum() if before is not None else None
        if after is None or after == before:
            return [], after is not None
        return [colocated_findings.checksum_changed(step, before, after)], False

    def _repair_checksum(self, step: int | None) -> list[Finding]:
        """The repair's exact check, while the traffic is still held: the reloaded weights
        against the checksum they had before the sleep (where there is one)."""
        return self._compare_checksum(step, self._slept_checksum)[0]

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
            checksum=self._repair_checksum,
            release_hold=self._let_go if self.held else None,
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
