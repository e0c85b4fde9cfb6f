"""The rollout side's word on each step, for the trainer ranks that train it.

Relax's before-train-step hook gets no batch (``docs/relax.md`` §3): the trainer cannot see what
it is about to train on. The rollout side's gate judges every group before it is queued and posts
its verdict for ``rollout_id`` here; every trainer rank reads the same file before its first
update of that step. One JSON file per step, written atomically (temp file + rename) on a file
system all ranks share (next to the event file).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any


class Verdict(str, Enum):
    """What the trainer does with a step. Ordered: train < skip < halt."""

    TRAIN = "train"
    """Every sample the trainer will read has verified teacher values (dead ones were masked)."""
    SKIP = "skip"
    """No sample of the step has usable teacher values: take no optimizer step on it."""
    HALT = "halt"
    """The guard stops the run before this step: checkpoint on every rank, then stop."""

    @property
    def rank(self) -> int:
        return list(Verdict).index(self)


@dataclass
class StepVerdict:
    """The rollout side's tally of one step, updated as its groups pass the gate."""

    rollout_id: int
    verdict: Verdict = Verdict.TRAIN
    samples: int = 0
    """Samples that passed the gate."""
    dead: int = 0
    """Samples whose teacher values were dead (uniform, non-finite, or scored by a teacher that
    failed the step's canary) as scored."""
    masked: int = 0
    """Samples the gate kept out of every loss term."""
    rescored: int = 0
    """Dead samples re-scored by a repaired teacher and verified."""
    complete: bool = False
    """The rollout log hook ran: every group of the step has been through the gate."""
    reasons: list[str] = field(default_factory=list)
    """What the guard said (one line per decision that acted)."""

    def raise_to(self, verdict: Verdict, reason: str) -> None:
        if verdict.rank > self.verdict.rank:
            self.verdict = verdict
        if reason and reason not in self.reasons:
            self.reasons.append(reason)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "verdict": self.verdict.value}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepVerdict:
        return cls(**{**data, "verdict": Verdict(data["verdict"])})


class VerdictBoard:
    """``<dir>/rollout_<id>.json`` per step, plus ``gates.json``: which gates the rollout side
    runs (so the trainer can tell a guarded run from one whose gate Relax never loaded)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)

    def path(self, rollout_id: int) -> Path:
        return self.dir / f"rollout_{int(rollout_id)}.json"

    def post(self, verdict: StepVerdict) -> None:
        self._write(self.path(verdict.rollout_id), verdict.to_dict())

    def read(self, rollout_id: int) -> StepVerdict | None:
        data = self._read(self.path(rollout_id))
        return StepVerdict.from_dict(data) if data is not None else None

    def wait(self, rollout_id: int, timeout_s: float, poll_s: float = 0.2) -> StepVerdict | None:
        """The step's verdict once the rollout side completed it; the last seen (or None) when
        ``timeout_s`` passes first."""
        deadline = time.monotonic() + timeout_s
        while True:
            seen = self.read(rollout_id)
            if (seen is not None and seen.complete) or time.monotonic() >= deadline:
                return seen
            time.sleep(poll_s)

    def announce(self, gates: dict[str, Any]) -> None:
        self._write(self.dir / "gates.json", gates)

    def gates(self) -> dict[str, Any] | None:
        return self._read(self.dir / "gates.json")

    def _write(self, path: Path, data: dict[str, Any]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)

    @staticmethod
    def _read(path: Path) -> dict[str, Any] | None:
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            return None
