"""What the guard has seen over a run, in constant memory, and why it halted."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from distill_guard.findings import Finding, Severity
from distill_guard.policy import Halt

VERDICT_TRAIN, VERDICT_SKIP, VERDICT_HALT = 0, 1, 2
"""``guard/verdict`` values: the step's update was applied, dropped, or the run halted (the
ranks of the Relax integration's ``Verdict``, so one dashboard reads every integration)."""

GUARD_METRICS: dict[str, str] = {
    "guard/findings": "findings at warn or above so far in the run",
    "guard/skipped_updates": "optimizer updates the guard dropped so far",
    "guard/repairs": "verified repairs of the teacher so far",
    "guard/halted": "1 once the guard has halted the run, else 0",
    "guard/verdict": "this step: 0 update applied, 1 update dropped, 2 halted",
}
"""The ``guard/*`` metrics every integration logs (:meth:`GuardSummary.metrics`). Totals, not
per-step counts, so a run logged every N steps loses nothing; the names are the Relax
integration's where it has them."""


class GuardSummary:
    """What the guard has seen so far, in constant memory: first step and count per code, the
    findings at warn or above, the dropped updates, and the halt."""

    def __init__(self) -> None:
        self.first: dict[str, int | None] = {}
        self.count: dict[str, int] = {}
        self.warn_findings = 0
        self.skipped_updates = 0
        self.halt: Halt | None = None

    def add_finding(self, f: Finding) -> None:
        self.first.setdefault(f.code, f.step)
        self.count[f.code] = self.count.get(f.code, 0) + 1
        if Severity(f.severity) >= Severity.WARN:
            self.warn_findings += 1

    def add_skipped_update(self) -> None:
        """An adapter dropped an optimizer update on the guard's decision."""
        self.skipped_updates += 1

    def metrics(self, *, repairs: int = 0, verdict: int = VERDICT_TRAIN) -> dict[str, float]:
        """The step's :data:`GUARD_METRICS`, for the trainer's own logger. ``verdict`` is the
        adapter's for this step; a halted guard reports :data:`VERDICT_HALT` whatever it is."""
        halted = self.halt is not None
        return {
            "guard/findings": float(self.warn_findings),
            "guard/skipped_updates": float(self.skipped_updates),
            "guard/repairs": float(repairs),
            "guard/halted": float(halted),
            "guard/verdict": float(VERDICT_HALT if halted else verdict),
        }

    def state_dict(self) -> dict[str, Any]:
        # copies: a saved state is a snapshot, not a view of live counters
        return {
            "first": dict(self.first),
            "count": dict(self.count),
            "warn_findings": self.warn_findings,
            "skipped_updates": self.skipped_updates,
            "halt": self.halt.to_dict() if self.halt else None,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.first = copy.deepcopy(dict(state.get("first", {})))
        self.count = copy.deepcopy(dict(state.get("count", {})))
        self.warn_findings = int(state.get("warn_findings", 0))
        self.skipped_updates = int(state.get("skipped_updates", 0))
        halt = state.get("halt")
        self.halt = Halt.from_dict(halt) if halt else None
