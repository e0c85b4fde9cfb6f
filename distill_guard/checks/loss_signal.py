"""Loss signal: a distillation loss that cannot move the student (β at an end, a loss near 0).

The generalized JSD is bounded by H(β): at β = 1e-6 that is 1.5e-5 nats, so a "JSD" clamped
near an end of (0, 1) is a loss of ~1e-6 whatever the teacher says (verl-recipe #151: GKD's
``beta: 1.0`` clamped to 1 − 1e-6; ms-swift #10078: the JSD → 0 as β → 0 or 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from distill_guard.checks.base import Check
from distill_guard.checks.robust import Reference
from distill_guard.findings import Code, Finding, Severity
from distill_guard.observations import LossKind, Metric, RunSpec, StepMetrics, TeacherScores
from distill_guard.signals import jsd_ceiling


@dataclass
class LossSignalCheck(Check):
    """Warns once when the configured β leaves the JSD no room, and once when the per-token loss
    of the warm-up is too small to carry any signal."""

    name: ClassVar[str] = "loss_signal"

    enabled: bool = True
    """Switch the check off without removing it from a preset."""
    min_beta: float = 0.01
    """A JSD with min(β, 1 − β) below this is bounded by H(β) < 0.056 nats: a learning-rate knob,
    not a distillation signal. Use the KL it approaches (β = 0 or 1) instead."""
    warmup_steps: int = 20
    """Steps whose median per-token loss is judged."""
    min_loss: float = 1e-4
    """Warn when that median is below this many nats per token: a student that differs from its
    teacher at all (every on-policy run's start) shows far more."""

    def __post_init__(self) -> None:
        self._said_beta = False
        self._warmup = Reference(self.warmup_steps)
        self._judged = False

    def on_teacher_scores(self, scores: TeacherScores, run: RunSpec) -> list[Finding]:
        """β is known before the first update: say it there, where a host can still act."""
        return self._beta(scores.step, run) if self.enabled else []

    def on_step_metrics(self, metrics: StepMetrics, run: RunSpec) -> list[Finding]:
        if not self.enabled:
            return []
        findings = self._beta(metrics.step, run)
        loss = metrics.get(Metric.LOSS)
        if loss is None or not math.isfinite(loss) or self._judged:
            return findings
        self._warmup.add(loss / run.loss_scale)
        if not self._warmup.ready:
            return findings
        self._judged = True
        median = self._warmup.median
        if median >= self.min_loss:
            return findings
        return findings + [
            Finding(
                Code.LOSS_NO_SIGNAL,
                Severity.WARN,
                f"The per-token {run.loss.value} loss has a median of {median:.2e} over the first "
                f"{self.warmup_steps} steps (bound {self.min_loss:g}): too small to move the "
                "student. Check β (a JSD clamped near 0 or 1 is ~1e-6), the loss weighting and "
                "that the loss is taken on the teacher's scores at all.",
                metrics.step,
                {"median_loss": median, "bound": self.min_loss, "beta": run.beta},
            )
        ]

    def _beta(self, step: int, run: RunSpec) -> list[Finding]:
        if self._said_beta or run.loss is not LossKind.JSD:
            return []
        end = min(run.beta, 1.0 - run.beta)
        if end >= self.min_beta:
            return []
        self._said_beta = True
        ceiling = jsd_ceiling(run.beta)
        bound = "0 (a KL, not a JSD)" if ceiling is None else f"H(β) = {ceiling:.2e} nats"
        return [
            Finding(
                Code.CONFIG_BETA_AT_END,
                Severity.WARN,
                f"The JSD's β = {run.beta:g} is within {self.min_beta:g} of an end of (0, 1): its "
                f"ceiling is {bound}, so the loss carries almost no signal and β acts as a "
                "learning-rate knob. If a KL was meant, configure it as one (run.loss="
                "forward_kl/reverse_kl); otherwise use β in [0.1, 0.9].",
                step,
                {"beta": run.beta, "ceiling": ceiling, "bound": self.min_beta},
            )
        ]

    def state_dict(self) -> dict[str, Any]:
        return {
            "said_beta": self._said_beta,
            "judged": self._judged,
            "warmup": self._warmup.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._said_beta = bool(state.get("said_beta", False))
        self._judged = bool(state.get("judged", False))
        self._warmup.load_state_dict(state.get("warmup", {}))
