"""The base every trainer callback shares: a StepGuard that collects only inside training steps,
and what a checkpoint saved after a halt holds of the teacher."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from distill_guard.config import GuardSpec
from distill_guard.errors import GuardTypeError
from distill_guard.guard import DistillGuard
from distill_guard.integrations.step_guard import StepGuard
from distill_guard.losses import DistillLoss

RENAMED_ARGUMENTS = {"guard_overrides": "overrides"}
"""Keyword arguments renamed before 1.0: refused with the new name rather than kept as aliases
(one name in code, yaml and docs; an alias would outlive every caller that still used it)."""


def refuse_unexpected(owner: str, unexpected: Mapping[str, Any]) -> None:
    """Raise the TypeError Python would raise for unknown keywords, naming a renamed one's new name."""
    for name in unexpected:
        new = RENAMED_ARGUMENTS.get(name)
        if new is not None:
            raise GuardTypeError(f"{owner}() got the keyword argument {name!r}: it is now {new!r}")
        raise GuardTypeError(f"{owner}() got an unexpected keyword argument {name!r}")


LEFT_OUT_WHY = (
    "saved after the guard halted: the teacher's weights are the ones it found broken, not the "
    "run's; a resume keeps the teacher the resumed run builds (from its own checkpoint)"
)
SHARED_WHY = (
    "kept: the teacher shares parameters with the rest of the model (the student), so its "
    "weights are the run's"
)
APART_WHY = (
    "not a part of the checkpoint: the trainer saves its model, and the teacher is not in it; a "
    "resume builds the teacher from its own checkpoint"
)
UNKNOWN_WHY = (
    "the guard watches no teacher module, so it cannot tell (a teacher in the model stays)"
)
IN_MODEL_WHY = (
    "in the checkpoint: the teacher is a part of the model the trainer saves whole; after the "
    "resume, load the teacher's weights from its own checkpoint"
)


def teacher_record(in_checkpoint: bool | None, modules: list[str], tensors: int, why: str) -> dict:
    """What a checkpoint saved after a halt holds of the teacher (its ``teacher_left_out``):
    whether its weights are in it, where it sits in the model, the tensors left out, and why."""
    return {"in_checkpoint": in_checkpoint, "modules": modules, "tensors": tensors, "why": why}


def teacher_prefixes(model: torch.nn.Module, teacher: torch.nn.Module) -> list[str]:
    """Where ``teacher`` sits in ``model``'s state dict (``["teacher."]`` for ``model.teacher``)."""
    return [
        f"{name}." for name, sub in model.named_modules(remove_duplicate=False) if sub is teacher
    ]


def shares_parameters(model: torch.nn.Module, prefixes: list[str]) -> bool:
    """Whether a parameter under ``prefixes`` is also one of ``model``'s outside them (a teacher
    that is, or ties weights with, the student)."""
    named = list(model.named_parameters(remove_duplicate=False))
    inside = {id(p) for n, p in named if n.startswith(tuple(prefixes))}
    return any(id(p) in inside for n, p in named if not n.startswith(tuple(prefixes)))


def teacher_in_model(model: torch.nn.Module | None, teacher: torch.nn.Module | None) -> dict:
    """What a checkpoint of ``model``, saved whole, holds of ``teacher``."""
    if teacher is None:
        return teacher_record(None, [], 0, UNKNOWN_WHY)
    prefixes = teacher_prefixes(model, teacher) if model is not None else []
    if not prefixes:
        return teacher_record(False, [], 0, APART_WHY)
    return teacher_record(True, [p[:-1] for p in prefixes], 0, IN_MODEL_WHY)


def leave_teacher_out(
    model: torch.nn.Module, teacher: torch.nn.Module | None, state_dict: dict[str, Any]
) -> dict:
    """Drop ``teacher``'s entries from ``model``'s checkpoint ``state_dict`` (in place), unless
    the teacher is the model itself, sits in it under two names, or shares parameters with the
    rest of it; the record of what was done."""
    prefixes = teacher_prefixes(model, teacher) if teacher is not None else []
    if not prefixes:
        return teacher_in_model(model, teacher)
    modules = [p[:-1] for p in prefixes]
    if len(prefixes) > 1 or "." in prefixes or shares_parameters(model, prefixes):
        return teacher_record(True, modules, 0, SHARED_WHY)
    dropped = [k for k in state_dict if k.startswith(tuple(prefixes))]
    for key in dropped:
        del state_dict[key]
    return teacher_record(False, modules, len(dropped), LEFT_OUT_WHY)


class GuardedCallback:
    """What every trainer callback shares: a :class:`StepGuard` that collects only inside
    training steps, the framework's metric names, and the halt and all-rank settings.

    Args:
        guard: a guard, a preset name (``default``/``monitor_only``/``strict``), or a guard
            config node; None composes ``default``.
        overrides: Hydra overrides for a preset or config, e.g. ``["run.vocab_size=151936"]``
            (the name :func:`~distill_guard.config.build_guard` and :class:`StepGuard` use; the
            old ``guard_overrides=`` is refused with a TypeError that names it).
        metric_keys: ``{role: logged name}``; the framework's names by default.
        top_k: teacher top-k kept per position when reducing in-process teacher logits.
        save_on_halt: save a checkpoint before stopping on a halt.
        consensus_timeout_s: per-hook timeout of the all-rank agreement under ``torch.distributed``.
    """

    default_metric_names: Mapping[str, str] = {}
    """The framework's own metric names (set by each adapter)."""

    def __init__(
        self,
        guard: GuardSpec = None,
        *,
        overrides: Sequence[str] = (),
        metric_keys: Mapping[str, str] | None = None,
        top_k: int = 16,
        save_on_halt: bool = True,
        consensus_timeout_s: float = 60.0,
        **unexpected: Any,
    ) -> None:
        refuse_unexpected(type(self).__name__, unexpected)
        names = self.default_metric_names if metric_keys is None else metric_keys
        self.step_guard = StepGuard(
            guard, overrides, top_k=top_k, collecting=False, metric_names=names
        )
        self.save_on_halt = save_on_halt
        self.consensus_timeout_s = consensus_timeout_s

    @property
    def guard(self) -> DistillGuard:
        return self.step_guard.guard

    @property
    def watched_teacher(self) -> torch.nn.Module | None:
        """The in-process teacher module the guard checks on its canary, if any."""
        canary = self.guard.module_canary
        return canary.scorer.module if canary is not None else None

    def observe_teacher_logits(self, logits: torch.Tensor, **kwargs: Any) -> None:
        """Hand the teacher's logits of this micro-batch to the guard (``mask=``, ``labels=``);
        judged before this step's optimizer update."""
        self.step_guard.observe_teacher_logits(logits, **kwargs)

    def observe_teacher_logprobs(self, **kwargs: Any) -> None:
        """Same, with logprobs already reduced (``token_logprobs=``, ``topk_logprobs=``, ``mask=``)."""
        self.step_guard.observe_teacher_logprobs(**kwargs)

    def observe_loss(self, loss: torch.Tensor | float) -> None:
        """Hand the raw micro-batch loss to the guard (it sees a NaN a log filter would hide)."""
        self.step_guard.observe_loss(loss)

    def observe_distill_loss(self, out: DistillLoss) -> None:
        """Hand this micro-batch's :func:`~distill_guard.losses.distill_loss` output to the
        guard: teacher scores, raw loss and student entropy from the loss's own pass
        (:meth:`StepGuard.observe_distill_loss`)."""
        self.step_guard.observe_distill_loss(out)
