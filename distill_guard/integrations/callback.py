"""The base every trainer callback shares: a StepGuard that collects only inside training steps."""

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
