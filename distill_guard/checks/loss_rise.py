"""Loss rise: the distillation loss multiplying over the student's own start, below any ceiling."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from distill_guard.checks.base import Check
from distill_guard.checks.robust import Reference, RollingMedian
from distill_guard.findings import Code, Finding, Severity
from distill_guard.observations import Metric, RunSpec, StepMetrics


@dataclass
class LossRiseCheck(Check):
    """Warns when the median per-token loss of the last ``window`` steps has multiplied over the
    student's start: the median of its first ``start_steps`` values, taken before its updates
    could move it (step 0 is the student before any update).

    A healthy distillation loss falls from its start; a learning-rate warm-up only slows the
    fall, and a hard batch is one value of the window. A loss that triples and holds is a
    student leaving its teacher (a learning rate far too high, a loss with the wrong sign) or a
    teacher that changed. Judged for losses with a ceiling too: a dead teacher sends a JSD to its
    ceiling, which is ``jsd_ceiling``'s (medians near it are left to that check), while a student
    that leaves a healthy teacher stays below it, where only this check sees it. Whom it blames
    comes from the teacher's own evidence of the step (``StepMetrics.teacher_healthy``); a step
    whose teacher is flagged is not counted at all (its loss is the teacher's).
    """

    name: ClassVar[str] = "loss_rise"

    enabled: bool = True
    """Switch the check off without removing it from a preset."""
    start_steps: int = 1
    """First finite values whose median is the student's start. 1: step 0's loss, of the student
    before any update, the one value no update can have moved (a learning rate 100× too high
    sends the loss to 0.5 at step 1 already). A high outlier there only makes the check less
    sensitive; a low one is still a third of the bound away."""
    window: int = 5
    """Steps in the rolling median that is judged; a rise must hold on more than half of them."""
    min_factor: float = 3.0
    """Warn when the median is at least this many times the start ..."""
    threshold_sigma: float = 6.0
    """... and this many σ of the start above it (σ from the start's MAD, at least
    ``min_sigma_rel`` of the start) ..."""
    min_sigma_rel: float = 0.05
    """Floor on the start's σ as a fraction of it."""
    min_rise_abs: float = 0.005
    """... and at least this many nats per token above it: a loss near zero that triples has
    not left its teacher."""
    ceiling_fraction: float = 0.95
    """For a loss with a ceiling (JSD): medians at or above this fraction of it are left to
    ``jsd_ceiling``, which judges them exactly and blames the side the teacher's evidence
    points to."""

    def __post_init__(self) -> None:
        self._start = Reference(self.start_steps, self.min_sigma_rel)
        self._recent = RollingMedian(self.window)

    def on_step_metrics(self, metrics: StepMetrics, run: RunSpec) -> list[Finding]:
        loss = metrics.get(Metric.LOSS)
        if not self.enabled or loss is None or not math.isfinite(loss):
            return []
        if metrics.teacher_healthy is False:
            # the loss against a teacher flagged this step is the teacher's, already found: it
            # is no value of the student's own (nor its start), and a resumed run whose window
            # still held those steps would be told its student left the teacher
            return []
        per_token = loss / run.loss_scale
        median = self._recent.add(per_token)
        start = self._start
        start.add(per_token)
        if median is None or not start.ready:
            return []
        ceiling = run.loss_ceiling
        if ceiling is not None and median >= self.ceiling_fraction * ceiling:
            return []
        bound = max(
            self.min_factor * start.median,
            start.median + self.threshold_sigma * start.sigma,
            start.median + self.min_rise_abs,
        )
        if median < bound:
            return []
        factor = median / max(start.median, 1e-12)
        return [
            Finding(
                Code.LOSS_RISE,
                Severity.WARN,
                f"Per-token {run.loss.value} loss: the median of the last {self.window} steps is "
                f"{median:.4g}, {factor:.1f}× the student's start {start.median:.4g} ("
                + (
                    "its first loss, before any update"
                    if self.start_steps == 1
                    else f"the median of its first {self.start_steps} losses"
                )
                + f"; bound {bound:.4g}: "
                f"{self.min_factor:g}×, {self.threshold_sigma:g}σ or {self.min_rise_abs:g} "
                f"above it, whichever is larger)"
                + (f", below the ceiling {ceiling:.4f}. " if ceiling is not None else ". ")
                + "A distillation loss falls from its start; this one has multiplied and holds. "
                + _cause(metrics),
                metrics.step,
                {
                    "per_token_loss": per_token,
                    "window_median": median,
                    "window": self.window,
                    "reference_median": start.median,
                    "reference_sigma": start.sigma,
                    "factor": factor,
                    "bound": bound,
                    "ceiling": ceiling,
                    "teacher_healthy": metrics.teacher_healthy,
                },
            )
        ]

    def state_dict(self) -> dict[str, Any]:
        return {"start": self._start.state_dict(), "recent": self._recent.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._start.load_state_dict(state.get("start", {}))
        self._recent.load_state_dict(state.get("recent", {}))


def _cause(metrics: StepMetrics) -> str:
    """Whom the teacher's own evidence of this step points at."""
    if metrics.teacher_healthy:
        return (
            "The teacher's scores of this step were checked and are healthy, so the student is "
            "leaving its teacher: a learning rate far too high (lower it), a loss with the "
            "wrong sign or weighting. Reloading the teacher would not help; resume from a "
            "checkpoint before the rise with a lower learning rate."
        )
    return (
        "The guard saw no teacher scores this step to tell the two causes apart: a student "
        "leaving a healthy teacher (a learning rate far too high, a loss with the wrong sign) "
        "or a teacher whose scores changed (weights damaged without being uniform). Check the "
        "teacher's logprobs and sample responses, and the learning rate."
    )
