"""Robust statistics the metric checks share: a frozen warm-up reference and a rolling median.

One step of any size cannot move the median of five, so no metric check warns on an isolated
outlier (a hard batch, an entropy blip); a sustained shift moves the median within
``window // 2 + 1`` steps. The reference is the warm-up's median with a MAD-based σ, so a spike
inside the warm-up does not inflate it either.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from distill_guard.errors import GuardValueError

MAD_TO_SIGMA = 1.4826
"""σ of a normal distribution per unit of median absolute deviation."""


@dataclass
class Reference:
    """Median and robust σ of the first ``size`` finite values, frozen once taken.

    Frozen on purpose: a running reference would chase the drift it should detect.
    """

    size: int
    min_sigma_rel: float = 0.0
    min_sigma_abs: float = 0.0
    median: float | None = None
    sigma: float | None = None
    _pending: list[float] = field(default_factory=list)

    @property
    def ready(self) -> bool:
        return self.median is not None

    def add(self, value: float) -> None:
        """Count one finite value toward the warm-up; no effect once frozen."""
        if self.ready:
            return
        self._pending.append(value)
        if len(self._pending) >= self.size:
            med = statistics.median(self._pending)
            mad = statistics.median(abs(x - med) for x in self._pending)
            self.median = med
            self.sigma = max(
                MAD_TO_SIGMA * mad, self.min_sigma_rel * abs(med), self.min_sigma_abs, 1e-12
            )
            self._pending = []

    def state_dict(self) -> dict[str, Any]:
        return {"median": self.median, "sigma": self.sigma, "pending": list(self._pending)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.median = state.get("median")
        self.sigma = state.get("sigma")
        self._pending = [float(x) for x in state.get("pending", [])]


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
