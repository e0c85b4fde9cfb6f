"""Incidents: a teacher that loses its weights at every wake is one incident with a repair count.

Without this, a colocated teacher launched without its weights backup would raise one alert per
step for the whole run; with it, the first repair alerts (with the configuration fix) and the
rest are counted until a wake passes the canary unaided.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from distill_guard.findings import Code, Finding, Severity
from distill_guard.live.repair import CONFIG_FIX, RepairOutcome

KEEP_CLOSED = 16
"""Finished incidents kept one by one; the rest are counted."""


@dataclass
class WeightLossIncident:
    """A stretch of wakes that each lost the weights, from the first until a clean wake."""

    first_step: int | None
    last_step: int | None
    repairs: int = 0
    """Successful rewakes during the incident."""
    failures: int = 0
    """Rewakes that gave up."""


@dataclass
class IncidentTracker:
    """Turns "lost the weights at every wake" into one incident with a repair count, not N alerts.

    Call :meth:`on_repair` after each rewake and :meth:`on_clean_wake` when a wake passed the
    canary unaided. The first repair of an incident returns one alert finding with the
    configuration fix; later repairs return nothing and only count. A failed repair always
    returns its finding: it is not a repeat of a handled problem.
    """

    config_fix: str = CONFIG_FIX
    """The fix to name in the alert (preflight findings can supply a more precise one)."""
    current: WeightLossIncident | None = None
    closed: list[WeightLossIncident] = field(default_factory=list)
    """The last :data:`KEEP_CLOSED` finished incidents (older ones live on in the counts and
    the event file), so memory and every checkpoint stay flat over a long run."""
    closed_count: int = 0
    """Finished incidents over the run."""
    closed_repairs: int = 0
    """Repairs of the finished incidents over the run."""

    @property
    def total_repairs(self) -> int:
        return self.closed_repairs + (self.current.repairs if self.current else 0)

    def on_repair(
        self, outcome: RepairOutcome, *, step: int | None = None, cause: list[Finding] | None = None
    ) -> Finding | None:
        """Record a rewake; the finding to alert on, or None when this incident already alerted."""
        first = self.current is None
        if self.current is None:
            self.current = WeightLossIncident(first_step=step, last_step=step)
        inc = self.current
        inc.last_step = step
        if not outcome.ok:
            inc.failures += 1
            return outcome.findings[0]
        inc.repairs += 1
        if not first:
            return None
        codes = sorted({f.code for f in cause or []})
        return Finding(
            Code.TEACHER_REPAIRED,
            Severity.WARN,
            f"The teacher lost its weights on wake at step {step} ({', '.join(codes) or 'canary'})"
            f" and was repaired by rewake in {outcome.seconds:.2f} s. This repeats at every wake "
            f"until the configuration is fixed; further repairs are counted, not alerted. "
            f"{self.config_fix}",
            step,
            {"incident_first_step": inc.first_step, "repairs": inc.repairs, "cause_codes": codes},
        )

    def on_clean_wake(self, step: int | None = None) -> None:
        """A wake passed the canary without repair: the incident, if any, is over."""
        if self.current is not None:
            self._close(self.current)
            self.current = None

    def _close(self, incident: WeightLossIncident) -> None:
        self.closed_count += 1
        self.closed_repairs += incident.repairs
        self.closed = [*self.closed, incident][-KEEP_CLOSED:]

    def state_dict(self) -> dict[str, Any]:
        def enc(i: WeightLossIncident) -> dict[str, Any]:
            return {
                "first_step": i.first_step,
                "last_step": i.last_step,
                "repairs": i.repairs,
                "failures": i.failures,
            }

        return {
            "current": enc(self.current) if self.current else None,
            "closed": [enc(i) for i in self.closed],
            "closed_count": self.closed_count,
            "closed_repairs": self.closed_repairs,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """States from before the counts (every closed incident listed) load into them."""
        cur = state.get("current")
        self.current = WeightLossIncident(**cur) if cur else None
        self.closed, self.closed_count, self.closed_repairs = [], 0, 0
        for incident in state.get("closed", []):
            self._close(WeightLossIncident(**incident))
        listed = self.closed_count
        self.closed_count = max(listed, int(state.get("closed_count", listed)))
        self.closed_repairs = max(self.closed_repairs, int(state.get("closed_repairs", 0)))
