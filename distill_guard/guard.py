"""DistillGuard: runs the checks at each stage of a step, asks the policy, and carries out its word.

Where it sits in a step (DESIGN.md §3)::

    wake ─► after_wake (canary) ─► score ─► on_teacher_scores ─► loss/backward ─► optimizer
      ▲                                                                              │
    sleep ◄─ before_sleep (fingerprint) ◄────────────── on_step_metrics ◄────────────┘

Every hook returns a :class:`~distill_guard.policy.Decision`. The guard never raises into the
trainer through its own fault: a check that throws, an unreachable teacher or a broken alert
channel becomes a finding like any other.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from distill_guard.alerts import Alerter, alert_title
from distill_guard.checks import (
    Check,
    EntropyDriftCheck,
    JSDCeilingCheck,
    NonfiniteMetricsCheck,
    ReverseKLSignatureCheck,
    TeacherCollapseCheck,
    TruncationCheck,
)
from distill_guard.events import EventLog
from distill_guard.findings import Code, Finding, Severity
from distill_guard.observations import RunSpec, StepMetrics, TeacherScores
from distill_guard.policy import Action, Decision, Policy

log = logging.getLogger("distill_guard")

Reducer = Callable[[Decision], Decision]
"""Makes every rank take the same decision (see :mod:`distill_guard.consensus`)."""


def default_checks() -> list[Check]:
    """The checks of the ``default`` preset, with their default thresholds."""
    return [
        TeacherCollapseCheck(),
        JSDCeilingCheck(),
        ReverseKLSignatureCheck(),
        EntropyDriftCheck(),
        TruncationCheck(),
        NonfiniteMetricsCheck(),
    ]


class GuardSummary:
    """What the guard has seen so far, in constant memory: first step and count per code."""

    def __init__(self) -> None:
        self.first: dict[str, int | None] = {}
        self.count: dict[str, int] = {}
        self.repairs = 0
        self.halt: dict[str, Any] | None = None

    def add_finding(self, f: Finding) -> None:
        self.first.setdefault(f.code, f.step)
        self.count[f.code] = self.count.get(f.code, 0) + 1

    def state_dict(self) -> dict[str, Any]:
        # deep copies both ways: a saved state is a snapshot, not a view of live counters
        return copy.deepcopy(vars(self))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for k, v in state.items():
            setattr(self, k, copy.deepcopy(v))


class DistillGuard:
    """Watches an on-policy distillation run and, when the teacher dies, repairs it or halts.

    Args:
        checks: the checks to run; :func:`default_checks` if None.
        policy: findings → decision; the default preset's if None.
        run: vocabulary size and loss of the run (``RunSpec``); learnt from the teacher if absent.
        events: an :class:`EventLog` or a path for one (JSONL, flushed per line).
        alerter: where alerts go; logger + wandb rank 0 by default.
        teacher: a live teacher (``distill_guard.teachers``) the guard may probe and repair.
        canary: the sleep/wake canary check; needs ``teacher``.
        reloader: replaces the default reload (``update_weights_from_disk`` of the server's own
            ``model_path``), for EMA or tensor-pushed teachers.
        repair_attempts, repair_backoff_s: bounds of one repair.
        reducer: makes all ranks agree on each decision; None on a single process.
        rank: this process's rank (events and alerts are tagged with it).
        on_finding: called with every finding, info included (metrics export, replay).
        stop_on_halt: after a halt, answer every later hook with the same halt without
            looking; False keeps observing (replay shows what the rest of a run would show).
    """

    def __init__(
        self,
        checks: Sequence[Check] | None = None,
        policy: Policy | None = None,
        run: RunSpec | None = None,
        *,
        events: EventLog | str | os.PathLike[str] | None = None,
        alerter: Alerter | None = None,
        teacher: Any = None,
        canary: Any = None,
        reloader: Callable[[Any], None] | None = None,
        repair_attempts: int = 3,
        repair_backoff_s: float = 1.0,
        reducer: Reducer | None = None,
        rank: int = 0,
        on_finding: Callable[[Finding], None] | None = None,
        stop_on_halt: bool = True,
    ) -> None:
        self.checks = list(default_checks() if checks is None else checks)
        self.policy = policy if policy is not None else Policy()
        self.run = run if run is not None else RunSpec()
        self.events = events if isinstance(events, EventLog) else EventLog(events, rank=rank)
        self.alerter = alerter if alerter is not None else Alerter(rank=rank)
        if self.alerter.on_error is None:
            self.alerter.on_error = self._alert_failed
        self.teacher = teacher
        self.canary = canary
        self.reloader = reloader
        self.repair_attempts = repair_attempts
        self.repair_backoff_s = repair_backoff_s
        self.reducer = reducer
        self.rank = rank
        self.on_finding = on_finding
        self.stop_on_halt = stop_on_halt
        self.summary = GuardSummary()
        self.incidents = _incident_tracker()
        if teacher is not None and self.run.vocab_size is None:
            self._learn_vocab_size(teacher)

    # ------------------------------------------------------------------ lifecycle hooks

    def on_teacher_scores(
        self,
        step: int,
        token_logprobs: torch.Tensor | None = None,
        topk_logprobs: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
    ) -> Decision:
        """After the teacher scored this step's batch, before the loss: a uniform teacher is
        caught here, before it poisons an update. Act on ``skip_batch``/``rewake`` by not
        training on these scores (re-score after a rewake)."""
        scores = TeacherScores(step, token_logprobs, topk_logprobs, mask)
        findings = self._run_checks("on_teacher_scores", scores)
        return self._conclude("teacher_scores", step, findings)

    def on_step_metrics(self, step: int, metrics: Mapping[str, float | None]) -> Decision:
        """After the optimizer step, with metrics keyed by :class:`~distill_guard.observations.Metric`
        roles (loss, student_entropy, truncated_ratio, teacher_logprob, eval_accuracy)."""
        values = {k: v for k, v in metrics.items() if v is not None}
        findings = self._run_checks("on_step_metrics", StepMetrics(step, values))
        return self._conclude("step_metrics", step, findings)

    def after_wake(self, step: int) -> Decision:
        """Right after the teacher is woken: the canary checks it before it scores anything."""
        findings: list[Finding] = []
        if self.canary is not None and self.teacher is not None:
            findings = self._safely(
                "canary", lambda: self.canary.verify(self.teacher, step=step), step
            )
            if not findings:
                self.incidents.on_clean_wake(step)
        return self._conclude("after_wake", step, findings)

    def before_sleep(self, step: int) -> None:
        """Just before the teacher is put to sleep: fingerprint it, so the wake can be compared
        with the same weights (this also holds for EMA teachers, whose weights move by step)."""
        if self.canary is not None and self.teacher is not None:
            self._safely(
                "canary", lambda: self.canary.fingerprint(self.teacher, step=step) and [], step
            )

    # ------------------------------------------------------------------ state

    @property
    def halted(self) -> bool:
        return self.summary.halt is not None

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs to keep its references (warm-up, CUSUM, counters)."""
        state: dict[str, Any] = {
            "checks": {c.name: c.state_dict() for c in self.checks},
            "policy": self.policy.state_dict(),
            "summary": self.summary.state_dict(),
            "run": dataclasses.asdict(self.run) | {"loss": self.run.loss.value},
        }
        if self.canary is not None and hasattr(self.canary, "state_dict"):
            state["canary"] = self.canary.state_dict()
        state["incidents"] = self.incidents.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        by_name = {c.name: c for c in self.checks}
        for name, sub in state.get("checks", {}).items():
            if name in by_name:
                by_name[name].load_state_dict(sub)
        self.policy.load_state_dict(state.get("policy", {}))
        self.summary.load_state_dict(state.get("summary", {}))
        if "run" in state:
            self.run = RunSpec(**state["run"])
        if (
            "canary" in state
            and self.canary is not None
            and hasattr(self.canary, "load_state_dict")
        ):
            self.canary.load_state_dict(state["canary"])

    def close(self) -> None:
        """Flush and close the event log (call at the end of training or before a halt exit)."""
        self.events.close()

    # ------------------------------------------------------------------ internals

    def _run_checks(self, hook: str, observation: Any) -> list[Finding]:
        findings: list[Finding] = []
        for check in self.checks:
            fn = getattr(check, hook)
            findings += self._safely(
                check.name, lambda fn=fn: fn(observation, self.run), observation.step
            )
        return findings

    def _safely(
        self, who: str, fn: Callable[[], list[Finding] | None], step: int | None
    ) -> list[Finding]:
        """Run guard-side work; any exception becomes a finding instead of reaching the trainer."""
        try:
            return list(fn() or [])
        except Exception as exc:  # noqa: BLE001 - fail safe by design
            if _is_teacher_error(exc):
                return [
                    Finding(
                        Code.TEACHER_UNREACHABLE,
                        Severity.WARN,
                        f"{who}: the teacher did not answer ({type(exc).__name__}: {exc}). The "
                        "guard could not check it this step; training continues. Check the "
                        "teacher server's health and the configured timeout.",
                        step,
                        {"who": who, "error": str(exc)},
                    )
                ]
            log.exception("distill_guard: %s raised", who)
            return [
                Finding(
                    Code.GUARD_INTERNAL_ERROR,
                    Severity.WARN,
                    f"{who} raised {type(exc).__name__}: {exc}. This is a fault in the guard or "
                    "in the data handed to it, not in the run; the guard skipped it this step. "
                    "Please report it with the event log.",
                    step,
                    {"who": who, "error": f"{type(exc).__name__}: {exc}"},
                )
            ]

    def _conclude(self, stage: str, step: int, findings: list[Finding]) -> Decision:
        if self.halted and self.stop_on_halt:
            return Decision(step, Action.HALT, message=self.summary.halt["message"])
        self._record(stage, findings)
        local = self.policy.decide(step, findings)
        decision = local
        alert_text: str | None = ""
        if self.reducer is not None:
            decision = self._reduce(local)
            if decision.action is Action.REWAKE:
                decision, alert_text = self._rewake_across_ranks(stage, decision, local)
        elif decision.action is Action.REWAKE:
            decision, alert_text = self._rewake(stage, decision)
        if decision.action is not Action.CONTINUE:
            self.events.write("decision", stage=stage, **decision.to_dict())
            if alert_text is not None:
                self._alert(decision, alert_text)
        if decision.action is Action.HALT and not self.halted:
            self.summary.halt = {
                "step": step,
                "stage": stage,
                "message": decision.message,
                "codes": sorted({f.code for f in decision.reasons}),
            }
            self.events.write("halt", stage=stage, step=step, message=decision.message)
            self.events.close()
        return decision

    def _record(self, stage: str, findings: list[Finding]) -> None:
        for f in findings:
            self.summary.add_finding(f)
            self.events.write("finding", stage=stage, **f.to_dict())
            if self.on_finding is not None:
                self.on_finding(f)

    def _reduce(self, decision: Decision) -> Decision:
        try:
            return self.reducer(decision)
        except Exception as exc:  # noqa: BLE001
            log.exception("distill_guard: decision reduction failed")
            # Without agreement the safe course for the local rank is to stop: a rank that
            # carries on alone would hang the others at their next collective.
            return Decision(
                decision.step,
                Action.HALT,
                decision.reasons,
                message=f"halt: ranks could not agree on a decision ({exc})",
            )

    def _rewake_across_ranks(
        self, stage: str, agreed: Decision, local: Decision
    ) -> tuple[Decision, str | None]:
        """An agreed rewake under a reducer: only the ranks whose own findings asked for it
        repair their teacher (the others' teachers are fine: attribute before acting). A second
        reduction, on every rank alike, then gives all ranks the outcome: a repair that failed
        anywhere halts all, and a successful one reaches every rank with the repairing rank's
        message and its incident notice (so rank 0, the one that talks to wandb, alerts once per
        incident with the fix, not at every wake). Returns the decision and the alert text.
        """
        if local.action is not Action.REWAKE:
            outcome = local
        else:
            outcome, alert_text = self._rewake(stage, agreed)
            if outcome.action is Action.REWAKE and alert_text != "":  # a repair was made here
                notice = Finding(
                    Code.TEACHER_REPAIRED,
                    Severity.WARN,
                    alert_text or outcome.message,
                    outcome.step,
                    {"rank": self.rank, "alert": alert_text is not None},
                )
                outcome = dataclasses.replace(outcome, reasons=(*outcome.reasons, notice))
        decision = self._reduce(outcome)
        repaired = [f for f in decision.reasons if f.code == Code.TEACHER_REPAIRED]
        if not repaired:
            return decision, ""
        return decision, (repaired[-1].message if repaired[-1].values.get("alert") else None)

    def _rewake(self, stage: str, decision: Decision) -> tuple[Decision, str | None]:
        """Carry out a rewake if this guard holds the teacher; else leave it to the adapter.

        Returns the decision as carried out and the extra alert text: None when this repair
        is one more of an incident already alerted (a teacher that loses its weights at every
        wake is one incident with a repair count, not an alert per step).
        """
        if self.teacher is None or self.canary is None:
            return decision, ""
        if getattr(self.teacher, "asleep", False):
            # Colocated: the trainer holds the memory now. The canary at the next wake decides.
            return dataclasses.replace(
                decision,
                message=f"{decision.message}; teacher asleep, the canary at its next wake "
                "will repair it if needed",
            ), ""
        from distill_guard.repair import repair_teacher

        outcome = repair_teacher(
            self.teacher,
            self.canary,
            reloader=self.reloader,
            max_attempts=self.repair_attempts,
            backoff_s=self.repair_backoff_s,
            step=decision.step,
            on_event=lambda kind, payload: self.events.write(
                kind, stage=stage, **{**payload, "step": decision.step}
            ),
        )
        self._record(stage, outcome.findings)
        notice = self.incidents.on_repair(outcome, step=decision.step, cause=list(decision.reasons))
        if outcome.ok:
            self.summary.repairs += 1
            self.policy.resolved(decision.step)
            decision = dataclasses.replace(
                decision,
                message=f"{decision.message}; teacher repaired in {outcome.attempts} attempt(s), "
                f"{outcome.seconds:.2f} s (repair {self.incidents.total_repairs} of this run)",
            )
            return decision, (notice.message if notice is not None else None)
        return Decision(
            decision.step,
            Action.HALT,
            (*outcome.findings[:1], *decision.reasons),
            message=f"halt: teacher repair failed after {outcome.attempts} attempt(s) "
            f"({decision.message})",
        ), outcome.findings[0].message

    def _alert(self, decision: Decision, extra: str = "") -> None:
        # the title names the cause; a shared repair notice (several ranks) is not one
        causes = {f.code for f in decision.reasons if f.code != Code.TEACHER_REPAIRED}
        codes = sorted(causes or {f.code for f in decision.reasons}) or ["unknown"]
        level = "ERROR" if decision.acts or decision.intended is not None else "WARN"
        title = alert_title(codes[0], decision.action.value if decision.acts else None)
        first = decision.reasons[0].message if decision.reasons else decision.message
        text = f"step {decision.step}: {decision.message}\n{first}" + (
            f"\n{extra}" if extra else ""
        )
        self.events.write("alert", step=decision.step, title=title, level=level)
        self.alerter.alert(title, text, level)

    def _alert_failed(self, title: str, exc: Exception) -> None:
        self.events.write("alert_failed", title=title, error=f"{type(exc).__name__}: {exc}")

    def _learn_vocab_size(self, teacher: Any) -> None:
        try:
            v = teacher.vocab_size
        except Exception:  # noqa: BLE001
            v = None
        if v:
            self.run = dataclasses.replace(self.run, vocab_size=int(v))


def _is_teacher_error(exc: Exception) -> bool:
    try:
        from distill_guard.teachers.base import TeacherError
    except ImportError:  # teachers layer not installed
        return False
    return isinstance(exc, TeacherError)


def _incident_tracker() -> Any:
    from distill_guard.repair import IncidentTracker

    return IncidentTracker()
