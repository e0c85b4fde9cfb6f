"""Truncation: responses hitting the length limit, as when the student loses its EOS."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from distill_guard.checks.base import Check
from distill_guard.findings import Code, Finding, Severity
from distill_guard.observations import Metric, RunSpec, StepMetrics


@dataclass
class TruncationCheck(Check):
    """Warns when the truncated-response ratio stays at or above a limit for ``patience`` steps.

    A student pushed toward a uniform teacher loses its EOS probability, so every response runs
    to the length limit. Truncation alone does not say why, so this only warns.
    """

    name: ClassVar[str] = "truncation"

    enabled: bool = True
    """Switch the check off without removing it from a preset."""
    max_ratio: float = 0.5
    """Truncated fraction of responses at or above which a step counts."""
    patience: int = 3
    """Consecutive counted steps before warning; a single long batch is not a trend."""

    def __post_init__(self) -> None:
        self._run = 0

    def on_step_metrics(self, metrics: StepMetrics, run: RunSpec) -> list[Finding]:
        ratio = metrics.get(Metric.TRUNCATED_RATIO)
        if not self.enabled or ratio is None or not math.isfinite(ratio):
            return []
        self._run = self._run + 1 if ratio >= self.max_ratio else 0
        if self._run < self.patience:
            return []
        return [
            Finding(
                Code.STUDENT_TRUNCATION,
                Severity.WARN,
                f"{ratio:.0%} of responses were truncated, at or above {self.max_ratio:.0%} for "
                f"{self._run} steps (patience {self.patience}): the student is losing its EOS. "
                "Look at sample responses and the teacher's logprobs before trusting this run.",
                metrics.step,
                {"truncated_ratio": ratio, "bound": self.max_ratio, "consecutive_steps": self._run},
            )
        ]

    def state_dict(self) -> dict[str, Any]:
        return {"run": self._run}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._run = int(state.get("run", 0))
