"""Checks: pure judgements of observations. Each returns findings; none of them acts or calls out.

:class:`ChecksConfig` is the catalogue: one node per check, the Hydra schema of ``checks``.
"""

from dataclasses import dataclass, field, fields

from distill_guard.checks.base import Check
from distill_guard.checks.canary import CanaryCheck
from distill_guard.checks.entropy_drift import EntropyDriftCheck
from distill_guard.checks.eval_accuracy import EvalAccuracyCheck
from distill_guard.checks.jsd_ceiling import JSDCeilingCheck
from distill_guard.checks.loss_rise import LossRiseCheck
from distill_guard.checks.loss_shift import LossShiftCheck
from distill_guard.checks.loss_signal import LossSignalCheck
from distill_guard.checks.nonfinite import NonfiniteMetricsCheck
from distill_guard.checks.pairing import TokenPairingCheck
from distill_guard.checks.reverse_kl import ReverseKLSignatureCheck
from distill_guard.checks.teacher_collapse import TeacherCollapseCheck
from distill_guard.checks.topk_truncation import TopKTruncationCheck
from distill_guard.checks.truncation import TruncationCheck


@dataclass
class ChecksConfig:
    """One node per check, named as in presets and on the command line."""

    teacher_collapse: TeacherCollapseCheck = field(default_factory=TeacherCollapseCheck)
    jsd_ceiling: JSDCeilingCheck = field(default_factory=JSDCeilingCheck)
    reverse_kl_signature: ReverseKLSignatureCheck = field(default_factory=ReverseKLSignatureCheck)
    entropy_drift: EntropyDriftCheck = field(default_factory=EntropyDriftCheck)
    truncation: TruncationCheck = field(default_factory=TruncationCheck)
    loss_shift: LossShiftCheck = field(default_factory=LossShiftCheck)
    loss_rise: LossRiseCheck = field(default_factory=LossRiseCheck)
    eval_accuracy: EvalAccuracyCheck = field(default_factory=EvalAccuracyCheck)
    token_pairing: TokenPairingCheck = field(default_factory=TokenPairingCheck)
    loss_signal: LossSignalCheck = field(default_factory=LossSignalCheck)
    topk_truncation: TopKTruncationCheck = field(default_factory=TopKTruncationCheck)
    nonfinite_metrics: NonfiniteMetricsCheck = field(default_factory=NonfiniteMetricsCheck)
    canary: CanaryCheck = field(default_factory=CanaryCheck)
    """Sleep/wake canary; used only when the guard is given a live teacher."""

    def enabled(self) -> list[Check]:
        """The observation checks that are switched on, in order (the canary is not one: it
        runs at wake, against a live teacher)."""
        checks = (getattr(self, f.name) for f in fields(self) if f.name != "canary")
        return [c for c in checks if c.enabled]


def default_checks() -> list[Check]:
    """The checks of the ``default`` preset, with their default thresholds (fresh instances)."""
    return ChecksConfig().enabled()


__all__ = [
    "CanaryCheck",
    "ChecksConfig",
    "default_checks",
    "Check",
    "EntropyDriftCheck",
    "EvalAccuracyCheck",
    "JSDCeilingCheck",
    "LossRiseCheck",
    "LossShiftCheck",
    "LossSignalCheck",
    "NonfiniteMetricsCheck",
    "ReverseKLSignatureCheck",
    "TeacherCollapseCheck",
    "TokenPairingCheck",
    "TopKTruncationCheck",
    "TruncationCheck",
]
