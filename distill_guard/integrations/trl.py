"""TRL: trainers that run the teacher in process (``DistillationTrainer``, ``GKDTrainer``).

:class:`GuardedDistillationMixin` (or :func:`guard_trainer` on a built trainer) hands the
teacher's distribution (:func:`watch_trainer_teacher`) and the raw loss to the
:class:`~distill_guard.integrations.transformers.DistillGuardCallback` *before the optimizer
step*: ``on_pre_optimizer_step`` drops the gradients of a step that trained on a dead teacher or
a NaN loss, so the bad update never happens.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from distill_guard.config import GuardSpec
from distill_guard.integrations.transformers import DistillGuardCallback, find_guard_callback
from distill_guard.losses import distill_loss

log = logging.getLogger("distill_guard")


def guard_trainer(
    trainer: Any,
    guard: GuardSpec = None,
    *,
    teacher: torch.nn.Module | None = None,
    teacher_attr: str = "teacher_model",
    **callback_kwargs: Any,
) -> DistillGuardCallback:
    """Add a guard to an existing Trainer and watch its teacher's forwards.

    ``teacher`` defaults to ``trainer.<teacher_attr>`` (TRL's ``teacher_model``). Reuses the
    trainer's :class:`DistillGuardCallback` when it already has one, and puts it first among the
    trainer's callbacks.
    """
    cb = find_guard_callback(trainer)
    if cb is None:
        cb = DistillGuardCallback(guard, **callback_kwargs)
        trainer.add_callback(cb)
    cb.go_first(trainer)
    teacher = teacher if teacher is not None else getattr(trainer, teacher_attr, None)
    if isinstance(teacher, torch.nn.Module):
        watch_trainer_teacher(trainer, cb, teacher)
    else:
        log.warning(
            "distill_guard: guard_trainer found no teacher module (trainer.%s is %s): the "
            "teacher's scores are not watched and only the logged metrics are judged; pass "
            "teacher=MODULE to watch it",
            teacher_attr,
            type(teacher).__name__,
        )
    return cb


def watch_trainer_teacher(
    trainer: Any, cb: DistillGuardCallback, teacher: torch.nn.Module, *, logits: bool = True
) -> None:
    """Watch the trainer's teacher where its distribution is formed: a forward hook on the
    teacher (GKDTrainer: ``teacher_model(...).logits``; only the canary with ``logits=False``,
    when the fused loss hands its signals over), or, for a trainer that projects the teacher's
    hidden states itself (TRL's ``DistillationTrainer``), a tap on its
    ``_get_last_hidden_state`` (:func:`_tap_hidden_states`) plus the canary on the module."""
    temperature = consumed_temperature(trainer)
    if callable(getattr(trainer, "_get_last_hidden_state", None)) and callable(
        getattr(teacher, "get_output_embeddings", None)
    ):
        if cb.guard.module_canary is None:
            cb.guard.watch_module_teacher(teacher, temperature=temperature)
        _tap_hidden_states(trainer, cb)
    elif not cb.step_guard.watching:
        cb.watch_teacher(teacher, logits=logits, temperature=temperature)


def consumed_temperature(trainer: Any) -> float | None:
    """The temperature TRL's loss divides the teacher's logits by: ``self.temperature`` of
    ``GKDTrainer`` and ``DistillationTrainer`` (trl 1.16 ``gkd_trainer.py`` and
    ``distillation_trainer.py``, both ``args.temperature``); None for a trainer without one."""
    t = getattr(trainer, "temperature", None)
    return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else None


def _tap_hidden_states(trainer: Any, cb: DistillGuardCallback) -> None:
    """Hand TRL ``DistillationTrainer``'s teacher distribution to the guard.

    Read from trl 1.16 ``trl/trainer/distillation_trainer.py``: ``_compute_loss`` runs the
    teacher's *backbone* through ``self._get_last_hidden_state(unwrapped_teacher, input_ids,
    attention_mask, logits_to_keep)`` (via ``_forward_redirection``, so a forward hook on the
    teacher sees these ``[B, K, H]`` hidden states, not logits), keeping the states that predict
    the last ``K = completion_ids.size(1)`` tokens; ``_chunked_divergence_loss`` then projects
    them through ``teacher.get_output_embeddings().weight`` (and bias) chunk by chunk, scaled by
    the config's ``logit_scale`` / ``output_multiplier`` / ``lm_head_multiplier`` /
    ``logits_scaling`` and soft-capped by ``final_logit_softcapping``. The ``lm_head`` module is
    never called, so no hook on it fires: the guard projects the same states through the same
    head itself, with ``attention_mask[:, -K:]`` (the completion mask) and the completion tokens
    ``input_ids[:, -K:]`` as the sampled tokens.
    """
    inner = trainer._get_last_hidden_state
    if getattr(inner, "distill_guard_tap", False):
        return

    def tapped(
        unwrapped_model: Any,
        input_ids: Any,
        attention_mask: Any,
        logits_to_keep: Any,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        hidden = inner(unwrapped_model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)
        teacher = getattr(trainer, "teacher_model", None)
        if not cb.step_guard.collecting or teacher is None:
            return hidden
        if unwrapped_model is not trainer.accelerator.unwrap_model(teacher):
            return hidden  # the student's states
        try:
            config = unwrapped_model.config.get_text_config()
            k = hidden.shape[1]
            mask, labels = attention_mask[:, -k:], input_ids[:, -k:]
            if mask.shape != hidden.shape[:2]:
                mask = labels = None
            cb.step_guard.observe_teacher_hidden_states(
                hidden,
                unwrapped_model.get_output_embeddings(),
                mask=mask,
                labels=labels,
                logit_scale=_logit_scale(config),
                softcap=getattr(config, "final_logit_softcapping", None),
            )
        except Exception:  # noqa: BLE001 - the guard must not break the trainer's loss
            log.exception("distill_guard: could not observe the teacher's hidden states")
        return hidden

    tapped.distill_guard_tap = True  # type: ignore[attr-defined]
    trainer._get_last_hidden_state = tapped


def _logit_scale(config: Any) -> float:
    """The multiplier TRL's ``DistillationTrainer._compute_loss`` applies to the teacher's logits
    (the same config fields, in the same order)."""
    for name in ("logit_scale", "output_multiplier", "lm_head_multiplier"):
        value = getattr(config, name, None)
        if value is not None:
            return float(value)
    scaling = getattr(config, "logits_scaling", None)
    if scaling is not None:
        return float(scaling) if config.model_type == "hyperclovax" else 1.0 / float(scaling)
    return 1.0


class GuardedDistillationMixin:
    """Mix into a Trainer that runs its teacher inside ``compute_loss``::

        class GuardedDistillationTrainer(GuardedDistillationMixin, DistillationTrainer): ...

        trainer = GuardedDistillationTrainer(..., callbacks=[DistillGuardCallback("default")])

    On construction it puts the trainer's :class:`DistillGuardCallback` first among its
    callbacks (so ``report_to`` sees the ``guard/*`` metrics); on the first training
    ``compute_loss`` it watches ``self.<distill_guard_teacher_attr>`` (``teacher_model``, as in
    TRL) with :func:`watch_trainer_teacher`; every raw training loss then goes to the guard too.
    Both are judged in ``on_pre_optimizer_step``.

    With ``distill_guard_fused_loss = True`` on a GKDTrainer subclass, its
    ``generalized_jsd_loss`` is :func:`~distill_guard.losses.distill_loss` (same β convention,
    temperature, ``labels != -100`` mask and reduction; the ``[N, V]`` float32 copies are never
    made), whose signals go to the guard (:meth:`StepGuard.observe_distill_loss
    <distill_guard.integrations.plain.StepGuard.observe_distill_loss>`); the teacher then gets
    only the canary, no forward hook reading its logits again.
    """

    distill_guard_teacher_attr: str = "teacher_model"
    distill_guard_fused_loss: bool = False
    """Compute GKDTrainer's ``generalized_jsd_loss`` with the fused loss and hand its signals
    over (reductions ``batchmean`` and ``sum``; any other goes to TRL's own)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[call-arg]
        cb = find_guard_callback(self)
        if cb is not None:
            cb.raw_loss_source = True  # so on_train_begin does not advise what is in use
            cb.go_first(self)

    def compute_loss(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        cb = self._distill_guard_callback()
        observing = (
            cb is not None and getattr(model, "training", False) and cb.step_guard.collecting
        )
        # the fused generalized_jsd_loss hands its output to this callback and clears it
        self._distill_guard_sink = cb if observing else None
        outputs = super().compute_loss(model, inputs, *args, **kwargs)  # type: ignore[misc]
        if observing and self._distill_guard_sink is not None:
            return_outputs = kwargs.get("return_outputs", args[0] if args else False)
            cb.observe_loss(outputs[0] if return_outputs else outputs)
        self._distill_guard_sink = None
        return outputs

    def generalized_jsd_loss(
        self,
        student_logits: torch.Tensor,
        teacher_logits: torch.Tensor,
        labels: torch.Tensor | None = None,
        beta: float = 0.5,
        temperature: float = 1.0,
        reduction: str = "batchmean",
        num_items_in_batch: Any = None,
    ) -> torch.Tensor:
        """GKDTrainer's loss (trl 1.16 ``trl/experimental/gkd/gkd_trainer.py``), fused when
        ``distill_guard_fused_loss``: the per-token divergence summed over ``labels != -100``,
        divided by ``num_items_in_batch`` when given, else (``batchmean``) by the valid tokens
        (``clamp_min(1)``), or by the batch size without labels; ``sum`` is the sum."""
        own = super().generalized_jsd_loss  # type: ignore[misc]
        if not self.distill_guard_fused_loss or reduction not in ("batchmean", "sum"):
            return own(
                student_logits,
                teacher_logits,
                labels=labels,
                beta=beta,
                temperature=temperature,
                reduction=reduction,
                num_items_in_batch=num_items_in_batch,
            )
        out = distill_loss(
            student_logits, teacher_logits, beta=beta, temperature=temperature, labels=labels
        )
        sink, self._distill_guard_sink = getattr(self, "_distill_guard_sink", None), None
        if sink is not None:
            try:
                sink.observe_distill_loss(out)
            except Exception:  # noqa: BLE001 - the guard must not break the trainer's loss
                log.exception("distill_guard: could not observe the fused loss")
        total = out.per_token.sum()
        if num_items_in_batch is not None:
            if isinstance(num_items_in_batch, torch.Tensor):
                num_items_in_batch = num_items_in_batch.to(total.device)
            return total / num_items_in_batch
        if reduction == "sum":
            return total
        if labels is None:
            return total / max(student_logits.shape[0], 1)
        return total / out.valid.sum().clamp_min(1)

    def _distill_guard_callback(self) -> DistillGuardCallback | None:
        if not hasattr(self, "_distill_guard_cb"):
            cb = find_guard_callback(self)
            if cb is None:
                log.warning(
                    "distill_guard: %s has no DistillGuardCallback; the mixin does nothing",
                    type(self).__name__,
                )
            else:
                teacher = getattr(self, self.distill_guard_teacher_attr, None)
                fused = self.distill_guard_fused_loss and self._distill_guard_fusable()
                if isinstance(teacher, torch.nn.Module):
                    watch_trainer_teacher(self, cb, teacher, logits=not fused)
            self._distill_guard_cb = cb
        return self._distill_guard_cb

    def _distill_guard_fusable(self) -> bool:
        """Whether the trainer's loss goes through ``generalized_jsd_loss`` (GKDTrainer's does;
        TRL's DistillationTrainer projects the teacher's hidden states in chunks in its own loss
        and never forms full logits, so it stays on the hidden-state tap)."""
        if callable(getattr(super(), "generalized_jsd_loss", None)):
            return True
        log.info(
            "distill_guard: %s sets distill_guard_fused_loss but has no generalized_jsd_loss to "
            "replace; its teacher is watched as without it",
            type(self).__name__,
        )
        return False
