"""The check protocol: observe one stage's data, return findings. No side effects beyond own state."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from typing import Any, ClassVar, TypeVar

import torch

from distill_guard.findings import Finding
from distill_guard.observations import RunSpec, StepMetrics, TeacherScores
from distill_guard.stages import Stage


class Check:
    """Base for checks. Subclasses are dataclasses whose fields are their configuration.

    A check sees a stage only if it overrides that stage's method. Checks never act: they report,
    and :class:`~distill_guard.policy.Policy` decides. State that must survive a resume goes
    through ``state_dict``.
    """

    name: ClassVar[str] = "check"

    def on_teacher_scores(self, scores: TeacherScores, run: RunSpec) -> list[Finding]:
        """After the teacher scored this step's batch, before the loss is taken."""
        return []

    def on_step_metrics(self, metrics: StepMetrics, run: RunSpec) -> list[Finding]:
        """After the optimizer step, with the step's scalar metrics."""
        return []

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned; stateless checks have nothing to restore."""


CHECK_HOOKS: dict[Stage, Callable[[Check, Any, RunSpec], list[Finding]]] = {
    Stage.TEACHER_SCORES: lambda check, scores, run: check.on_teacher_scores(scores, run),
    Stage.STEP_METRICS_BEFORE_UPDATE: lambda check, metrics, run: check.on_step_metrics(
        metrics, run
    ),
    Stage.STEP_METRICS: lambda check, metrics, run: check.on_step_metrics(metrics, run),
}
"""The check hook each observation stage runs, called directly (no lookup by name). ``wake`` and
``sleep`` run no check hook: they are the live teacher's canary (:mod:`distill_guard.live`)."""


K = TypeVar("K", bound=Hashable)


def to_host(parts: Mapping[K, torch.Tensor]) -> dict[K, float]:
    """0-d tensors as floats, moved in one host transfer (one GPU sync however many there are):
    how a check reads a step's statistics at once. Stacked as float64 (a part already float64 on
    the first part's device costs no cast), so counts and float32 values arrive exact."""
    if not parts:
        return {}
    device = next(iter(parts.values())).device
    stacked = torch.stack([t.to(device=device, dtype=torch.float64) for t in parts.values()])
    return dict(zip(parts, stacked.tolist()))


def likely_cause(metrics: StepMetrics, what: str) -> str:
    """Where to look for a student-side symptom, by what the teacher's own evidence of the same
    step says: a finding names the teacher only when that evidence supports it."""
    if metrics.teacher_healthy:
        return (
            f"{what} while the teacher's scores of this step were checked and healthy points at "
            "the student's side: learning rate, loss sign or weighting, data."
        )
    return (
        f"{what} is what a dead teacher causes; check the teacher's logprobs and sample "
        "responses, and the learning rate."
    )
