"""What the guard has seen over a run, in constant memory, and why it halted."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from distill_guard.findings import Finding
from distill_guard.policy import Halt


class GuardSummary:
    """What the guard has seen so far, in constant memory: first step and count per code."""

    def __init__(self) -> None:
        self.first: dict[str, int | None] = {}
        self.count: dict[str, int] = {}
        self.halt: Halt | None = None

    def add_finding(self, f: Finding) -> None:
        self.first.setdefault(f.code, f.step)
        self.count[f.code] = self.count.get(f.code, 0) + 1

    def state_dict(self) -> dict[str, Any]:
        # copies: a saved state is a snapshot, not a view of live counters
        return {
            "first": dict(self.first),
            "count": dict(self.count),
            "halt": self.halt.to_dict() if self.halt else None,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.first = copy.deepcopy(dict(state.get("first", {})))
        self.count = copy.deepcopy(dict(state.get("count", {})))
        halt = state.get("halt")
        self.halt = Halt.from_dict(halt) if halt else None
