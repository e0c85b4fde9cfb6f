"""Policy: turns a step's findings into one decision, with patience and escalation.

Pure bookkeeping, no I/O: the guard executes the decision, the policy only counts. Detection
and action are split so a preset can watch without acting (``monitor_only``).
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from distill_guard.errors import GuardValueError
from distill_guard.findings import Code, Finding, Severity


class Action(str, Enum):
    """What the run should do now. Ordered: continue < alert < skip_batch < rewake < halt."""

    CONTINUE = "continue"
    ALERT = "alert"
    SKIP_BATCH = "skip_batch"
    REWAKE = "rewake"
    HALT = "halt"

    @property
    def rank(self) -> int:
        return list(Action).index(self)


TEACHER_ATTRIBUTED = frozenset(
    {
        Code.TEACHER_UNIFORM,
        Code.TEACHER_NEAR_UNIFORM,
        Code.TEACHER_NONFINITE,
        Code.TEACHER_FINGERPRINT_MISMATCH,
        Code.TEACHER_REFERENCE_MISMATCH,
        Code.TEACHER_WEIGHTS_NOT_KEPT,
        Code.LOSS_JSD_CEILING,
        Code.LOSS_REVERSE_KL_SIGNATURE,
    }
)
"""Critical findings whose cause is the teacher, so reloading the teacher can fix them."""

CONFIRMS_OPEN_INCIDENT = frozenset({Code.STUDENT_FOLLOWS_DEAD_TEACHER})
"""Critical findings that halt at once: a teacher-attributed critical that nothing could act on,
confirmed by the student's own signals moving the way a dead teacher moves them. Nothing can
repair the teacher from where the incident was seen, and every further update trains on it."""

UNUSABLE_TEACHER = frozenset({Code.TEACHER_STATE_UNKNOWN})
"""Critical findings that halt at once: the teacher cannot be called safely (whether it is
released cannot be known), so nothing it scores can be verified and no repair can reach it."""


@dataclass(frozen=True)
class Decision:
    """The policy's verdict for one step (or one stage of it)."""

    step: int | None
    action: Action
    """What to do. Under ``monitor_only`` never more than ``alert``."""
    reasons: tuple[Finding, ...] = ()
    """The findings at warn or above behind the action."""
    intended: Action | None = None
    """What an acting policy would have done, when ``monitor_only`` held it back."""
    message: str = ""
    repaired: bool = False
    """This rank's teacher was reloaded and verified at this hook (a ``rewake`` carried out
    here): scores taken before this hook are stale, the teacher is fine now."""
    notify: bool = True
    """Worth a person's attention now. False for a repeat of an incident already alerted (a
    teacher that loses its weights at every wake is one alert with a repair count)."""

    @property
    def acts(self) -> bool:
        """True when the run must change course (skip, repair or halt)."""
        return self.action.rank >= Action.SKIP_BATCH.rank

    @property
    def priority(self) -> int:
        """The one order of decisions: the action first, then what a monitor-only policy would
        have done, so neither is lost when decisions are combined (:func:`worst`, the ranks'
        agreement in :mod:`distill_guard.consensus`)."""
        intended = self.intended.rank + 1 if self.intended is not None else 0
        return self.action.rank * (len(Action) + 1) + intended

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "action": self.action.value,
            "intended": self.intended.value if self.intended else None,
            "codes": sorted({f.code for f in self.reasons}),
            "message": self.message,
            "repaired": self.repaired,
        }


@dataclass(frozen=True)
class Halt:
    """Why and where the guard stopped the run: the first halt decision, kept for good."""

    step: int | None
    stage: str
    """The hook that halted: ``wake``, ``teacher_scores``, ``step_metrics`` or ``sleep``."""
    message: str
    codes: tuple[str, ...]
    """The finding codes behind the halt, sorted."""

    @classmethod
    def of(cls, decision: Decision, stage: str) -> Halt:
        return cls(
            decision.step,
            stage,
            decision.message,
            tuple(sorted({f.code for f in decision.reasons})),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "stage": self.stage,
            "message": self.message,
            "codes": list(self.codes),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Halt:
        return cls(data.get("step"), data["stage"], data["message"], tuple(data.get("codes", ())))


@dataclass
class Policy:
    """Findings → decision. Fields are the preset knobs.

    A critical finding the teacher can explain asks for ``critical_action`` (a rewake by
    default: reload the teacher, verify it, carry on); other critical findings skip the batch.
    Critical findings on ``halt_after_critical_steps`` consecutive steps halt, whatever the
    first action was: a repair that does not hold is no repair; so does a confirmation of an
    open incident (:data:`CONFIRMS_OPEN_INCIDENT`), at once. Warnings alert, and escalate to
    ``warn_escalation`` only if ``warn_patience`` is set.
    """

    monitor_only: bool = False
    """Record and alert, never act. For trying thresholds on a live run first."""
    critical_action: Action = Action.REWAKE
    """First response to a teacher-attributed critical finding: rewake, skip_batch or halt."""
    halt_after_critical_steps: int = 3
    """Consecutive steps with an unresolved critical finding before halting."""
    warn_patience: int | None = None
    """Consecutive steps with warnings before escalating; None: warnings only alert."""
    warn_escalation: Action = Action.HALT
    """What persistent warnings escalate to."""
    open_incident_steps: int = 50
    """Steps a teacher-attributed critical that nothing could act on stays open, waiting for the
    student's own signals to confirm it (a dead teacher moves them within a few steps: the seed
    run's entropy at once, worst 12 steps in ``benchmarks/detection.py``). Past it the incident
    closes unconfirmed, so a healthy drift hundreds of steps later is never read as one."""

    def __post_init__(self) -> None:
        self.critical_action = _action("critical_action", self.critical_action)
        self.warn_escalation = _action("warn_escalation", self.warn_escalation)
        if self.critical_action not in (Action.REWAKE, Action.SKIP_BATCH, Action.HALT):
            raise GuardValueError(
                f"critical_action must be rewake, skip_batch or halt, got {self.critical_action.value}"
            )
        if self.warn_escalation is Action.CONTINUE:
            raise GuardValueError(
                "warn_escalation must be alert, skip_batch, rewake or halt, got continue "
                "(it would silence warnings once they persist)"
            )
        if self.halt_after_critical_steps < 1:
            raise GuardValueError(
                f"halt_after_critical_steps must be >= 1, got {self.halt_after_critical_steps}"
            )
        if self.open_incident_steps < 1:
            raise GuardValueError(
                f"open_incident_steps must be >= 1, got {self.open_incident_steps}"
            )
        if self.warn_patience is not None and self.warn_patience < 1:
            raise GuardValueError(f"warn_patience must be >= 1 or None, got {self.warn_patience}")
        self._critical = _StepRun()
        self._warn = _StepRun()

    def decide(self, step: int | None, findings: list[Finding]) -> Decision:
        """One stage's findings → decision. Several stages of one step count as one step."""
        critical = [f for f in findings if f.severity is Severity.CRITICAL]
        warns = [f for f in findings if f.severity is Severity.WARN]
        reasons = tuple(critical + warns)
        critical_run = self._critical.observe(step, bool(critical))
        warn_run = self._warn.observe(step, bool(warns))

        if any(f.code in CONFIRMS_OPEN_INCIDENT for f in critical):
            action = Action.HALT
            why = "an open teacher-attributed critical, confirmed by the student's own signals"
        elif any(f.code in UNUSABLE_TEACHER for f in critical):
            action = Action.HALT
            why = "a teacher no call can safely reach"
        elif critical and critical_run >= self.halt_after_critical_steps:
            action = Action.HALT
            why = f"critical findings on {critical_run} consecutive steps"
        elif critical:
            teacher = teacher_attributed(critical)
            action = self.critical_action if teacher else Action.SKIP_BATCH
            why = "teacher-attributed critical finding" if teacher else "critical finding"
        elif warns and self.warn_patience is not None and warn_run >= self.warn_patience:
            action = self.warn_escalation
            why = f"warnings on {warn_run} consecutive steps (patience {self.warn_patience})"
        elif warns:
            action, why = Action.ALERT, "warning"
        else:
            return Decision(step, Action.CONTINUE)

        codes = ", ".join(sorted({f.code for f in reasons}))
        if self.monitor_only and action.rank > Action.ALERT.rank:
            return Decision(
                step,
                Action.ALERT,
                reasons,
                intended=action,
                message=f"monitor-only: would {action.value} ({why}: {codes})",
            )
        return Decision(step, action, reasons, message=f"{action.value}: {why} ({codes})")

    def resolved(self, step: int | None) -> None:
        """A repair was verified: the incident is over, so its steps stop counting toward halt."""
        self._critical.reset()

    def state_dict(self) -> dict[str, Any]:
        return {"critical": self._critical.state_dict(), "warn": self._warn.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._critical.load_state_dict(state.get("critical", {}))
        self._warn.load_state_dict(state.get("warn", {}))


def acting(decision: Decision) -> Action | None:
    """The course-changing action of a decision, done or (monitor-only) intended; None if it
    only alerts."""
    acts = [
        a
        for a in (decision.action, decision.intended)
        if a is not None and a.rank >= Action.SKIP_BATCH.rank
    ]
    return max(acts, key=lambda a: a.rank) if acts else None


def teacher_attributed(findings: Iterable[Finding]) -> bool:
    """Whether a critical finding among them is one the teacher explains (and a reload fixes)."""
    return any(f.severity is Severity.CRITICAL and f.code in TEACHER_ATTRIBUTED for f in findings)


def worst(*decisions: Decision) -> Decision:
    """The decision of highest :attr:`~Decision.priority` (the first of equals)."""
    return max(decisions, key=lambda d: d.priority)


def feasible(decision: Decision, *, update_pending: bool, can_reload: bool) -> Decision:
    """The decision as it can be carried out where it was taken: a rewake needs a teacher to
    reload, a skip an update still to come. What could not be done stays as ``intended`` and is
    said in the message, never recorded as done."""
    if decision.action is Action.REWAKE and not can_reload:
        done, why = (
            (Action.SKIP_BATCH, "no live teacher to reload: this update is skipped instead")
            if update_pending
            else (Action.ALERT, "no live teacher to reload, and the update was already taken")
        )
    elif decision.action is Action.SKIP_BATCH and not update_pending and _nonfinite_loss(decision):
        done, why = (  # fail closed: what it would have skipped has reached the weights
            Action.HALT,
            "the update on a non-finite loss was already taken, so the student's weights may "
            "now be NaN (a NaN gradient reaches every weight through the optimizer unless the "
            "trainer skipped the step); halted. The halt checkpoint holds the weights after "
            "that update: resume from the checkpoint before this step, and hand the guard the "
            "raw loss before the optimizer (on_step_metrics(..., before_update=True)) to skip "
            "such a step instead",
        )
    elif decision.action is Action.SKIP_BATCH and not update_pending:
        done, why = Action.ALERT, "the update of this step was already taken: nothing skipped"
    else:
        return decision
    return dataclasses.replace(
        decision,
        action=done,
        intended=decision.intended or decision.action,
        message=f"{decision.message}; {why}",
    )


def _nonfinite_loss(decision: Decision) -> bool:
    """A critical non-finite metric (the loss) among the decision's reasons."""
    return any(
        f.code == Code.METRIC_NONFINITE and f.severity is Severity.CRITICAL
        for f in decision.reasons
    )


def _action(field_name: str, value: Action | str) -> Action:
    try:
        return Action(value)
    except ValueError:
        choices = ", ".join(a.value for a in Action)
        raise GuardValueError(f"{field_name} must be one of {choices}, got {value!r}") from None


@dataclass
class _StepRun:
    """Length of the current run of consecutive observed steps on which a condition held.

    A step holds if any of its stages found something: a clean stage (the teacher scores of a
    step whose loss later sits at the ceiling) does not end the run, only a step with no hit at
    any stage does, and that is known when the next step begins.
    """

    run: int = 0
    last_step: int | None = None
    last_hit: bool = False

    def observe(self, step: int | None, hit: bool) -> int:
        if step is None or step != self.last_step:
            if not self.last_hit:
                self.run = 0
            self.last_step, self.last_hit = step, False
        if hit and not self.last_hit:
            self.run += 1
            self.last_hit = True
        return self.run if self.last_hit else 0

    def reset(self) -> None:
        self.run = 0
        self.last_hit = False

    def state_dict(self) -> dict[str, Any]:
        return {"run": self.run, "last_step": self.last_step, "last_hit": self.last_hit}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.run = int(state.get("run", 0))
        last_step = state.get("last_step")
        if last_step is not None and (
            isinstance(last_step, bool) or not isinstance(last_step, numbers.Integral)
        ):
            raise GuardValueError(f"last_step must be a step (an int) or None, got {last_step!r}")
        self.last_step = None if last_step is None else int(last_step)
        self.last_hit = bool(state.get("last_hit", False))
