"""Non-finite step metrics: a NaN or inf loss, entropy or ratio."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from distill_guard.checks.base import Check
from distill_guard.findings import Code, Finding, Severity
from distill_guard.observations import Metric, RunSpec, StepMetrics


@dataclass
class NonfiniteMetricsCheck(Check):
    """Flags NaN/inf in the step's metrics, critical for the loss and warn for the rest.

    Trainers often hide these (transformers' ``logging_nan_inf_filter`` drops NaN losses from
    the logs), so adapters should hand the guard the raw values.
    """

    name: ClassVar[str] = "nonfinite_metrics"

    enabled: bool = True
    """Switch the check off without removing it from a preset."""
    critical_roles: list[str] = field(default_factory=lambda: [Metric.LOSS])
    """Roles whose non-finite value is critical; any other role is a warning."""

    def on_step_metrics(self, metrics: StepMetrics, run: RunSpec) -> list[Finding]:
        if not self.enabled:
            return []
        findings = []
        for role, value in metrics.values.items():
            if value is None or math.isfinite(float(value)):
                continue
            critical = role in self.critical_roles
            findings.append(
                Finding(
                    Code.METRIC_NONFINITE,
                    Severity.CRITICAL if critical else Severity.WARN,
                    f"Metric '{role}' is {float(value)} at step {metrics.step} (bound: finite). "
                    + (
                        "The update from this step is corrupt; skip it and check the teacher's "
                        "logprobs, the loss's log/exp clamps and the learning rate."
                        if critical
                        else "Check how it is computed; the guard ignores it this step."
                    ),
                    metrics.step,
                    {"metric": role, "value": float(value)},
                )
            )
        return findings
