"""Reverse-KL signature: KL(student‖teacher) + H(student) = ln V exactly when the teacher is uniform."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from distill_guard.checks.base import Check
from distill_guard.findings import Code, Finding, Severity
from distill_guard.observations import LossKind, Metric, RunSpec, StepMetrics
from distill_guard.signals import reverse_kl_uniform_gap


@dataclass
class ReverseKLSignatureCheck(Check):
    """Flags a reverse-KL loss whose sum with the student's entropy equals ln V.

    For reverse KL there is no ceiling to hit, but KL(s‖uniform) = ln V − H(s), so the identity
    holds whatever the student does. Healthy runs sit many nats below ln V (small KL, entropy of
    a nat or so). Needs the loss and the student's full-vocabulary entropy in the same step.
    """

    name: ClassVar[str] = "reverse_kl_signature"

    enabled: bool = True
    """Switch the check off without removing it from a preset."""
    rel_tol: float = 0.02
    """Flag when |ln V − (KL + H)| ≤ rel_tol × ln V."""

    def on_step_metrics(self, metrics: StepMetrics, run: RunSpec) -> list[Finding]:
        loss = metrics.get(Metric.LOSS)
        entropy = metrics.get(Metric.STUDENT_ENTROPY)
        if (
            not self.enabled
            or run.loss is not LossKind.REVERSE_KL
            or run.vocab_size is None
            or loss is None
            or entropy is None
            or not (math.isfinite(loss) and math.isfinite(entropy))
        ):
            return []
        kl = loss / run.loss_scale
        gap = reverse_kl_uniform_gap(kl, entropy, run.vocab_size)
        bound = self.rel_tol * run.log_vocab
        if abs(gap) > bound:
            return []
        return [
            Finding(
                Code.LOSS_REVERSE_KL_SIGNATURE,
                Severity.CRITICAL,
                f"Reverse KL {kl:.4f} + student entropy {entropy:.4f} = {kl + entropy:.4f}, within "
                f"{abs(gap):.4f} of ln V = {run.log_vocab:.4f} (bound {bound:.4f}): the "
                f"identity KL(s‖uniform) = ln V − H(s) holds, so the teacher is uniform. Reload "
                f"its weights and enable its weights CPU backup.",
                metrics.step,
                {
                    "reverse_kl": kl,
                    "student_entropy": entropy,
                    "gap": gap,
                    "bound": bound,
                    "vocab_size": run.vocab_size,
                },
            )
        ]
