"""JSD at its ceiling: teacher and student have (nearly) disjoint support, e.g. a uniform teacher."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from distill_guard.checks.base import Check
from distill_guard.findings import Code, Finding, Severity
from distill_guard.observations import Metric, RunSpec, StepMetrics


@dataclass
class JSDCeilingCheck(Check):
    """Flags a per-token generalized JSD at (or above) its bound H(β).

    A bound, not a statistic: a uniform teacher against a peaked student gives ln 2 − O(K/V)
    at β = 0.5 (the failed run's step-0 loss was 0.688) while a healthy run sits two orders of
    magnitude lower, so one step at the ceiling is already the fault. Who is to blame depends on
    the teacher's own evidence of the same step: with its scores checked and healthy, it is the
    student that left (``student.diverged``, a learning rate far too high), not the teacher.

    A loss *above* H(β) is impossible for a pure per-token JSD, so it means the metric is not
    one (a KL, a scaled or mixed loss) and the bound test cannot be trusted: that is reported
    as a configuration warning. Off for KL losses, which have no ceiling.
    """

    name: ClassVar[str] = "jsd_ceiling"

    enabled: bool = True
    """Switch the check off without removing it from a preset."""
    fraction_of_ceiling: float = 0.95
    """Flag when loss / loss_scale ≥ this × H(β)."""
    above_ceiling_tolerance: float = 0.05
    """Warn that the metric is not a pure JSD when it exceeds H(β) by more than this fraction."""

    def on_step_metrics(self, metrics: StepMetrics, run: RunSpec) -> list[Finding]:
        loss = metrics.get(Metric.LOSS)
        ceiling = run.loss_ceiling
        if not self.enabled or loss is None or ceiling is None or not math.isfinite(loss):
            return []
        per_token = loss / run.loss_scale
        values = {
            "loss": loss,
            "loss_scale": run.loss_scale,
            "per_token_loss": per_token,
            "ceiling": ceiling,
            "beta": run.beta,
            "teacher_healthy": metrics.teacher_healthy,
        }
        if per_token > ceiling * (1.0 + self.above_ceiling_tolerance):
            return [
                Finding(
                    Code.LOSS_ABOVE_CEILING,
                    Severity.WARN,
                    f"Per-token loss {per_token:.4f} (loss {loss:.4f} / loss_scale "
                    f"{run.loss_scale:g}) exceeds the ceiling H(β={run.beta:g}) = {ceiling:.4f} "
                    "of the JSD this run is configured with, which no JSD can. Either the loss "
                    "is not a JSD (a forward or reverse KL has no ceiling: set run.loss, or "
                    "replay --loss), or it is scaled (set loss_scale), or it includes other "
                    "terms (point the loss metric at the pure distillation loss). Until then "
                    "the ceiling test is blind.",
                    metrics.step,
                    values,
                )
            ]
        bound = self.fraction_of_ceiling * ceiling
        if per_token < bound:
            return []
        at = (
            f"Per-token JSD {per_token:.4f} is at {per_token / ceiling:.1%} of its ceiling "
            f"H(β={run.beta:g}) = {ceiling:.4f} (bound {self.fraction_of_ceiling:.0%}): teacher "
            "and student share almost no probability mass."
        )
        if metrics.teacher_healthy:
            return [
                Finding(
                    Code.STUDENT_DIVERGED,
                    Severity.CRITICAL,
                    f"{at} The teacher's scores of this step were checked and are healthy, so "
                    "the student has left the teacher: a learning rate far too high, a loss "
                    "with the wrong sign or weighting. Reloading the teacher would not help; "
                    "lower the learning rate and resume from a checkpoint before the rise.",
                    metrics.step,
                    {**values, "bound": bound},
                )
            ]
        if metrics.teacher_healthy is False:
            why = (
                "The teacher's own evidence of this step (its scores, or its logged logprob) is "
                "flagged too: it is the teacher."
            )
        else:
            why = (
                "This is the signature of a uniform (weightless) teacher, or of a student that "
                "diverged (a learning rate far too high); the guard saw no teacher scores this "
                "step to tell them apart. Check the teacher's logprobs and reload its weights."
            )
        return [
            Finding(
                Code.LOSS_JSD_CEILING,
                Severity.CRITICAL,
                f"{at} {why}",
                metrics.step,
                {**values, "bound": bound},
            )
        ]
