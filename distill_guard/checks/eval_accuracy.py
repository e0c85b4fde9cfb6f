"""Eval accuracy drop: the held-out accuracy falling well below its early level."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from distill_guard.checks.base import Check, likely_cause
from distill_guard.checks.robust import Reference, RollingMedian
from distill_guard.findings import Code, Finding, Severity
from distill_guard.observations import Metric, RunSpec, StepMetrics


@dataclass
class EvalAccuracyCheck(Check):
    """Warns when the median of the last ``window`` evaluations has lost a large share of the
    accuracy of the first ``warmup_evals``.

    Evaluations are sparse and noisy, so one bad evaluation is one value of the window; a dead
    teacher takes accuracy to zero (0.36 → 0.01 in the failed run) and holds it there.
    """

    name: ClassVar[str] = "eval_accuracy"

    enabled: bool = True
    """Switch the check off without removing it from a preset."""
    warmup_evals: int = 3
    """Evaluations whose median is the reference."""
    window: int = 3
    """Evaluations in the rolling median that is judged."""
    max_drop_rel: float = 0.5
    """Warn when the median has lost at least this fraction of the reference ..."""
    min_drop_abs: float = 0.05
    """... and at least this much accuracy (a run at 2 % accuracy has little to lose)."""

    def __post_init__(self) -> None:
        self._reference = Reference(self.warmup_evals)
        self._recent = RollingMedian(self.window)

    def on_step_metrics(self, metrics: StepMetrics, run: RunSpec) -> list[Finding]:
        acc = metrics.get(Metric.EVAL_ACCURACY)
        if not self.enabled or acc is None or not math.isfinite(acc):
            return []
        median = self._recent.add(acc)
        ref = self._reference
        ready = ref.ready
        ref.add(acc)
        if median is None or not ready:
            return []
        drop = ref.median - median
        bound = max(self.max_drop_rel * ref.median, self.min_drop_abs)
        if drop < bound:
            return []
        return [
            Finding(
                Code.EVAL_ACCURACY_DROP,
                Severity.WARN,
                f"Eval accuracy: the median of the last {self.window} evaluations is "
                f"{median:.3f}, {drop:.3f} below its early level {ref.median:.3f} (bound "
                f"{bound:.3f}: {self.max_drop_rel:.0%} of it or {self.min_drop_abs:g}). "
                + likely_cause(metrics, "A student that unlearns"),
                metrics.step,
                {
                    "eval_accuracy": acc,
                    "window_median": median,
                    "window": self.window,
                    "reference_median": ref.median,
                    "bound": bound,
                },
            )
        ]

    def state_dict(self) -> dict[str, Any]:
        return {"reference": self._reference.state_dict(), "recent": self._recent.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._reference.load_state_dict(state.get("reference", {}))
        self._recent.load_state_dict(state.get("recent", {}))
