"""Lightning: a ``Callback`` that judges each step before the optimizer moves, and halts all ranks.

- ``on_before_optimizer_step``: the teacher scores of the step (from a forward hook on the
  module's ``teacher`` attribute, or handed over with :meth:`DistillGuardCallback.observe_teacher_logits`)
  are judged; a step that trained on a dead teacher gets its gradients dropped, so the optimizer
  does not move.
- ``on_train_batch_end``: the step's logged metrics (``self.log(..., on_step=True)``) are judged,
  and the guard's own ``guard/*`` metrics logged (``pl_module.log_dict``, to every logger);
  on a halt every rank saves the checkpoint (``trainer.save_checkpoint``, a collective) and sets
  ``trainer.should_stop``. The decision is already the same on every rank: the guard's reducer
  (:mod:`distill_guard.consensus`, attached in ``setup``) agreed on it.
- A checkpoint saved once the guard halted leaves the teacher's weights out (they are what the
  guard found broken, not the run's) and says so (``teacher_left_out`` in the callback's state
  and the ``checkpoint`` event). Resumed from it (``trainer.fit(module, ckpt_path=...)``), the
  teacher keeps the weights the resumed run built it with (``teacher_kept`` event), and the
  guard's state is loaded without its halt (``halt_lifted``); the state's references still
  catch a teacher that is not fixed at the first resumed step.

With :func:`~distill_guard.losses.distill_loss` as the loss, ``training_step`` hands its output
to the callback (``find_guard_callback(self.trainer).observe_distill_loss(out)``) and the callback
is built with ``fused_loss=True``: the teacher then gets only the canary, no hook reading its
logits a second time.

Limits: manual optimisation never calls ``on_before_optimizer_step`` (call
:meth:`StepGuard.before_update <distill_guard.integrations.plain.StepGuard.before_update>` in your
``training_step``); Lightning keeps training past ``should_stop`` until ``min_steps``/``min_epochs``
are met, and every update is then skipped.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch

from distill_guard.extras import needed

with needed("the Lightning callback (distill_guard.integrations.lightning)", "lightning"):
    import lightning.pytorch as pl

from distill_guard.config import GuardSpec  # noqa: E402
from distill_guard.consensus import attach
from distill_guard.integrations.callback import GuardedCallback, leave_teacher_out
from distill_guard.metric_names import LIGHTNING_METRIC_NAMES
from distill_guard.observations import Metric

log = logging.getLogger("distill_guard")

KEPT_WHY = (
    "the checkpoint holds none of the teacher's weights: the teacher keeps the weights this run "
    "built it with"
)


class DistillGuardCallback(GuardedCallback, pl.Callback):
    """Runs a :class:`~distill_guard.guard.DistillGuard` inside a Lightning ``Trainer``.

    Takes :class:`~distill_guard.integrations.plain.GuardedCallback`'s arguments (metric names
    :data:`~distill_guard.metric_names.LIGHTNING_METRIC_NAMES` by default), and:

    Args:
        teacher_attr: attribute of the LightningModule holding the teacher ``nn.Module``; its
            forwards during training steps are observed. None: hand logits over yourself.
        dirpath: where the halt checkpoint goes; ``<default_root_dir>/checkpoints`` if None.
        fused_loss: ``training_step`` hands :func:`~distill_guard.losses.distill_loss`'s output
            to :meth:`observe_distill_loss`; the teacher is then checked on the canary only, its
            forwards' logits are not reduced again.
        resume_after_halt: a checkpoint's guard state is loaded without its halt (resuming is
            the decision that the cause is fixed; the state's references still catch a teacher
            that is not). False keeps the halt: the resumed run stops at its first step.
    """

    default_metric_names = LIGHTNING_METRIC_NAMES

    def __init__(
        self,
        guard: GuardSpec = None,
        *,
        teacher_attr: str | None = "teacher",
        dirpath: str | os.PathLike[str] | None = None,
        fused_loss: bool = False,
        resume_after_halt: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(guard, **kwargs)
        self.teacher_attr = teacher_attr
        self.fused_loss = fused_loss
        self.dirpath = dirpath
        self.resume_after_halt = resume_after_halt
        self.halt_checkpoint: str | None = None
        """Path of the checkpoint saved on halt."""
        self.teacher_left_out: dict[str, Any] | None = None
        """What the last checkpoint saved after the halt left out of the teacher, and why."""
        self._updated: int | None = None
        self._stopped = False
        self._kept_teacher: dict[str, Any] | None = None
        self._load_hook: Any = None

    # ------------------------------------------------------------------ hooks

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        attach(self.guard, timeout_s=self.consensus_timeout_s)
        if stage == "fit" and self.teacher_attr and not self.step_guard.watching:
            teacher = getattr(pl_module, self.teacher_attr, None)
            if isinstance(teacher, torch.nn.Module):
                self.step_guard.watch(teacher, logits=not self.fused_loss)
        teacher = self._teacher(pl_module)
        if stage == "fit" and teacher is not None and self._load_hook is None:
            self._load_hook = teacher.register_load_state_dict_pre_hook(self._keep_teacher)

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self.step_guard.collecting = True

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any
    ) -> None:
        self.step_guard.collecting = False
        step = trainer.global_step
        self._updated = step
        if not self.step_guard.before_update(step):
            optimizer.zero_grad(set_to_none=True)

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        self.step_guard.collecting = False
        if self._updated is None:  # gradient accumulation: no update on this batch
            return
        step, self._updated = self._updated, None
        if not self.step_guard.halted:
            self.step_guard.after_logs(step, trainer.callback_metrics, skip_if_absent=False)
        # the guard/* metrics go to the module's loggers with the step's own metrics
        # (not to a logger when there is none: Lightning would warn about it at every step)
        pl_module.log_dict(
            self.step_guard.metrics, on_step=True, on_epoch=False, logger=bool(trainer.loggers)
        )
        halt = self.step_guard.halted
        if trainer.world_size > 1:  # already agreed by the reducer; the strategy makes it certain
            halt = trainer.strategy.reduce_boolean_decision(halt, all=False)
        if halt and not self._stopped:
            self._halt(trainer, step)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or self.step_guard.halted:
            return
        step = max(trainer.global_step - 1, 0)
        fed = self.step_guard.after_logs(step, trainer.callback_metrics, [Metric.EVAL_ACCURACY])
        if fed is not None and self.step_guard.halted and not self._stopped:
            self._halt(trainer, trainer.global_step)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.guard.close()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """The teacher's load pre-hook serves ``fit``'s own restore only."""
        if self._load_hook is not None:
            self._load_hook.remove()
            self._load_hook = None

    def state_dict(self) -> dict[str, Any]:
        return {"guard": self.guard.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """The guard's state from a checkpoint, without its halt unless ``resume_after_halt``
        is off; a teacher kept by the load (:meth:`_keep_teacher`) is recorded here."""
        keep_halt = not self.resume_after_halt
        self.guard.load_state_dict(state_dict.get("guard", {}), keep_halt=keep_halt)
        if self._kept_teacher is not None:
            left_out = state_dict.get("teacher_left_out")
            self.guard.events.write(
                "teacher_kept", **self._kept_teacher, checkpoint_left_out=left_out
            )
            log.info("distill_guard: %s (%s)", KEPT_WHY, ", ".join(self._kept_teacher["modules"]))
            self._kept_teacher = None

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        """Once the guard halted, the checkpoint holds none of the teacher's weights."""
        if not self.guard.halted:
            return
        record = leave_teacher_out(pl_module, self._teacher(pl_module), checkpoint["state_dict"])
        checkpoint.setdefault("callbacks", {}).setdefault(self.state_key, {})
        checkpoint["callbacks"][self.state_key]["teacher_left_out"] = record
        self.teacher_left_out = record

    def _teacher(self, pl_module: pl.LightningModule) -> torch.nn.Module | None:
        """The teacher module: the one the guard watches, else ``pl_module.<teacher_attr>``."""
        if self.watched_teacher is not None:
            return self.watched_teacher
        teacher = getattr(pl_module, self.teacher_attr or "teacher", None)
        return teacher if isinstance(teacher, torch.nn.Module) else None

    def _keep_teacher(
        self, teacher: torch.nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any
    ) -> None:
        """A load-state-dict pre-hook on the teacher: a checkpoint that holds none of its
        weights (one saved after a halt) loads with the teacher's own, so a strict load
        passes and the teacher stays the one this run built."""
        if not prefix or any(k.startswith(prefix) for k in state_dict):
            return
        own = teacher.state_dict()
        state_dict.update({prefix + k: v for k, v in own.items()})
        self._kept_teacher = {"modules": [prefix[:-1]], "tensors": len(own), "why": KEPT_WHY}

    # ------------------------------------------------------------------ halt

    def _halt(self, trainer: pl.Trainer, step: int) -> None:
        self._stopped = True
        reason = self.step_guard.halt_reason or "another rank halted"
        if self.save_on_halt:
            root = Path(self.dirpath or Path(trainer.default_root_dir) / "checkpoints")
            path = root / f"distill_guard-halt-step={step}.ckpt"
            trainer.save_checkpoint(path)  # a collective: every rank is here, having agreed
            self.halt_checkpoint = str(path)
            self.guard.events.write(
                "checkpoint", step=step, path=str(path), teacher_left_out=self.teacher_left_out
            )
        trainer.should_stop = True
        log.error(
            "distill_guard: stopping training at step %s%s: %s",
            step,
            f" after saving {self.halt_checkpoint}" if self.halt_checkpoint else "",
            reason,
        )


def find_guard_callback(trainer: pl.Trainer) -> DistillGuardCallback | None:
    """The trainer's :class:`DistillGuardCallback`, if it has one (in ``training_step``:
    ``find_guard_callback(self.trainer)``)."""
    for cb in trainer.callbacks:
        if isinstance(cb, DistillGuardCallback):
            return cb
    return None
