"""transformers: a ``TrainerCallback`` that runs the guard inside any ``Trainer``.

Two ways in, usable together (the second is :mod:`distill_guard.integrations.trl`):

- :class:`DistillGuardCallback` alone reads the logged metrics in ``on_log`` (after the update).
  On a halt it asks the Trainer for a checkpoint (``control.should_save``) and stops it
  (``control.should_training_stop``). transformers' ``logging_nan_inf_filter`` (on by default)
  replaces a NaN/inf loss before ``on_log`` sees it, so the callback alone cannot see a NaN loss.
- For trainers that run the teacher in-process (TRL's ``DistillationTrainer`` and
  ``trl.experimental.gkd.GKDTrainer``), :class:`GuardedDistillationMixin` (or
  :func:`guard_trainer`) also hands the teacher's distribution (:func:`watch_trainer_teacher`)
  and the raw loss to the guard *before the optimizer step*:
  ``on_pre_optimizer_step`` drops the gradients of a step that trained on a dead teacher or a
  NaN loss, so the bad update never happens. Custom ``compute_loss`` code can instead call
  :meth:`DistillGuardCallback.observe_teacher_logits` / ``observe_loss`` itself.

Step numbers are optimizer updates: the teacher scores of update ``s`` are judged at
``state.global_step == s``, its logged metrics (reported after the increment) as step ``s`` too.
A dropped update still counts: a halt's ``checkpoint-N`` has ``N = state.global_step``.

Every training log also carries the guard's ``guard/*`` metrics
(:data:`distill_guard.summary.GUARD_METRICS`), from the front of the Trainer's callbacks.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import torch

from distill_guard.extras import needed

with needed("the transformers/TRL callback (distill_guard.integrations.transformers)", "hf"):
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from distill_guard.config import GuardSpec  # noqa: E402
from distill_guard.consensus import attach
from distill_guard.integrations.callback import GuardedCallback, teacher_in_model
from distill_guard.metric_names import HF_METRIC_NAMES

log = logging.getLogger("distill_guard")

GUARD_STATE_FILE = "distill_guard_state.pt"
"""Name of the guard's state in each checkpoint directory (``torch.load`` it, then
``callback.guard.load_state_dict`` to resume with the same references)."""


class DistillGuardCallback(GuardedCallback, TrainerCallback):
    """Runs a :class:`~distill_guard.guard.DistillGuard` inside a ``transformers.Trainer``.

    Takes :class:`~distill_guard.integrations.plain.GuardedCallback`'s arguments (metric names
    :data:`~distill_guard.metric_names.HF_METRIC_NAMES` by default), and:

    Args:
        save_guard_state: write the guard's state into every checkpoint directory.
    """

    default_metric_names = HF_METRIC_NAMES

    def __init__(self, guard: GuardSpec = None, *, save_guard_state: bool = True, **kwargs: Any):
        super().__init__(guard, **kwargs)
        self.save_guard_state = save_guard_state
        self.raw_loss_source = False
        """Set by :class:`GuardedDistillationMixin` when it joins the trainer: every raw training
        loss will reach the guard before the update."""
        self.first = False
        """Set by :meth:`go_first` (the mixin and :func:`guard_trainer` call it): the
        ``report_to`` integrations see the ``guard/*`` metrics."""
        self._stopping = False

    def watch_teacher(
        self, teacher: torch.nn.Module, *, logits: bool = True, temperature: float | None = None
    ) -> Any:
        """Observe every training-step forward of ``teacher`` through a forward hook (with
        ``logits=False`` only its canary: the loss hands over what it read of the logits).
        ``temperature``: the one the loss consumes the teacher at (TRL's ``temperature``)."""
        return self.step_guard.watch(teacher, logits=logits, temperature=temperature)

    # ------------------------------------------------------------------ Trainer events

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        attach(self.guard, timeout_s=self.consensus_timeout_s)
        if (
            getattr(args, "logging_nan_inf_filter", False)
            and not self.raw_loss_source
            and not self.step_guard.loss_before_update
        ):
            log.info(
                "distill_guard: logging_nan_inf_filter is on, so on_log never shows a NaN loss; "
                "use GuardedDistillationMixin (or observe_loss) to judge the raw loss"
            )
        if not self.first and getattr(args, "report_to", None) not in (None, [], "none", ["none"]):
            log.info(
                "distill_guard: the guard/* metrics reach state.log_history but not report_to=%s, "
                "whose callbacks run before this one; use GuardedDistillationMixin or "
                "guard_trainer(trainer), which put the guard's callback first",
                args.report_to,
            )

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.step_guard.collecting = True

    def go_first(self, trainer: Any) -> None:
        """Move this callback to the front of ``trainer``'s callbacks: the Trainer lists its
        ``report_to`` callbacks (wandb, TensorBoard, ...) before the user's, so only from the
        front do the ``guard/*`` keys this callback adds in ``on_log`` reach them."""
        callbacks = trainer.callback_handler.callbacks
        if self in callbacks:
            callbacks.remove(self)
            callbacks.insert(0, self)
            self.first = True

    def on_pre_optimizer_step(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: torch.nn.Module | None = None,
        optimizer: Any = None,
        **kwargs: Any,
    ) -> None:
        self.step_guard.collecting = False
        if not self.step_guard.before_update(state.global_step):
            # no gradient, no update: AdamW & co. skip parameters whose grad is None
            if optimizer is not None:
                optimizer.zero_grad(set_to_none=True)
            if model is not None:
                model.zero_grad(set_to_none=True)
        if self.step_guard.halted:
            self._stop(control, state)

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.step_guard.collecting = False
        if self.step_guard.halted:
            self._stop(control, state)

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        # logs are identical on every rank, so every rank feeds (or skips) alike
        self.step_guard.after_logs(max(state.global_step - 1, 0), logs or {})
        if logs is not None and "loss" in logs:  # a training log, not an eval or the summary
            # reporting callbacks after this one see the keys in logs; log_history holds a copy
            # of logs, made just before on_log (Trainer.log)
            metrics = self.step_guard.metrics
            logs.update(metrics)
            if state.log_history and state.log_history[-1].get("step") == state.global_step:
                state.log_history[-1].update(metrics)
        if self.step_guard.halted:
            self._stop(control, state)

    def on_save(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: torch.nn.Module | None = None,
        **kwargs: Any,
    ) -> None:
        """The guard's state into the checkpoint; after a halt, a ``checkpoint`` event that says
        what it holds of the teacher (TRL's teacher is not a part of the model it saves)."""
        if not self.save_guard_state or not state.is_world_process_zero:
            return
        ckpt = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        if not os.path.isdir(ckpt):
            return
        torch.save(self.guard.state_dict(), os.path.join(ckpt, GUARD_STATE_FILE))
        if self.guard.halted:
            teacher = teacher_in_model(model, self.watched_teacher)
            if teacher["in_checkpoint"]:
                log.warning(
                    "distill_guard: %s holds the teacher's weights (%s)", ckpt, teacher["why"]
                )
            self.guard.events.write(
                "checkpoint", step=state.global_step, path=ckpt, teacher_left_out=teacher
            )

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.guard.close()

    def _stop(self, control: TrainerControl, state: TrainerState) -> None:
        control.should_training_stop = True
        if self._stopping:
            return
        self._stopping = True
        control.should_save = self.save_on_halt
        log.error(
            "distill_guard: stopping training at step %s%s: %s",
            state.global_step,
            " after a checkpoint" if self.save_on_halt else "",
            self.step_guard.halt_reason,
        )


def find_guard_callback(trainer: Any) -> DistillGuardCallback | None:
    """The trainer's :class:`DistillGuardCallback`, if it has one."""
    for cb in getattr(getattr(trainer, "callback_handler", None), "callbacks", []):
        if isinstance(cb, DistillGuardCallback):
            return cb
    return None


_IN_TRL = ("GuardedDistillationMixin", "guard_trainer", "watch_trainer_teacher")
"""Where they were before :mod:`distill_guard.integrations.trl` held them: still importable here."""


def __getattr__(name: str) -> Any:
    if name in _IN_TRL:
        from distill_guard.integrations import trl

        return getattr(trl, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
