"""The gate before the optimizer: every trainer rank learns the rollout side's verdict for the step.

Relax calls ``--custom-megatron-before-train-step-hook-path`` on every trainer rank, in
``train_one_step`` after ``zero_grad`` and before the forward and backward, with
``(args, rollout_id, step_id, model, optimizer, opt_param_scheduler)`` and no batch; its
``optimizer.step()`` that follows is unconditional (``docs/relax.md`` §3). So the hook reads the
verdict the rollout side posted for ``rollout_id`` on the run's verdict channel
(:mod:`.verdicts`: a Ray actor, or a shared directory), the ranks agree on it, and

- ``train``: nothing to do (dead samples were already masked before the queue);
- ``skip``: this update is not taken: the optimizer's next ``step()`` only zeroes the gradients
  and reports success (Megatron's ``(update_successful, grad_norm, num_zeros)``), and the
  learning-rate schedule does not advance; zero gradients alone would still move Adam's weights;
- ``halt``: every rank saves a checkpoint through Relax's own ``save_model`` (:func:`relax_save`),
  the reason goes to the event file, and every rank raises :class:`GuardHalt` at the same step.
  The rollout service is not crashed.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
from collections.abc import Callable
from typing import Any

import torch

from distill_guard.consensus import dist_ready
from distill_guard.events import EventLog
from distill_guard.findings import Code, Finding, Severity
from distill_guard.integrations.relax.errors import GuardHalt
from distill_guard.integrations.relax.verdicts import (
    Reading,
    Verdict,
    VerdictChannel,
    verdict_channel,
)

log = logging.getLogger("distill_guard")

TEACHER_APART = {
    "in_checkpoint": False,
    "modules": [],
    "tensors": 0,
    "why": "Relax's save writes the trainer's model, optimizer and scheduler; the teacher is the "
    "SGLang server, which loads its own checkpoint (--teacher-hf-checkpoint) when the run is "
    "launched again",
}
"""What Relax's halt checkpoint holds of the teacher (the ``checkpoint`` event's
``teacher_left_out``, as the trainer callbacks write it)."""

SaveFunction = Callable[[Any, int, Any, Any, Any], Any]
"""``save(args, rollout_id, model, optimizer, opt_param_scheduler)``; what it returns (a
string: which save ran) goes to the ``checkpoint`` event."""


def relax_save(args: Any, rollout_id: int, model: Any, optimizer: Any, scheduler: Any) -> str:
    """Relax's own checkpoint, the way its train loop takes one: the train actor's
    ``save_model(rollout_id, force_sync=True)`` (finalize an async save, rotate checkpoints on
    rank 0, barrier, ``save``, ``save_hf``; ``docs/relax.md`` §3.4), a collective every trainer
    rank calls. The hook is handed no actor: it is the ``self`` of the frame that called
    ``train`` (``MegatronTrainRayActor.train``). Where none is in reach, Megatron's ``save``
    alone (``relax.backends.megatron.model.save``). Returns which one ran."""
    actor = train_actor()
    if actor is not None:
        actor.save_model(rollout_id, force_sync=True)
        return f"{type(actor).__name__}.save_model"
    from relax.backends.megatron.model import save

    save(rollout_id, model, optimizer, scheduler)
    return (
        "relax.backends.megatron.model.save (no train actor with save_model was in reach: "
        "checkpoint rotation, the async-save finalize and save_hf were not run)"
    )


def train_actor() -> Any:
    """The object whose method is running this training step and that has Relax's
    ``save_model``: the nearest ``self`` up the call stack with ``save_model`` and ``args``."""
    frame = inspect.currentframe()
    try:
        while frame is not None:
            owner = frame.f_locals.get("self")
            if callable(getattr(owner, "save_model", None)) and hasattr(owner, "args"):
                return owner
            frame = frame.f_back
    finally:
        del frame
    return None


def load_function(path: str) -> Callable[..., Any]:
    """``module.attr`` or ``module:attr``, as Relax's ``load_function`` reads a path."""
    module, _, name = path.replace(":", ".").rpartition(".")
    return getattr(__import__(module, fromlist=[name]), name)


class TrainerGate:
    """The verdict reader on one trainer rank."""

    def __init__(
        self,
        board: VerdictChannel,
        events: EventLog,
        *,
        save: SaveFunction = relax_save,
        wait_s: float = 600.0,
    ) -> None:
        self.board = board
        self.events = events
        self.save = save
        self.wait_s = wait_s
        """How long the first update of a step waits for the rollout side's verdict."""
        self.decided: dict[int, Verdict] = {}
        self.announced: Any = None
        """The rollout side's announcement, once read."""
        self._group: Any = None

    @classmethod
    def from_env(cls) -> TrainerGate:
        """From ``DISTILL_GUARD_EVENTS`` (this rank's event file; without Ray the verdicts are
        read from ``<stem>.verdicts/`` beside it), ``DISTILL_GUARD_RUN_ID``,
        ``DISTILL_GUARD_VERDICT_CHANNEL``, ``DISTILL_GUARD_SAVE_FUNCTION`` and
        ``DISTILL_GUARD_VERDICT_WAIT_S``."""
        events = os.environ.get("DISTILL_GUARD_EVENTS")
        channel = verdict_channel(events)
        if channel is None:
            raise GuardHalt(
                "distill_guard's before-train-step hook has no DISTILL_GUARD_EVENTS and runs "
                "without Ray: it cannot find the rollout side's verdicts. Set it on the driver "
                "and list it in RELAX_PROPAGATE_ENV_VARS so it reaches the trainer actors."
            )
        rank = torch.distributed.get_rank() if dist_ready() else 0
        log_ = EventLog(events)
        log_.set_rank(rank)
        save_path = os.environ.get("DISTILL_GUARD_SAVE_FUNCTION")
        return cls(
            channel,
            log_,
            save=load_function(save_path) if save_path else relax_save,
            wait_s=float(os.environ.get("DISTILL_GUARD_VERDICT_WAIT_S", "600")),
        )

    def before_step(
        self, args: Any, rollout_id: int, model: Any, optimizer: Any, scheduler: Any
    ) -> Verdict:
        """Decide the update of ``rollout_id``'s next optimizer step, the same on every rank."""
        verdict = self.decided.get(rollout_id)
        if verdict is None:
            verdict, why = self._read(rollout_id)
            verdict = self._agree(verdict)
            self.decided[rollout_id] = verdict
            self.events.write("verdict", step=rollout_id, verdict=verdict.value, reason=why)
            if verdict is Verdict.HALT:
                self._halt(args, rollout_id, model, optimizer, scheduler, why)
        if verdict is Verdict.SKIP:
            skip_next_update(optimizer, scheduler)
            self.events.write("update_skipped", step=rollout_id)
        return verdict

    def _read(self, rollout_id: int) -> tuple[Verdict, str]:
        if self.announced is None:
            got = self.board.announcement()
            if got.value is None:
                self._problem(rollout_id, got, "the rollout side's announcement")
                return Verdict.HALT, (
                    f"no rollout-side gate announced itself on {got.where}"
                    + (f" ({got.problem})" if got.problem else "")
                    + ": the dynamic sampling filter "
                    "(distill_guard.integrations.relax.dynamic_sampling_filter) is not loaded in "
                    "this run, so nothing keeps a dead teacher's values out of the trainer's data"
                )
            self.announced = got.value
        seen = self.board.wait(rollout_id, self.wait_s)
        what = f"the verdict of rollout {rollout_id}"
        for earlier in seen.passed_over:
            self._problem(
                rollout_id, dataclasses.replace(seen, problem=earlier), what, Severity.WARN
            )
        if seen.problem:
            self._problem(rollout_id, seen, what)
        if seen.value is None or not seen.value.complete:
            return Verdict.HALT, (
                f"no complete verdict for rollout {rollout_id} on {seen.where} after "
                f"{self.wait_s:g} s"
                + (f" (what is there is {seen.problem})" if seen.problem else "")
                + ": the rollout side did not finish judging the step this rank is about to train"
            )
        verdict = seen.value
        reason = "; ".join(verdict.reasons) or f"{verdict.samples} samples, none dead"
        return verdict.verdict, reason

    def _problem(
        self, rollout_id: int, got: Reading, what: str, severity: Severity = Severity.CRITICAL
    ) -> None:
        """A verdict channel that gave something unusable: a finding naming where and why."""
        if not got.problem:
            return
        outcome = (
            "It was passed over: this rank followed the run's own verdict that came after it."
            if severity is Severity.WARN
            else "It is not followed: this rank waits for this run's own verdict and halts "
            "without one."
        )
        finding = Finding(
            Code.RELAX_VERDICT_UNUSABLE,
            severity,
            f"{what} on {got.where} is {got.problem}. {outcome} Give each run its own "
            "DISTILL_GUARD_EVENTS (or DISTILL_GUARD_RUN_ID), and let only distill_guard write "
            "the verdicts.",
            step=rollout_id,
            values={"where": got.where, "problem": got.problem},
        )
        log.error("distill_guard: %s", finding.message)
        self.events.write("finding", stage="before_train_step", **finding.to_dict())

    def _agree(self, verdict: Verdict) -> Verdict:
        """Every rank takes the most severe verdict any rank read (a lagging file system view
        must not make one rank train while another skips)."""
        if not dist_ready():
            return verdict
        if self._group is None:
            self._group = torch.distributed.new_group(backend="gloo")
        flag = torch.tensor([verdict.rank])
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, group=self._group)
        return list(Verdict)[int(flag.item())]

    def _halt(
        self, args: Any, rollout_id: int, model: Any, optimizer: Any, scheduler: Any, why: str
    ) -> None:
        try:
            via = self.save(args, rollout_id, model, optimizer, scheduler)
        except Exception as exc:  # noqa: BLE001 - halt anyway, and say the checkpoint failed
            log.exception("distill_guard: the halt checkpoint failed")
            self.events.write(
                "checkpoint_failed", step=rollout_id, error=f"{type(exc).__name__}: {exc}"
            )
        else:
            self.events.write(
                "checkpoint",
                step=rollout_id,
                via=via if isinstance(via, str) else None,
                teacher_left_out=TEACHER_APART,
            )
        message = f"distill_guard halted the run before training rollout {rollout_id}: {why}"
        self.events.write("halt", step=rollout_id, stage="before_train_step", message=message)
        self.events.close()
        raise GuardHalt(message)


def skip_next_update(optimizer: Any, scheduler: Any) -> None:
    """Make the optimizer's next ``step()`` zero the gradients and take no update, and the
    scheduler's next ``step()`` a no-op; both restore themselves after that call."""

    def once(obj: Any, name: str, replacement: Callable[..., Any]) -> None:
        def call(*args: Any, **kwargs: Any) -> Any:
            delattr(obj, name)  # the class's own method again
            return replacement(*args, **kwargs)

        setattr(obj, name, call)

    def no_update(*args: Any, **kwargs: Any) -> tuple[bool, float, int]:
        optimizer.zero_grad()
        return True, 0.0, 0

    once(optimizer, "step", no_update)
    if scheduler is not None and hasattr(scheduler, "step"):
        once(scheduler, "step", lambda *a, **k: None)
