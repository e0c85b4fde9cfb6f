"""Student entropy drift: the student's entropy leaving its own warm-up level, toward ln V."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from distill_guard.checks.base import Check
from distill_guard.findings import Code, Finding, Severity
from distill_guard.observations import Metric, RunSpec, StepMetrics


@dataclass
class EntropyDriftCheck(Check):
    """Two-sided CUSUM on the step-mean student entropy against a frozen warm-up reference,
    plus hard limits relative to ln V.

    The reference (mean, σ) is taken over the first ``warmup_steps`` finite values and then
    frozen: a running mean would chase the drift it should detect. A rise is a warning (the
    failed run went 0.41 → 3.56 nats); a fall is only recorded (a student converging on a
    confident teacher gets sharper). The limits need no warm-up, so a drift from step 0 is still
    caught.
    """

    name: ClassVar[str] = "entropy_drift"

    enabled: bool = True
    """Switch the check off without removing it from a preset."""
    warmup_steps: int = 50
    """Finite observations that form the frozen reference. Fewer make the estimated mean and σ
    so uncertain that stationary noise alone crosses the threshold (20 steps: about one run in
    five raised a false drift warning within 1000 steps)."""
    k: float = 1.0
    """CUSUM slack per step, in reference σ: deviations smaller than this never accumulate.
    1σ tunes the detector to shifts of about 2σ and more; the drift of a dead teacher is
    hundreds of σ, and a smaller slack turns warm-up estimation error into false alarms."""
    h: float = 8.0
    """CUSUM decision threshold, in σ. Larger trades detection delay for fewer false alarms."""
    patience: int = 3
    """Consecutive steps over the threshold before a finding."""
    min_sigma_rel: float = 0.05
    """Floor on σ as a fraction of the reference mean, so a very steady warm-up is not brittle."""
    min_sigma_abs: float = 0.01
    """Absolute floor on σ, in nats."""
    warn_fraction_of_log_vocab: float = 0.25
    """Warn when the entropy exceeds this × ln V (needs vocab_size)."""
    critical_fraction_of_log_vocab: float = 0.5
    """Critical when the entropy exceeds this × ln V: the student is near uniform."""

    def __post_init__(self) -> None:
        self._warmup: list[float] = []
        self._mean: float | None = None
        self._sigma: float | None = None
        self._up = 0.0
        self._down = 0.0
        self._up_run = 0
        self._down_run = 0

    def on_step_metrics(self, metrics: StepMetrics, run: RunSpec) -> list[Finding]:
        h = metrics.get(Metric.STUDENT_ENTROPY)
        if not self.enabled or h is None or not math.isfinite(h):
            return []
        findings = self._limits(h, metrics.step, run)
        if self._mean is None:
            self._warmup.append(h)
            if len(self._warmup) >= self.warmup_steps:
                self._freeze()
            return findings
        z = (h - self._mean) / self._sigma
        self._up = max(0.0, self._up + z - self.k)
        self._down = max(0.0, self._down - z - self.k)
        self._up_run = self._up_run + 1 if self._up > self.h else 0
        self._down_run = self._down_run + 1 if self._down > self.h else 0
        values = {
            "student_entropy": h,
            "reference_mean": self._mean,
            "reference_sigma": self._sigma,
            "threshold_sigma": self.h,
        }
        if self._up_run >= self.patience:
            findings.append(
                Finding(
                    Code.STUDENT_ENTROPY_DRIFT,
                    Severity.WARN,
                    f"Student entropy {h:.3f} has risen from its warm-up level {self._mean:.3f} "
                    f"(σ {self._sigma:.3f}): CUSUM {self._up:.1f}σ over threshold {self.h:g}σ for "
                    f"{self._up_run} steps. A student drifting toward uniform is what a dead "
                    "teacher causes; check the teacher's logprobs and sample responses.",
                    metrics.step,
                    {**values, "cusum_sigma": self._up, "direction": "up"},
                )
            )
        if self._down_run >= self.patience:
            findings.append(
                Finding(
                    Code.STUDENT_ENTROPY_DROP,
                    Severity.INFO,
                    f"Student entropy {h:.3f} has fallen below its warm-up level {self._mean:.3f} "
                    f"(CUSUM {self._down:.1f}σ over {self.h:g}σ). Expected while distilling from a "
                    "confident teacher; worth a look only if accuracy stalls.",
                    metrics.step,
                    {**values, "cusum_sigma": self._down, "direction": "down"},
                )
            )
        return findings

    def _limits(self, h: float, step: int, run: RunSpec) -> list[Finding]:
        if run.vocab_size is None:
            return []
        log_v = run.log_vocab
        for severity, frac in (
            (Severity.CRITICAL, self.critical_fraction_of_log_vocab),
            (Severity.WARN, self.warn_fraction_of_log_vocab),
        ):
            if h >= frac * log_v:
                return [
                    Finding(
                        Code.STUDENT_ENTROPY_LIMIT,
                        severity,
                        f"Student entropy {h:.3f} nats is {h / log_v:.0%} of ln V = {log_v:.3f} "
                        f"(limit {frac:.0%}): the student's outputs are close to uniform noise. "
                        "Stop trusting its samples; check the teacher and roll back to a "
                        "checkpoint from before the rise.",
                        step,
                        {"student_entropy": h, "log_vocab": log_v, "bound": frac * log_v},
                    )
                ]
        return []

    def _freeze(self) -> None:
        n = len(self._warmup)
        mean = sum(self._warmup) / n
        var = sum((x - mean) ** 2 for x in self._warmup) / max(n - 1, 1)
        self._mean = mean
        self._sigma = max(math.sqrt(var), self.min_sigma_rel * abs(mean), self.min_sigma_abs)
        self._warmup = []

    def state_dict(self) -> dict[str, Any]:
        return {
            "warmup": list(self._warmup),
            "mean": self._mean,
            "sigma": self._sigma,
            "up": self._up,
            "down": self._down,
            "up_run": self._up_run,
            "down_run": self._down_run,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._warmup = list(state.get("warmup", []))
        self._mean = state.get("mean")
        self._sigma = state.get("sigma")
        self._up = float(state.get("up", 0.0))
        self._down = float(state.get("down", 0.0))
        self._up_run = int(state.get("up_run", 0))
        self._down_run = int(state.get("down_run", 0))
