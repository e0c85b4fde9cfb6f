"""Truncation: responses hitting the length limit, as when the student loses its EOS."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from distill_guard.checks.base import Check, likely_cause
from distill_guard.checks.robust import RollingMedian
from distill_guard.findings import Code, Finding, Severity
from distill_guard.observations import Metric, RunSpec, StepMetrics


@dataclass
class TruncationCheck(Check):
    """Warns when the median truncated-response ratio of the last ``window`` steps is at or
    above a limit.

    A student pushed toward a uniform teacher loses its EOS probability, so every response runs
    to the length limit. A burst of one or two long batches moves no median of five; truncation
    alone does not say why, so this only warns.
    """

    name: ClassVar[str] = "truncation"

    enabled: bool = True
    """Switch the check off without removing it from a preset."""
    max_ratio: float = 0.5
    """Median truncated fraction of responses at or above which the check warns."""
    window: int = 5
    """Steps in the median; more than half of them must be at the limit."""

    def __post_init__(self) -> None:
        self._recent = RollingMedian(self.window)

    def on_step_metrics(self, metrics: StepMetrics, run: RunSpec) -> list[Finding]:
        ratio = metrics.get(Metric.TRUNCATED_RATIO)
        if not self.enabled or ratio is None or not math.isfinite(ratio):
            return []
        median = self._recent.add(ratio)
        if median is None or median < self.max_ratio:
            return []
        return [
            Finding(
                Code.STUDENT_TRUNCATION,
                Severity.WARN,
                f"A median {median:.0%} of responses were truncated over the last {self.window} "
                f"steps (this step {ratio:.0%}; limit {self.max_ratio:.0%}): the student is "
                "losing its EOS. Look at sample responses before trusting this run. "
                + likely_cause(metrics, "A student that stops ending its answers"),
                metrics.step,
                {
                    "truncated_ratio": ratio,
                    "window_median": median,
                    "window": self.window,
                    "bound": self.max_ratio,
                },
            )
        ]

    def state_dict(self) -> dict[str, Any]:
        return {"recent": self._recent.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._recent.load_state_dict(state.get("recent", {}))
