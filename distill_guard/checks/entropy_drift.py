"""Student entropy drift: the student's entropy leaving its own start or warm-up level, toward ln V."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from distill_guard.checks.base import Check, likely_cause
from distill_guard.checks.robust import Episode, FollowUp, Reference, RollingMedian
from distill_guard.findings import Code, Finding, Severity
from distill_guard.observations import Metric, RunSpec, StepMetrics


@dataclass
class EntropyDriftCheck(Check):
    """The median of the student's last few step entropies against its own level before any
    update, then its frozen warm-up level, plus limits relative to ln V.

    The level is the anchor (the first value: the student that made the step-0 samples) from
    the first full window on, with σ from the floors; once the warm-up completes, its median and
    MAD σ, but only if the warm-up was stable: a warm-up whose median moved from the anchor by
    the check's bound is a trend, not a level (a teacher dead from step 0 makes the warm-up the
    climb), so it is reported (``student.warmup_trend``, once: a warning up, a note down) and
    the anchor is kept. The median makes one step of any size harmless (a 0.41 → 0.9 blip is
    one value of five); a rise must hold on most of the window. A rise is a warning (a dead
    teacher took a student from 0.41 to 3.56 nats); a fall is noted once per episode (a student
    converging on a confident teacher gets sharper). The limits need no reference at all.

    With an open incident (``StepMetrics.open_incident``), a small follow-up bound applies: the
    median of the ``follow_up_window`` values since, against the level before the incident
    (the anchor for an incident at step 0), is ``student.follows_dead_teacher`` (critical).
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
    follow_up_window: int = 3
    """With an open incident: values after it whose median is judged (and before it, whose
    median is the level it is judged against)."""
    follow_up_rise_rel: float = 0.1
    """With an open incident: a rise of this fraction of the level before it confirms it ..."""
    follow_up_rise_abs: float = 0.03
    """... or of this many nats, whichever is larger (a dead teacher moved the seed run's
    student 0.016–0.07 nats a step from its first update; its healthy steps vary by 0.015)."""

    def __post_init__(self) -> None:
        self._reference = Reference(self.warmup_steps, self.min_sigma_rel, self.min_sigma_abs)
        self._recent = RollingMedian(self.window, lag=self.rise_horizon)
        self._falling = Episode()
        self._follow = FollowUp(self.follow_up_window)
        self._trend = False  # the warm-up held a trend, so the anchor stays the level

    def _bound(self, level: float, sigma: float) -> float:
        return max(
            self.threshold_sigma * sigma,
            self.min_change_rel * abs(level),
            self.min_change_abs,
        )

    def _level(self, warmed: bool) -> tuple[float, float, str]:
        """(level, σ, source): the warm-up's once it completed stable, else the anchor's with σ
        from the floors."""
        ref = self._reference
        if warmed and not self._trend:
            return ref.median, ref.sigma, "warm-up"
        return ref.anchor, ref.floor_sigma(ref.anchor), "anchor"

    def on_step_metrics(self, metrics: StepMetrics, run: RunSpec) -> list[Finding]:
        h = metrics.get(Metric.STUDENT_ENTROPY)
        if not self.enabled or h is None or not math.isfinite(h):
            return []
        median = self._recent.add(h)
        ref = self._reference
        warmed = ref.ready  # the value that completes the warm-up is not judged against it
        ref.add(h)
        findings = self._warmup_done(metrics) if ref.ready and not warmed else []
        findings += self._follow_up(metrics, h, warmed)
        if median is None:
            return findings
        findings += self._limits(median, metrics, run)
        level, sigma, source = self._level(warmed)
        named = (
            f"its warm-up level {level:.3f}"
            if source == "warm-up"
            else f"its first value {level:.3f} (the student before any update)"
        )
        bound = self._bound(level, sigma)
        values = {
            "student_entropy": h,
            "window_median": median,
            "window": self.window,
            "reference_median": level,
            "reference_sigma": sigma,
            "reference": source,
            "bound": bound,
        }
        rise = median - level
        then = self._recent.then
        fast = median - then
        fast_bound = max(
            self.rise_sigma * sigma,
            self.min_rise_rel * abs(level),
            self.min_change_abs,
        )
        fast_rise = warmed and self._recent.lagged and fast >= fast_bound
        if rise >= bound or fast_rise:
            if rise >= bound:
                what = (
                    f"{rise:.3f} above {named}; bound {bound:.3f}: "
                    f"{self.threshold_sigma:g}σ, {self.min_change_rel:.0%} of the level, or "
                    f"{self.min_change_abs:g} nats, whichever is larger"
                )
            else:
                what = (
                    f"up {fast:.3f} from {then:.3f} {self.rise_horizon} steps ago; bound "
                    f"{fast_bound:.3f}: {self.min_rise_rel:.0%} of {named}, or "
                    f"{self.rise_sigma:g}σ"
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
                    f"{median:.3f} nats, {-rise:.3f} below {named}; bound {bound:.3f}. "
                    "Expected while distilling from a confident teacher; worth a look only if "
                    "accuracy stalls. Noted once until it recovers.",
                    metrics.step,
                    {**values, "direction": "down"},
                )
            )
        return findings

    def _warmup_done(self, metrics: StepMetrics) -> list[Finding]:
        """The warm-up just completed: trusted only if its median stayed within the check's
        bound of the anchor; a trend inside it is said once, and the anchor is kept."""
        ref = self._reference
        anchor, warm = ref.anchor, ref.median
        sigma = ref.floor_sigma(anchor)
        bound = self._bound(anchor, sigma)
        move = warm - anchor
        if abs(move) < bound:
            return []
        self._trend = True
        up = move > 0
        head = (
            f"Student entropy: its warm-up was not stable. The median of its first "
            f"{self.warmup_steps} steps, {warm:.3f} nats, is {abs(move):.3f} "
            f"{'above' if up else 'below'} its first value {anchor:.3f}, the student before any "
            f"update (bound {bound:.3f}: {self.threshold_sigma:g}σ of the floors, "
            f"{self.min_change_rel:.0%} of it, or {self.min_change_abs:g} nats). A warm-up that "
            f"{'climbs' if up else 'falls'} is no level, so the check keeps judging against the "
            f"first value {anchor:.3f} (σ {sigma:.3f}, from the floors), not the warm-up. "
        )
        tail = (
            likely_cause(metrics, "A climb from the first update on")
            if up
            else "A student sharpening on a confident teacher does this; recorded only."
        )
        return [
            Finding(
                Code.STUDENT_WARMUP_TREND,
                Severity.WARN if up else Severity.INFO,
                head + tail,
                metrics.step,
                {
                    "anchor": anchor,
                    "warmup_median": warm,
                    "warmup_steps": self.warmup_steps,
                    "bound": bound,
                    "direction": "up" if up else "down",
                    "reference": "anchor",
                    "reference_sigma": sigma,
                },
            )
        ]

    def _follow_up(self, metrics: StepMetrics, h: float, warmed: bool) -> list[Finding]:
        follow = self._follow
        since = follow.add(metrics.step, h, metrics.open_incident, self._level(warmed)[0])
        if since is None or follow.said:
            return []
        base = follow.baseline
        bound = max(self.follow_up_rise_rel * abs(base), self.follow_up_rise_abs)
        rise, trend = since - base, follow.trend_rise(metrics.step)
        by_trend = trend is not None and trend >= bound and rise >= bound / 2
        if rise < bound and not by_trend:
            return []
        trend_said = (
            f" and its trend since (the Theil–Sen slope over {metrics.step - follow.incident} "
            f"steps) puts it {trend:.3f} above"
            if trend is not None
            else ""
        )
        what = (
            f"Student entropy follows the open incident of step {follow.incident}: the median "
            f"of its last {follow.window} values since is {since:.3f} nats, {rise:.3f} "
            f"above its level before the incident {base:.3f}{trend_said} (follow-up bound "
            f"{bound:.3f}: {self.follow_up_rise_rel:.0%} of that level or "
            f"{self.follow_up_rise_abs:g} nats, whichever is larger; by the trend, with the "
            "median at half of it)."
        )
        return [
            follow.finding(
                metrics.step,
                what,
                {
                    "student_entropy": h,
                    "median_since": since,
                    "trend_rise": trend,
                    "bound": bound,
                },
            )
        ]

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
            "trend": self._trend,
            "follow_up": self._follow.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Old states (before the anchor) load as a stable warm-up whose anchor is its first
        value, else its median."""
        self._reference.load_state_dict(state.get("reference", {}))
        self._recent.load_state_dict(state.get("recent", {}))
        self._falling.active = bool(state.get("falling", False))
        self._trend = bool(state.get("trend", False))
        self._follow.load_state_dict(state.get("follow_up", {}))
