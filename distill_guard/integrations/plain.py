"""The plain-loop adapter, by its first name: :class:`StepGuard` and what the trainer callbacks
share, re-exported from the modules that hold them (``step_guard``, ``callback``,
``teacher_taps``). New code imports ``from distill_guard import StepGuard``."""

from distill_guard.integrations.callback import (
    RENAMED_ARGUMENTS,
    GuardedCallback,
    refuse_unexpected,
)
from distill_guard.integrations.step_guard import StepGuard
from distill_guard.integrations.teacher_taps import logits_of, vocab_width

__all__ = [
    "RENAMED_ARGUMENTS",
    "GuardedCallback",
    "StepGuard",
    "logits_of",
    "refuse_unexpected",
    "vocab_width",
]
