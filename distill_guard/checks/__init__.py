"""Checks: each observes one kind of data and returns findings; none of them acts."""

from distill_guard.checks.base import Check
from distill_guard.checks.entropy_drift import EntropyDriftCheck
from distill_guard.checks.jsd_ceiling import JSDCeilingCheck
from distill_guard.checks.nonfinite import NonfiniteMetricsCheck
from distill_guard.checks.reverse_kl import ReverseKLSignatureCheck
from distill_guard.checks.teacher_collapse import TeacherCollapseCheck
from distill_guard.checks.truncation import TruncationCheck

__all__ = [
    "Check",
    "EntropyDriftCheck",
    "JSDCeilingCheck",
    "NonfiniteMetricsCheck",
    "ReverseKLSignatureCheck",
    "TeacherCollapseCheck",
    "TruncationCheck",
]
