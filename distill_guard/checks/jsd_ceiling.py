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

    A uniform teacher against a peaked student gives ln 2 − O(K/V) at β = 0.5: the failed run's
    step-0 loss was 0.688. A healthy run sits two orders of magnitude lower. A loss *above* H(β)
    is impossible for a pure per-token JSD, so it means the metric is scaled or mixed with other
    terms and the bound test cannot be trusted: that is reported as a configuration warning.
    Off for KL losses, which have no ceiling.
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
        }
        if per_token > ceiling * (1.0 + self.above_ceiling_tolerance):
            return [
                Finding(
                    Code.LOSS_ABOVE_CEILING,
                    Severity.WARN,
                    f"Per-token loss {per_token:.4f} exceeds the JSD ceiling H(β={run.beta:g}) = "
                    f"{ceiling:.4f}, which no JSD can: the loss metric is scaled or includes other "
                    f"terms. Set loss_scale (now {run.loss_scale:g}) or point the loss metric at "
                    f"the pure distillation loss, else the ceiling test is blind.",
                    metrics.step,
                    values,
                )
            ]
        bound = self.fraction_of_ceiling * ceiling
        if per_token < bound:
            return []
        return [
            Finding(
                Code.LOSS_JSD_CEILING,
                Severity.CRITICAL,
                f"Per-token JSD {per_token:.4f} is at {per_token / ceiling:.1%} of its ceiling "
                f"H(β={run.beta:g}) = {ceiling:.4f} (bound {self.fraction_of_ceiling:.0%}): teacher "
                f"and student share almost no probability mass. This is the signature of a uniform "
                f"(weightless) teacher; check the teacher's logprobs and reload its weights.",
                metrics.step,
                {**values, "bound": bound},
            )
        ]
