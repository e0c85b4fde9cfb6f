"""All-rank agreement: every rank takes the same decision at every guard hook.

:class:`DistributedReducer` is the ``reducer=`` of :class:`~distill_guard.guard.DistillGuard`.
Each call is one small all-reduce (MAX of the action's priority, with the lowest rank that holds
it and the step range packed in), then, only when some rank wants more than ``continue``, one
``broadcast_object_list`` of that rank's decision: any rank halting halts all, and every rank
logs the same reason. It runs on its own gloo group with its own timeout, so a rank that died or
hangs (a teacher call that never returns) becomes a halt on the others after ``timeout_s``, not a
hang until NCCL's 30-minute watchdog.

A rewake is carried out only by the ranks whose own checks asked for it (a healthy teacher is not
reloaded because another rank's died); a second reduction at the same hook, on every rank, then
shares the outcome: a repair that failed anywhere halts all, a repair elsewhere reaches each rank
with the repairing rank's message and incident notice (rank 0 alerts once per incident).

Limits:

- **Every hook is a collective.** With a reducer set, every rank must call the guard's hooks the
  same number of times in the same order (the adapters do: one ``on_teacher_scores`` and one
  ``on_step_metrics`` per optimizer step). A rank that skips a call desynchronises the group; the
  step range carried in the all-reduce turns that into a halt instead of a silent mismatch.
- **The timeout is per collective**, not per step: a rank may take up to ``timeout_s`` longer
  than the others to reach each hook. Set it above your slowest legitimate teacher call.
- **After a timeout or a dead peer the group is spent.** Gloo closes the pairs; the reducer marks
  itself broken and answers every later call with the same halt, without communicating. The run
  must stop (which it does: the answer is a halt).
- The group is created with ``torch.distributed.new_group``, itself a collective: ``setup()`` must
  run on every rank at the same point (the adapters call it from their setup hook; otherwise the
  first reduction does it).
- Gloo moves the few bytes over TCP on the CPU; it works under an NCCL default group too.
"""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from distill_guard.findings import Code, Finding, Severity
from distill_guard.policy import Action, Decision

if TYPE_CHECKING:  # the guard imports this module's reducer type only by protocol
    from distill_guard.guard import DistillGuard

log = logging.getLogger("distill_guard")

CONSENSUS_FAILED = Code.CONSENSUS_FAILED
"""Finding code: the ranks could not agree (a peer timed out, died, or is at another step)."""

_NO_STEP = -1


def dist_ready() -> bool:
    """True inside an initialised ``torch.distributed`` job of more than one process."""
    return (
        torch.distributed.is_available()
        and torch.distributed.is_initialized()
        and torch.distributed.get_world_size() > 1
    )


@dataclass
class DistributedReducer:
    """Reduce one rank's :class:`Decision` over all ranks: the most severe one wins.

    Call it with the local decision; every rank gets back the decision of the lowest rank that
    holds the most severe action (its reasons and message, prefixed ``rank r:``; the local step).
    Outside a multi-process job it returns the decision unchanged.
    """

    timeout_s: float = 60.0
    """Longest wait for the other ranks at one hook before halting; also the gloo group timeout."""
    group: Any = None
    """A process group to use instead of a fresh gloo group (its own timeout then applies)."""
    _own_group: Any = field(default=None, init=False, repr=False)
    _ready: bool = field(default=False, init=False, repr=False)
    broken: str | None = field(default=None, init=False)
    """Why the group can no longer be used, once a collective failed; None while healthy."""

    def setup(self) -> None:
        """Create the gloo group (a collective: call on every rank). Idempotent; no-op alone."""
        if self._ready or not dist_ready():
            return
        if self.group is None:
            self._own_group = torch.distributed.new_group(
                backend="gloo", timeout=datetime.timedelta(seconds=self.timeout_s)
            )
        self._ready = True

    @property
    def process_group(self) -> Any:
        return self.group if self.group is not None else self._own_group

    def __call__(self, decision: Decision) -> Decision:
        if not dist_ready():
            return decision
        if self.broken is not None:
            return self._halt(decision, self.broken)
        self.setup()
        dist = torch.distributed
        group = self.process_group
        rank = dist.get_rank()
        world = dist.get_world_size()
        step = _NO_STEP if decision.step is None else int(decision.step)
        # one all-reduce carries: priority with the lowest holding rank, max step, -min step
        key = decision.priority * world + (world - 1 - rank)
        packed = torch.tensor([key, step, -step], dtype=torch.int64)
        try:
            dist.all_reduce(packed, op=dist.ReduceOp.MAX, group=group)
        except Exception as exc:  # noqa: BLE001 - a peer timed out or died
            return self._fail(
                decision, f"no answer from the other ranks within {self.timeout_s:g} s", exc
            )
        top_key, max_step, min_step = (int(v) for v in packed.tolist())
        min_step = -min_step
        if max_step != min_step:
            return self._fail(
                decision,
                f"ranks are at different guard steps ({min_step}..{max_step}): the guard's hooks "
                "were not called the same number of times on every rank",
            )
        top, holder = divmod(top_key, world)
        holder = world - 1 - holder
        if top == 0:  # everyone continues: nothing to broadcast
            return decision
        payload = [_encode(decision) if rank == holder else None]
        try:
            dist.broadcast_object_list(payload, src=holder, group=group)
        except Exception as exc:  # noqa: BLE001
            return self._fail(decision, f"rank {holder}'s decision did not arrive", exc)
        if rank == holder:
            return decision
        return _decode(payload[0], decision.step, holder)

    # ------------------------------------------------------------------ failure

    def _fail(self, decision: Decision, why: str, exc: Exception | None = None) -> Decision:
        detail = f" ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})" if exc else ""
        self.broken = f"{why} at step {decision.step}{detail}"
        log.error("distill_guard: %s; halting this rank", self.broken)
        return self._halt(decision, self.broken)

    def _halt(self, decision: Decision, why: str) -> Decision:
        finding = Finding(
            CONSENSUS_FAILED,
            Severity.CRITICAL,
            f"The ranks could not agree on the guard's decision: {why}. A rank that carried on "
            "alone would wait forever at its next collective, so every rank halts. Look for a "
            "crashed or stuck rank (its teacher calls, its data loader) in the logs.",
            decision.step,
            {"reason": why},
        )
        return Decision(
            decision.step,
            Action.HALT,
            (*decision.reasons, finding),
            message=f"halt: ranks could not agree ({why})",
        )


def _encode(decision: Decision) -> dict[str, Any]:
    return {
        "action": decision.action.value,
        "intended": decision.intended.value if decision.intended is not None else None,
        "message": decision.message,
        "notify": decision.notify,
        "reasons": [f.to_dict() for f in decision.reasons],
    }


def _decode(payload: dict[str, Any], step: int | None, holder: int) -> Decision:
    intended = payload.get("intended")
    return Decision(
        step,
        Action(payload["action"]),
        tuple(Finding.from_dict(f) for f in payload.get("reasons", [])),
        intended=Action(intended) if intended is not None else None,
        message=f"rank {holder}: {payload.get('message', '')}",
        notify=bool(payload.get("notify", True)),
    )


def attach(guard: DistillGuard, *, timeout_s: float = 60.0) -> bool:
    """Give ``guard`` a :class:`DistributedReducer` and its rank, inside a multi-process job.

    Adapters call this from their setup hook on every rank. Leaves a reducer the user set alone.
    Ranks above 0 write their events next to rank 0's file, as ``<stem>.rank<r><suffix>``.
    Returns True when the guard now reduces over ranks.
    """
    if not dist_ready():
        return False
    guard.set_rank(torch.distributed.get_rank())
    if guard.reducer is None:
        guard.reducer = DistributedReducer(timeout_s=timeout_s)
    setup = getattr(guard.reducer, "setup", None)
    if callable(setup):
        setup()
    return True
