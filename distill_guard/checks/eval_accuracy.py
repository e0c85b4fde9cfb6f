"""Eval accuracy drop: the held-out accuracy falling well below the best level it has shown."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from distill_guard.checks.base import Check, likely_cause
from distill_guard.checks.robust import RollingMedian, follows_dead_teacher, loaded_number
from distill_guard.findings import Code, Finding, Severity
from distill_guard.observations import Metric, RunSpec, StepMetrics


@dataclass
class EvalAccuracyCheck(Check):
    """Warns when the median of the last ``window`` evaluations has lost a large share of the
    run's best level: its first evaluation, or the best median of ``window`` since.

    The first evaluation is usually the student before any update, so it needs no warm-up that
    a failure present from step 0 could already have dragged down (the failed run's first three
    evaluations, 0.361, 0.011 and 0.0, have a median of 0.011). After it, the best window median
    seen: a dead teacher only lowers accuracy, so the best level is one the failure cannot fake
    upward. Evaluations are sparse and noisy, so one bad evaluation is one value of the window; a
    dead teacher takes accuracy to zero and holds it there.

    With an open incident (``StepMetrics.open_incident``), the first evaluation after it that is
    ``follow_up_drop_rel`` below the best level is ``student.follows_dead_teacher`` (critical).
    """

    name: ClassVar[str] = "eval_accuracy"

    enabled: bool = True
    """Switch the check off without removing it from a preset."""
    window: int = 3
    """Evaluations in the rolling median that is judged."""
    max_drop_rel: float = 0.5
    """Warn when the median has lost at least this fraction of the best level ..."""
    min_drop_abs: float = 0.05
    """... and at least this much accuracy (a run at 2 % accuracy has little to lose)."""
    follow_up_drop_rel: float = 0.25
    """With an open incident: an evaluation after it this fraction below the best level
    confirms it ..."""
    follow_up_drop_abs: float = 0.02
    """... if it is also this much accuracy below it (an evaluation's own sampling noise)."""

    def __post_init__(self) -> None:
        self._recent = RollingMedian(self.window)
        self._first: float | None = None
        self._best: float | None = None
        self._confirmed: int | None = None  # the open incident already confirmed

    @property
    def level(self) -> float | None:
        """The best level so far: the first evaluation, or the best window median since."""
        known = [x for x in (self._first, self._best) if x is not None]
        return max(known) if known else None

    def on_step_metrics(self, metrics: StepMetrics, run: RunSpec) -> list[Finding]:
        acc = metrics.get(Metric.EVAL_ACCURACY)
        if not self.enabled or acc is None or not math.isfinite(acc):
            return []
        first = self._first is None
        if first:
            self._first = acc
        median = self._recent.add(acc)
        findings = [] if first else self._follow_up(metrics, acc)
        if median is None:
            return findings
        level = self.level
        self._best = median if self._best is None else max(self._best, median)
        drop = level - median
        bound = max(self.max_drop_rel * level, self.min_drop_abs)
        if drop < bound:
            return findings
        findings.append(
            Finding(
                Code.EVAL_ACCURACY_DROP,
                Severity.WARN,
                f"Eval accuracy: the median of the last {self.window} evaluations is "
                f"{median:.3f}, {drop:.3f} below its best level {level:.3f} (its first "
                f"evaluation, or the best median of {self.window} since; bound {bound:.3f}: "
                f"{self.max_drop_rel:.0%} of it or {self.min_drop_abs:g}). "
                + likely_cause(metrics, "A student that unlearns"),
                metrics.step,
                {
                    "eval_accuracy": acc,
                    "window_median": median,
                    "window": self.window,
                    "reference_median": level,
                    "first_evaluation": self._first,
                    "bound": bound,
                },
            )
        )
        return findings

    def _follow_up(self, metrics: StepMetrics, acc: float) -> list[Finding]:
        n = metrics.open_incident
        if n is None:
            self._confirmed = None
            return []
        level = self.level
        if metrics.step <= n or self._confirmed == n or level is None:
            return []
        bound = max(self.follow_up_drop_rel * level, self.follow_up_drop_abs)
        if level - acc < bound:
            return []
        self._confirmed = n
        what = (
            f"Eval accuracy follows the open incident of step {n}: the evaluation of step "
            f"{metrics.step} is {acc:.3f}, {level - acc:.3f} below its best level {level:.3f} "
            f"(follow-up bound {bound:.3f}: {self.follow_up_drop_rel:.0%} of it or "
            f"{self.follow_up_drop_abs:g})."
        )
        values = {"eval_accuracy": acc, "baseline": level, "bound": bound}
        return [follows_dead_teacher(metrics.step, n, what, values)]

    def state_dict(self) -> dict[str, Any]:
        return {
            "first": self._first,
            "best": self._best,
            "recent": self._recent.state_dict(),
            "confirmed": self._confirmed,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """States from before the best level (a ``reference``: the median of the first three)
        load with that median as the best level and its first value as the first."""
        self._recent.load_state_dict(state.get("recent", {}))
        old = state.get("reference", {})
        pending = old.get("pending") or [None]
        self._first = loaded_number(state.get("first", pending[0]), "first")
        self._best = loaded_number(state.get("best", old.get("median")), "best")
        self._confirmed = loaded_number(state.get("confirmed"), "confirmed", int)
