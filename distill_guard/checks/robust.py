"""Robust statistics the metric checks share: a frozen warm-up reference and a rolling median.

One step of any size cannot move the median of five, so no metric check warns on an isolated
outlier (a hard batch, an entropy blip); a sustained shift moves the median within
``window // 2 + 1`` steps. The reference is the warm-up's median with a MAD-based σ, so a spike
inside the warm-up does not inflate it either. Its anchor is the first value: the student before
its first update, the one level a failure present from step 0 cannot have moved.
:class:`FollowUp` keeps the student's level before an open incident and its values since.
"""

from __future__ import annotations

import math
import numbers
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from distill_guard.errors import GuardTypeError, GuardValueError
from distill_guard.findings import Code, Finding, Severity

MAD_TO_SIGMA = 1.4826
"""σ of a normal distribution per unit of median absolute deviation."""


def loaded_number(value: Any, name: str, kind: type = float) -> Any:
    """``name``'s number read back from a saved state as ``kind`` (None stays None); anything
    else (a string, a list: a corrupted state) raises, so the guard refuses the state whole
    instead of failing at a later step."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise GuardTypeError(f"{name} must be a number or None, got {type(value).__name__}")
    return kind(value)


@dataclass
class Reference:
    """Median and robust σ of the first ``size`` finite values, frozen once taken, and the
    ``anchor``: the first finite value of all.

    Frozen on purpose: a running reference would chase the drift it should detect. The anchor is
    there from the first value on; at step 0 it is the student before any update (it made the
    step-0 samples), so a failure present from the start, which the warm-up would learn as
    healthy, cannot have moved it.
    """

    size: int
    min_sigma_rel: float = 0.0
    min_sigma_abs: float = 0.0
    median: float | None = None
    sigma: float | None = None
    anchor: float | None = None
    _pending: list[float] = field(default_factory=list)

    @property
    def ready(self) -> bool:
        return self.median is not None

    def floor_sigma(self, level: float) -> float:
        """σ from the floors alone at ``level``: what is known of the noise before a warm-up."""
        return max(self.min_sigma_rel * abs(level), self.min_sigma_abs, 1e-12)

    def add(self, value: float) -> None:
        """Count one finite value toward the warm-up (the first one is the anchor); no effect
        on the median once frozen."""
        if not math.isfinite(value):
            return
        if self.anchor is None:
            self.anchor = value
        if self.ready:
            return
        self._pending.append(value)
        if len(self._pending) >= self.size:
            med = statistics.median(self._pending)
            mad = statistics.median(abs(x - med) for x in self._pending)
            self.median = med
            self.sigma = max(MAD_TO_SIGMA * mad, self.floor_sigma(med))
            self._pending = []

    def state_dict(self) -> dict[str, Any]:
        return {
            "median": self.median,
            "sigma": self.sigma,
            "anchor": self.anchor,
            "pending": list(self._pending),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.median = loaded_number(state.get("median"), "median")
        self.sigma = loaded_number(state.get("sigma"), "sigma")
        self._pending = [float(x) for x in state.get("pending", [])]
        if "anchor" in state:
            self.anchor = None if state["anchor"] is None else float(state["anchor"])
        else:  # a state from before the anchor: its first value, else its warm-up median
            self.anchor = self._pending[0] if self._pending else self.median


@dataclass
class RollingMedian:
    """The median of the last ``window`` finite values; None until the window is full.

    With ``lag``, it also keeps its own medians of up to ``lag`` steps back, so a check can hold
    the median now against the median then (a fast rise, a jump after a long decay).
    """

    window: int
    lag: int = 0
    _values: deque[float] = field(default_factory=deque)
    _past: deque[float] = field(default_factory=deque)

    def __post_init__(self) -> None:
        if self.window < 1:
            raise GuardValueError(f"window must be >= 1, got {self.window}")
        self._values = deque(self._values, maxlen=self.window)
        self._past = deque(self._past, maxlen=self.lag + 1)

    def add(self, value: float) -> float | None:
        if math.isfinite(value):
            self._values.append(value)
        median = self.value
        if median is not None and self.lag:
            self._past.append(median)
        return median

    @property
    def value(self) -> float | None:
        if len(self._values) < self.window:
            return None
        return statistics.median(self._values)

    @property
    def then(self) -> float | None:
        """The oldest median kept: ``lag`` steps back once :attr:`lagged`, earlier before."""
        return self._past[0] if self._past else None

    @property
    def lagged(self) -> bool:
        """Whether :attr:`then` is a full ``lag`` steps back."""
        return len(self._past) > self.lag

    def state_dict(self) -> dict[str, Any]:
        return {"values": list(self._values), "past": list(self._past)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._values = deque((float(x) for x in state.get("values", [])), maxlen=self.window)
        self._past = deque((float(x) for x in state.get("past", [])), maxlen=self.lag + 1)


@dataclass
class Episode:
    """Whether a condition is on; ``start`` is True only on the step it switches on, so a finding
    that should be said once per episode (an info note) is said once."""

    active: bool = False

    def update(self, on: bool) -> bool:
        start = on and not self.active
        self.active = on
        return start


TREND_KEEP = 32
"""Values since an incident kept for its trend (the incident closes unconfirmed after 50 steps)."""


@dataclass
class FollowUp:
    """The student's own level before an open incident, and the median of its values since.

    ``StepMetrics.open_incident`` is the step N of a teacher-attributed critical finding that
    nothing could act on. The level before it is the median of the last ``window`` values at
    steps ≤ N: at N = 0 that is the first value, the student before any update, and a step's
    metrics are taken before its own update, so even step N's value is the student before the
    incident trained it. :meth:`add` returns the median of the last ``window`` values after N
    (None until there are that many, and always None without an open incident). A new incident
    step starts over; :attr:`said` lets a check confirm each incident once.
    """

    window: int = 3
    keep: int = 16
    """Values kept to find the level before an incident opened a few steps ago."""
    incident: int | None = None
    baseline: float | None = None
    said: bool = False
    first: float | None = None
    """The first value of all: the level when nothing at or before the incident was kept."""
    trend_points: int = 4
    """Values since the incident before :meth:`trend_rise` answers."""
    _recent: deque[tuple[int, float]] = field(default_factory=deque)
    _trend: deque[tuple[int, float]] = field(default_factory=deque)
    """(step, value) since the incident: its last ``window`` are the median's, all the trend's."""

    def __post_init__(self) -> None:
        if self.window < 1:
            raise GuardValueError(f"window must be >= 1, got {self.window}")
        self._recent = deque(self._recent, maxlen=max(self.keep, self.window))
        self._trend = deque(self._trend, maxlen=max(TREND_KEEP, self.window))

    def add(
        self, step: int, value: float, incident: int | None, fallback: float | None = None
    ) -> float | None:
        """Record one finite value of ``step``; with an open ``incident``, the median of the
        last ``window`` values after it. ``fallback``: the level to use when no value at or
        before the incident was kept (default: the first value)."""
        if not math.isfinite(value):
            return None
        if self.first is None:
            self.first = value
        self._recent.append((step, value))
        if incident is None:
            self.incident, self.baseline, self.said = None, None, False
            self._trend.clear()
            return None
        if incident != self.incident:
            self.incident, self.said = incident, False
            before = [v for s, v in self._recent if s <= incident][-self.window :]
            self.baseline = (
                statistics.median(before)
                if before
                else (fallback if fallback is not None else self.first)
            )
            self._trend = deque(
                ((s, v) for s, v in self._recent if s > incident), self._trend.maxlen
            )
        elif step > incident:
            self._trend.append((step, value))
        if self.baseline is None or len(self._trend) < self.window:
            return None
        return statistics.median(v for _, v in list(self._trend)[-self.window :])

    def trend_rise(self, step: int) -> float | None:
        """The rise since the incident along the Theil–Sen slope of the values since it (the
        level before it counted as the incident step's value), up to ``step``; None before
        ``trend_points`` values. Steadier than a median of three against one level when the
        climb is slow and noisy: on a straight 0.42 → 3.49 over 190 steps with 0.01 nats of
        noise it confirms by step 5 in 99.7 % of draws, against 95 % for the median alone."""
        if self.baseline is None or self.incident is None or len(self._trend) < self.trend_points:
            return None
        points = [(self.incident, self.baseline), *self._trend]
        slopes = [
            (v2 - v1) / (s2 - s1)
            for i, (s1, v1) in enumerate(points)
            for s2, v2 in points[i + 1 :]
            if s2 != s1
        ]
        return statistics.median(slopes) * (step - self.incident) if slopes else None

    def finding(self, step: int, what: str, values: dict[str, Any]) -> Finding:
        """``student.follows_dead_teacher`` for this incident, said once."""
        self.said = True
        values = {**values, "baseline": self.baseline, "follow_up_window": self.window}
        return follows_dead_teacher(step, self.incident, what, values)

    def state_dict(self) -> dict[str, Any]:
        return {
            "incident": self.incident,
            "baseline": self.baseline,
            "said": self.said,
            "first": self.first,
            "recent": [[s, v] for s, v in self._recent],
            "trend": [[s, v] for s, v in self._trend],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.incident = loaded_number(state.get("incident"), "incident", int)
        self.baseline = loaded_number(state.get("baseline"), "baseline")
        self.said = bool(state.get("said", False))
        self.first = loaded_number(state.get("first"), "first")
        self._recent = deque(
            ((int(s), float(v)) for s, v in state.get("recent", [])), maxlen=self._recent.maxlen
        )
        self._trend = deque(
            ((int(s), float(v)) for s, v in state.get("trend", [])), maxlen=self._trend.maxlen
        )


def follows_dead_teacher(
    step: int, incident: int | None, what: str, values: dict[str, Any]
) -> Finding:
    """``student.follows_dead_teacher``: ``what`` says what was measured against which bound;
    the rest says what it confirms and what to do (the policy halts on it at once)."""
    return Finding(
        Code.STUDENT_FOLLOWS_DEAD_TEACHER,
        Severity.CRITICAL,
        f"{what} The teacher-attributed critical finding of step {incident} could not be acted "
        "on and is still open (no verified repair, no healthy teacher evidence since): the "
        "student now moves the way a dead teacher moves it, which confirms the incident. The "
        "guard halts the run (automatic). Relaunch the teacher with its weights' CPU backup "
        "(SGLang --enable-weights-cpu-backup), check that it scores sanely, and roll back to a "
        f"checkpoint from before step {incident}: every update since trained on it.",
        step,
        {**values, "open_incident": incident},
    )
