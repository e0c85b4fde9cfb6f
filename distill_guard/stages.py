"""The stages of a guarded step, named once: where each guard hook concludes, in step order."""

from __future__ import annotations

from enum import Enum


class Stage(str, Enum):
    """Where in a step a decision is taken (recorded in events and in :class:`~distill_guard.policy.Halt`).

    ``wake`` and ``sleep`` are the live teacher's (its canary); the other three run the checks'
    own hooks (:data:`distill_guard.checks.base.CHECK_HOOKS`).
    """

    WAKE = "wake"
    """After the teacher woke, before it scores: the canary against its references."""
    TEACHER_SCORES = "teacher_scores"
    """After the teacher scored the step's batch, before the loss: ``Check.on_teacher_scores``."""
    STEP_METRICS_BEFORE_UPDATE = "step_metrics_before_update"
    """The raw loss, before the optimizer moves: ``Check.on_step_metrics``."""
    STEP_METRICS = "step_metrics"
    """The step's logged metrics, after the update: ``Check.on_step_metrics``."""
    SLEEP = "sleep"
    """Before the teacher is released: its fingerprint for the next wake."""

    @property
    def update_pending(self) -> bool:
        """The step's optimizer update is still to come: a skip here is a skip."""
        return self in _BEFORE_UPDATE

    def __str__(self) -> str:
        return self.value


_BEFORE_UPDATE = frozenset({Stage.WAKE, Stage.TEACHER_SCORES, Stage.STEP_METRICS_BEFORE_UPDATE})
