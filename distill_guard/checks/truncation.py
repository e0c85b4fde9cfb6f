"""Truncation: responses hitting the length limit, as when the student loses its EOS."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from distill_guard.checks.base import Check, likely_cause
from distill_guard.checks.robust import FollowUp, Reference, RollingMedian
from distill_guard.findings import Code, Finding, Severity
from distill_guard.observations import Metric, RunSpec, StepMetrics


@dataclass
class TruncationCheck(Check):
    """Warns when the median truncated-response ratio of the last ``window`` steps is at or
    above a limit and has risen to it: at least ``min_rise_abs`` above the student's own level
    over its first ``window`` steps.

    A student pushed toward a uniform teacher loses its EOS probability, so every response runs
    to the length limit. A burst of one or two long batches moves no median of five; truncation
    alone does not say why, so this only warns. A level present from the start is not a trend:
    a run whose completions are clipped from step 0 (a length limit too short for the task) has
    lost no EOS, and is not told it has.

    With an open incident (``StepMetrics.open_incident``), a small follow-up bound applies: the
    median ratio of the ``window`` steps since, up ``follow_up_rise_abs`` from its own level
    before the incident (its first value for an incident at step 0), is
    ``student.follows_dead_teacher`` (critical).
    """

    name: ClassVar[str] = "truncation"

    enabled: bool = True
    """Switch the check off without removing it from a preset."""
    max_ratio: float = 0.5
    """Median truncated fraction of responses at or above which the check warns."""
    window: int = 5
    """Steps in the median; more than half of them must be at the limit."""
    min_rise_abs: float = 0.1
    """How far above its level over the first ``window`` steps the median must be to warn."""
    follow_up_rise_abs: float = 0.1
    """With an open incident: the median of the ``window`` steps since, this much above the
    median before it, confirms it (a dead teacher takes the ratio to 1; a healthy batch's ratio
    varies by a few hundredths, and its bursts of one or two steps move no median of five)."""

    def __post_init__(self) -> None:
        self._recent = RollingMedian(self.window)
        self._start = Reference(self.window)
        self._follow = FollowUp(self.window)

    def on_step_metrics(self, metrics: StepMetrics, run: RunSpec) -> list[Finding]:
        ratio = metrics.get(Metric.TRUNCATED_RATIO)
        if not self.enabled or ratio is None or not math.isfinite(ratio):
            return []
        median = self._recent.add(ratio)
        start = self._start
        start.add(ratio)
        findings = self._follow_up(metrics, ratio)
        if median is None or median < self.max_ratio or start.median is None:
            return findings
        if median - start.median < self.min_rise_abs:
            return findings  # as clipped as it was from the start: not a lost EOS
        return findings + [
            Finding(
                Code.STUDENT_TRUNCATION,
                Severity.WARN,
                f"A median {median:.0%} of responses were truncated over the last {self.window} "
                f"steps (this step {ratio:.0%}; limit {self.max_ratio:.0%}), up from "
                f"{start.median:.0%} over its first {self.window}: the student is losing its EOS. Look at sample responses before trusting this run. "
                + likely_cause(metrics, "A student that stops ending its answers"),
                metrics.step,
                {
                    "truncated_ratio": ratio,
                    "window_median": median,
                    "window": self.window,
                    "bound": self.max_ratio,
                    "start_median": start.median,
                },
            )
        ]

    def _follow_up(self, metrics: StepMetrics, ratio: float) -> list[Finding]:
        follow = self._follow
        since = follow.add(metrics.step, ratio, metrics.open_incident)
        if since is None or follow.said or since - follow.baseline < self.follow_up_rise_abs:
            return []
        what = (
            f"Truncated responses follow the open incident of step {follow.incident}: a median "
            f"{since:.0%} over the {follow.window} steps since, up {since - follow.baseline:.2f} "
            f"from {follow.baseline:.0%} before it (follow-up bound {self.follow_up_rise_abs:g})."
        )
        values = {"truncated_ratio": ratio, "median_since": since}
        return [follow.finding(metrics.step, what, values | {"bound": self.follow_up_rise_abs})]

    def state_dict(self) -> dict[str, Any]:
        return {
            "recent": self._recent.state_dict(),
            "start": self._start.state_dict(),
            "follow_up": self._follow.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._recent.load_state_dict(state.get("recent", {}))
        self._start.load_state_dict(state.get("start", {}))
        self._follow.load_state_dict(state.get("follow_up", {}))
