"""Wake receipts: which replica, and which of its wakes, scored a sample; and the gate that lets
through to the optimizer only samples whose wake is known healthy.

A replica serves, between two checks, the weights one wake (or one verified repair) gave it. A
:class:`WakeReceipt` names that: the replica, the fleet's wake number, and the repair within it.
The :class:`WakeLedger` holds each one's verdict (``pending`` until its check ends, ``healthy``,
``failed``), and a verdict can change after samples were scored: a check that comes later (a
canary after the step's scoring, :meth:`~distill_guard.live.replicas.ReplicatedTeacher.recheck`)
finds the wake failed, and every sample it scored is refused from then on. :func:`gate` is the
pure decision, made with the verdicts as they are when the optimizer is about to step::

    healthy ─► admit       failed ─► refuse       pending, or unknown to the ledger ─► hold

A held sample is neither used nor dropped: the gate admits nothing it cannot vouch for and
refuses nothing it cannot show failed.

Behind a router the replica is not known: ``sglang-router`` 0.3.2 sends the worker's answer back
as it came and names the worker nowhere in it (``docs/sglang-contract.md`` §8, R8). A sample
scored through the router gets a receipt with ``replica=None`` and every replica the router
could have sent it to (the serving ones when it was scored); it is refused when any of them is
found failed, so a late failure costs the routed samples of that wake on every replica. To lose
only the broken replica's samples, score through the replicas directly
(:meth:`~distill_guard.live.replicas.ReplicatedTeacher.score`, the guard's own round robin).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

WakeKey = tuple[str, int, int]
"""``(replica url, wake, repair)``: one stretch of a replica's serving, one verdict."""


class Verdict(str, enum.Enum):
    """What is known of the weights a replica served a sample with."""

    PENDING = "pending"
    """Its check has not ended: not yet vouched for."""
    HEALTHY = "healthy"
    """It passed its check (against the checkpoint's reference) and no later check failed."""
    FAILED = "failed"
    """A check failed, at its wake or later: what it scored must not train the student."""


def worst(verdicts: Iterable[Verdict]) -> Verdict:
    """Failed over pending over healthy (healthy for none)."""
    seen = set(verdicts)
    for v in (Verdict.FAILED, Verdict.PENDING):
        if v in seen:
            return v
    return Verdict.HEALTHY


@dataclass(frozen=True)
class WakeReceipt:
    """Which replica and which of its wakes scored a sample, and that wake's verdict when the
    receipt was handed out (the gate reads the verdict as it is now, from the ledger)."""

    replica: str | None
    """The replica's direct address; None: scored through the router, which does not say
    which replica served (then :attr:`candidates` names those it could have been)."""
    wake: int
    """The fleet's wake number (1 for the run's first wake)."""
    verdict: Verdict = Verdict.PENDING
    repair: int = 0
    """0: the weights as woken; n: as the wake's n-th verified repair reloaded them."""
    candidates: tuple[WakeKey, ...] = ()
    """Through the router: the replica wakes that could have scored it."""

    @property
    def keys(self) -> tuple[WakeKey, ...]:
        """The wakes the sample's verdict depends on."""
        if self.replica is not None:
            return ((self.replica, self.wake, self.repair),)
        return self.candidates

    def to_dict(self) -> dict[str, Any]:
        return {
            "replica": self.replica,
            "wake": self.wake,
            "repair": self.repair,
            "verdict": self.verdict.value,
            "candidates": [list(k) for k in self.candidates],
        }


def current(receipt: WakeReceipt, verdicts: Mapping[WakeKey, Verdict]) -> Verdict:
    """The receipt's verdict now: the worst of its wakes' (one the ledger does not know is
    pending: nothing vouches for it). A routed receipt with no candidate is pending too."""
    if not receipt.keys:
        return Verdict.PENDING
    return worst(verdicts.get(k, Verdict.PENDING) for k in receipt.keys)


@dataclass(frozen=True)
class GateResult:
    """Indices into the receipts given to :func:`gate`."""

    admit: tuple[int, ...]
    """May reach the optimizer."""
    refuse: tuple[int, ...]
    """Scored by a failed wake: never to be used."""
    hold: tuple[int, ...]
    """Not yet vouched for: keep them back and ask again once their wake's check ended."""

    def to_dict(self) -> dict[str, list[int]]:
        return {"admit": list(self.admit), "refuse": list(self.refuse), "hold": list(self.hold)}


def gate(receipts: Sequence[WakeReceipt], verdicts: Mapping[WakeKey, Verdict]) -> GateResult:
    """Which of the samples (by their receipts) may reach the optimizer, with the verdicts as
    they are now: a wake found failed after it scored refuses its samples, a pending one holds
    them, a healthy one's are admitted, every one."""
    out: dict[Verdict, list[int]] = {v: [] for v in Verdict}
    for i, r in enumerate(receipts):
        out[current(r, verdicts)].append(i)
    return GateResult(
        tuple(out[Verdict.HEALTHY]), tuple(out[Verdict.FAILED]), tuple(out[Verdict.PENDING])
    )


class WakeLedger:
    """The verdict of each replica wake, kept for the last ``keep_wakes`` fleet wakes (older
    receipts are unknown to it, so held: a sample should not wait that long for its update)."""

    def __init__(self, keep_wakes: int = 16) -> None:
        self.keep_wakes = keep_wakes
        self._verdicts: dict[WakeKey, Verdict] = {}

    @property
    def verdicts(self) -> Mapping[WakeKey, Verdict]:
        return dict(self._verdicts)

    def open(self, key: WakeKey) -> None:
        """A wake whose check has begun: pending."""
        self._verdicts[key] = Verdict.PENDING
        oldest = key[1] - self.keep_wakes
        for k in [k for k in self._verdicts if k[1] <= oldest]:
            del self._verdicts[k]

    def settle(self, key: WakeKey, verdict: Verdict) -> None:
        """Its check ended; a failed one stays failed (a later check cannot vouch for samples a
        failed one scored)."""
        if self._verdicts.get(key) is not Verdict.FAILED:
            self._verdicts[key] = verdict

    def get(self, key: WakeKey) -> Verdict:
        return self._verdicts.get(key, Verdict.PENDING)

    def state_dict(self) -> dict[str, Any]:
        return {
            "keep_wakes": self.keep_wakes,
            "verdicts": [[*k, v.value] for k, v in self._verdicts.items()],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.keep_wakes = int(state.get("keep_wakes", self.keep_wakes))
        self._verdicts = {
            (str(u), int(w), int(r)): Verdict(v) for u, w, r, v in state.get("verdicts", [])
        }
