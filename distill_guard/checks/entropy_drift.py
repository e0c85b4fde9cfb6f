"""Student entropy drift: the student's entropy leaving its own warm-up level, toward ln V."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from distill_guard.checks.base import Check, likely_cause
from distill_guard.checks.robust import Episode, Reference, RollingMedian
from distill_guard.findings import Code, Finding, Severity
from distill_guard.observations import Metric, RunSpec, StepMetrics


@dataclass
class EntropyDriftCheck(Check):
    """The median of the student's last few step entropies against its frozen warm-up level,
    plus limits relative to ln V.

    The median makes one step of any size harmless (a 0.41 → 0.9 blip is one value of five); a
    rise must hold on most of the window. A rise is a warning (a dead teacher took a student
    from 0.41 to 3.56 nats); a fall is noted once per episode (a student converging on a
    confident teacher gets sharper). The limits need no warm-up, so a drift from step 0 is
    still caught.
    """

    name: ClassVar[str] = "entropy_drift"

    enabled: bool = True
    """Switch the check off without removing it from a preset."""
    warmup_steps: int = 50
    """Finite observations that form the frozen reference (median and MAD-based σ)."""
    window: int = 5
    """Steps in the rolling median that is judged; a shift must hold on more than half of them."""
    threshold_sigma: float = 3.0
    """The median must leave the reference by this many reference σ ..."""
    min_change_rel: float = 0.75
    """... and by at least this fraction of the reference: slow healthy drifts of a few tens of
    percent over a long run are not a dead teacher, whose student's entropy multiplies."""
    rise_horizon: int = 20
    """A rise is also judged over this many steps (the median now against the median then) ..."""
    min_rise_rel: float = 0.4
    """... where a rise of this fraction of the reference (and ``rise_sigma`` σ) is enough: a
    dead teacher's student climbs by that much within a few steps, a healthy drift never does."""
    rise_sigma: float = 6.0
    """σ a rise over ``rise_horizon`` must exceed: two medians differ by noise twice over."""
    min_change_abs: float = 0.05
    """... and by at least this many nats."""
    min_sigma_rel: float = 0.05
    """Floor on σ as a fraction of the reference, so a very steady warm-up is not brittle."""
    min_sigma_abs: float = 0.01
    """Absolute floor on σ, in nats."""
    warn_fraction_of_log_vocab: float = 0.25
    """Warn when the windowed median exceeds this × ln V (needs vocab_size)."""
    critical_fraction_of_log_vocab: float = 0.5
    """Critical when the windowed median exceeds this × ln V: the student is near uniform."""

    def __post_init__(self) -> None:
        self._reference = Reference(self.warmup_steps, self.min_sigma_rel, self.min_sigma_abs)
        self._recent = RollingMedian(self.window, lag=self.rise_horizon)
        self._falling = Episode()

    def on_step_metrics(self, metrics: StepMetrics, run: RunSpec) -> list[Finding]:
        h = metrics.get(Metric.STUDENT_ENTROPY)
        if not self.enabled or h is None or not math.isfinite(h):
            return []
        median = self._recent.add(h)
        ref = self._reference
        ready = ref.ready  # the value that completes the warm-up is not judged against it
        ref.add(h)
        if median is None:
            return []
        findings = self._limits(median, metrics, run)
        if not ready:
            return findings
        bound = max(
            self.threshold_sigma * ref.sigma,
            self.min_change_rel * abs(ref.median),
            self.min_change_abs,
        )
        values = {
            "student_entropy": h,
            "window_median": median,
            "window": self.window,
            "reference_median": ref.median,
            "reference_sigma": ref.sigma,
            "bound": bound,
        }
        rise = median - ref.median
        then = self._recent.then
        fast = median - then
        fast_bound = max(
            self.rise_sigma * ref.sigma,
            self.min_rise_rel * abs(ref.median),
            self.min_change_abs,
        )
        if rise >= bound or (self._recent.lagged and fast >= fast_bound):
            if rise >= bound:
                what = (
                    f"{rise:.3f} above its warm-up level {ref.median:.3f} (bound {bound:.3f}: "
                    f"{self.threshold_sigma:g}σ, {self.min_change_rel:.0%} of the level, or "
                    f"{self.min_change_abs:g} nats, whichever is larger)"
                )
            else:
                what = (
                    f"up {fast:.3f} from {then:.3f} {self.rise_horizon} steps ago (bound "
                    f"{fast_bound:.3f}: {self.min_rise_rel:.0%} of its warm-up level "
                    f"{ref.median:.3f}, or {self.rise_sigma:g}σ)"
                )
            findings.append(
                Finding(
                    Code.STUDENT_ENTROPY_DRIFT,
                    Severity.WARN,
                    f"Student entropy has risen: the median of the last {self.window} steps is "
                    f"{median:.3f} nats, {what}. "
                    + likely_cause(metrics, "A student drifting toward uniform"),
                    metrics.step,
                    {
                        **values,
                        "direction": "up",
                        "median_then": then,
                        "rise_horizon": self.rise_horizon,
                        "fast_bound": fast_bound,
                    },
                )
            )
        if self._falling.update(-rise >= bound):
            findings.append(
                Finding(
                    Code.STUDENT_ENTROPY_DROP,
                    Severity.INFO,
                    f"Student entropy has fallen: the median of the last {self.window} steps is "
                    f"{median:.3f} nats, {-rise:.3f} below its warm-up level {ref.median:.3f} "
                    f"(bound {bound:.3f}). Expected while distilling from a confident teacher; "
                    "worth a look only if accuracy stalls. Noted once until it recovers.",
                    metrics.step,
                    {**values, "direction": "down"},
                )
            )
        return findings

    def _limits(self, median: float, metrics: StepMetrics, run: RunSpec) -> list[Finding]:
        if run.vocab_size is None:
            return []
        log_v = run.log_vocab
        for severity, frac in (
            (Severity.CRITICAL, self.critical_fraction_of_log_vocab),
            (Severity.WARN, self.warn_fraction_of_log_vocab),
        ):
            if median >= frac * log_v:
                return [
                    Finding(
                        Code.STUDENT_ENTROPY_LIMIT,
                        severity,
                        f"Student entropy: the median of the last {self.window} steps is "
                        f"{median:.3f} nats, {median / log_v:.0%} of ln V = {log_v:.3f} (limit "
                        f"{frac:.0%}): the student's outputs are close to uniform noise. Stop "
                        "trusting its samples and roll back to a checkpoint from before the "
                        "rise. " + likely_cause(metrics, "A student this close to uniform"),
                        metrics.step,
                        {
                            "student_entropy": metrics.get(Metric.STUDENT_ENTROPY),
                            "window_median": median,
                            "log_vocab": log_v,
                            "bound": frac * log_v,
                        },
                    )
                ]
        return []

    def state_dict(self) -> dict[str, Any]:
        return {
            "reference": self._reference.state_dict(),
            "recent": self._recent.state_dict(),
            "falling": self._falling.active,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._reference.load_state_dict(state.get("reference", {}))
        self._recent.load_state_dict(state.get("recent", {}))
        self._falling.active = bool(state.get("falling", False))
