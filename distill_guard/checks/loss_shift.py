"""Loss shift: the distillation loss leaving its warm-up level, for losses without a ceiling."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from distill_guard.checks.base import Check, likely_cause
from distill_guard.checks.robust import Reference, RollingMedian
from distill_guard.findings import Code, Finding, Severity
from distill_guard.observations import Metric, RunSpec, StepMetrics


@dataclass
class LossShiftCheck(Check):
    """Warns when the median per-token loss of the last ``window`` steps has multiplied over its
    frozen warm-up level.

    A KL loss has no ceiling for a dead teacher to hit: against a uniform teacher the forward KL
    jumps by an order of magnitude and stays there. A hard batch is one value of the window and
    moves nothing; a healthy loss falls from its warm-up level, it does not multiply.
    """

    name: ClassVar[str] = "loss_shift"

    enabled: bool = True
    """Switch the check off without removing it from a preset."""
    warmup_steps: int = 50
    """Finite observations that form the frozen reference (median and MAD-based σ)."""
    window: int = 5
    """Steps in the rolling median; a shift must hold on more than half of them."""
    threshold_sigma: float = 6.0
    """The median must exceed the reference by this many reference σ ..."""
    min_factor: float = 3.0
    """... and be at least this many times the reference; or this many times the median of
    ``horizon`` steps ago (a loss that has decayed tenfold since its warm-up still jumps)."""
    horizon: int = 20
    """Steps back to the second reference, the median then."""
    only_without_ceiling: bool = True
    """Judge only losses without a ceiling (KL): a JSD's exact ceiling test catches a dead
    teacher at its first step, so a statistic on it would only add false alarms."""

    def __post_init__(self) -> None:
        self._reference = Reference(self.warmup_steps)
        self._recent = RollingMedian(self.window, lag=self.horizon)

    def on_step_metrics(self, metrics: StepMetrics, run: RunSpec) -> list[Finding]:
        loss = metrics.get(Metric.LOSS)
        if not self.enabled or loss is None or not math.isfinite(loss):
            return []
        if self.only_without_ceiling and run.loss_ceiling is not None:
            return []
        per_token = loss / run.loss_scale
        median = self._recent.add(per_token)
        ref = self._reference
        ready = ref.ready
        ref.add(per_token)
        if median is None or not ready:
            return []
        then = self._recent.then
        bound = max(ref.median + self.threshold_sigma * ref.sigma, self.min_factor * ref.median)
        jump = self._recent.lagged and median >= self.min_factor * then
        if median < bound and not jump:
            return []
        if median >= bound:
            what = (
                f"{median / max(ref.median, 1e-12):.1f}× its warm-up level {ref.median:.4g} "
                f"(bound {bound:.4g}: {self.min_factor:g}× or {self.threshold_sigma:g}σ above "
                "it, whichever is larger)"
            )
        else:
            what = (
                f"{median / max(then, 1e-12):.1f}× its level of {self.horizon} steps ago, "
                f"{then:.4g} (bound {self.min_factor:g}×)"
            )
        return [
            Finding(
                Code.LOSS_SHIFT,
                Severity.WARN,
                f"Per-token {run.loss.value} loss: the median of the last {self.window} steps is "
                f"{median:.4g}, {what}. Teacher and student have moved apart. "
                + likely_cause(metrics, "A loss that multiplies and stays up"),
                metrics.step,
                {
                    "per_token_loss": per_token,
                    "window_median": median,
                    "window": self.window,
                    "reference_median": ref.median,
                    "reference_sigma": ref.sigma,
                    "bound": bound,
                    "median_then": then,
                },
            )
        ]

    def state_dict(self) -> dict[str, Any]:
        return {"reference": self._reference.state_dict(), "recent": self._recent.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._reference.load_state_dict(state.get("reference", {}))
        self._recent.load_state_dict(state.get("recent", {}))
