"""Findings: what a check saw, in a form the policy, the log and a person can all read."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from distill_guard import redaction


class Severity(str, Enum):
    """How bad a finding is. Ordered: info < warn < critical."""

    INFO = "info"
    WARN = "warn"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        return _SEVERITY_RANK[self]

    def __ge__(self, other: Severity) -> bool:  # type: ignore[override]
        return self.rank >= Severity(other).rank

    def __gt__(self, other: Severity) -> bool:  # type: ignore[override]
        return self.rank > Severity(other).rank

    def __le__(self, other: Severity) -> bool:  # type: ignore[override]
        return self.rank <= Severity(other).rank

    def __lt__(self, other: Severity) -> bool:  # type: ignore[override]
        return self.rank < Severity(other).rank


_SEVERITY_RANK = {Severity.INFO: 0, Severity.WARN: 1, Severity.CRITICAL: 2}


class Code:
    """Stable finding codes. Dashboards, alerts and tests key on these; never rename one."""

    TEACHER_UNIFORM = "teacher.uniform"
    TEACHER_NONFINITE = "teacher.nonfinite"
    TEACHER_IMPOSSIBLE = "teacher.impossible_values"
    TEACHER_NEAR_UNIFORM = "teacher.near_uniform"
    TEACHER_VOCAB_MISMATCH = "teacher.vocab_mismatch"
    TEACHER_TOKENS_MISMATCH = "teacher.tokens_mismatch"
    TEACHER_POSITION_SHIFT = "teacher.position_shift"
    TEACHER_FINGERPRINT_MISMATCH = "teacher.fingerprint_mismatch"
    TEACHER_REFERENCE_MISMATCH = "teacher.reference_mismatch"
    TEACHER_REFERENCE_UNAVAILABLE = "teacher.reference_unavailable"
    TEACHER_UNREACHABLE = "teacher.unreachable"
    TEACHER_REPAIRED = "teacher.repaired"
    TEACHER_REPAIR_FAILED = "teacher.repair_failed"
    TEACHER_STATE_UNKNOWN = "teacher.state_unknown"
    TEACHER_WEIGHTS_NOT_KEPT = "teacher.weights_not_kept"
    TEACHER_RELEASE_SKIPPED = "teacher.release_skipped"
    TEACHER_CHECK_UNAVAILABLE = "teacher.check_unavailable"
    TEACHER_REPLICA_QUARANTINED = "teacher.replica_quarantined"
    TEACHER_REPLICA_READMITTED = "teacher.replica_readmitted"
    TEACHER_REPLICAS_BELOW_MIN = "teacher.replicas_below_min"
    TEACHER_ROUTER_FAILED = "teacher.router_failed"
    LOSS_JSD_CEILING = "loss.jsd_ceiling"
    LOSS_ABOVE_CEILING = "loss.above_ceiling"
    LOSS_REVERSE_KL_SIGNATURE = "loss.reverse_kl_signature"
    STUDENT_ENTROPY_DRIFT = "student.entropy_drift"
    STUDENT_ENTROPY_DROP = "student.entropy_drop"
    STUDENT_ENTROPY_LIMIT = "student.entropy_limit"
    STUDENT_TRUNCATION = "student.truncation"
    STUDENT_DIVERGED = "student.diverged"
    STUDENT_FOLLOWS_DEAD_TEACHER = "student.follows_dead_teacher"
    STUDENT_WARMUP_TREND = "student.warmup_trend"
    LOSS_SHIFT = "loss.shift"
    LOSS_RISE = "loss.rise"
    LOSS_NO_SIGNAL = "loss.no_signal"
    LOSS_TOPK_CLAMP = "loss.topk_clamp"
    STUDENT_TOPK_MASS_FALLING = "student.topk_mass_falling"
    CONFIG_BETA_AT_END = "config.beta_at_end"
    CONFIG_TEACHER_TEMPERATURE_IGNORED = "config.teacher_temperature_ignored"
    EVAL_ACCURACY_DROP = "eval.accuracy_drop"
    METRIC_NONFINITE = "metric.nonfinite"
    CONFIG_NO_WEIGHTS_BACKUP = "config.no_weights_backup"
    CONFIG_BACKUP_DISABLED_BY_CACHE_MODE = "config.backup_disabled_by_cache_mode"
    CONFIG_NONDETERMINISTIC = "config.nondeterministic"
    CONFIG_UNCHECKED = "config.unchecked"
    CONFIG_VOCAB_SIZE = "config.vocab_size"
    CONFIG_UNKNOWN_FLAG = "config.unknown_flag"
    GUARD_INTERNAL_ERROR = "guard.internal_error"
    CONSENSUS_FAILED = "guard.consensus_failed"
    ALERT_FAILED = "guard.alert_failed"
    RELAX_VERDICT_UNUSABLE = "relax.verdict_unusable"


TEACHER_FAULTS = frozenset(
    {
        Code.TEACHER_UNIFORM,
        Code.TEACHER_IMPOSSIBLE,
        Code.TEACHER_NEAR_UNIFORM,
        Code.TEACHER_NONFINITE,
        Code.TEACHER_FINGERPRINT_MISMATCH,
        Code.TEACHER_REFERENCE_MISMATCH,
        Code.TEACHER_REPAIR_FAILED,
        Code.TEACHER_WEIGHTS_NOT_KEPT,
    }
)
"""Findings that are the teacher's own evidence of a fault (its scores, its canary)."""


def _jsonable(value: Any) -> Any:
    """Floats that JSON cannot carry (NaN, inf) become strings so an event line always parses."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "tolist") and callable(value.tolist):  # numpy / torch, any shape
        return _jsonable(value.tolist())
    if hasattr(value, "item") and callable(value.item):
        return _jsonable(value.item())
    return value


@dataclass(frozen=True)
class Finding:
    """One observation that something is, or may be, wrong.

    The message is for a person: it names what was measured, the bound it was held against, and
    what to do. ``values`` carries the same numbers for machines (the event log, dashboards).
    """

    code: str
    """Stable identifier from :class:`Code`."""
    severity: Severity
    """info: recorded only; warn: alert a person; critical: the run is being harmed now."""
    message: str
    """What was measured, against which bound, and what to do about it."""
    step: int | None = None
    """Training step the observation belongs to (``None`` before training, e.g. preflight)."""
    values: dict[str, Any] = field(default_factory=dict)
    """The measured numbers and bounds behind the message."""

    def __post_init__(self) -> None:
        if redaction.known():  # a server's echo of a key in an error must not reach any sink
            object.__setattr__(self, "message", redaction.redact(self.message))
            object.__setattr__(self, "values", redaction.redact_value(dict(self.values)))

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "code": self.code,
            "severity": self.severity.value,
            "message": self.message,
            "values": _jsonable(dict(self.values)),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Finding:
        return cls(
            code=data["code"],
            severity=Severity(data["severity"]),
            message=data["message"],
            step=data.get("step"),
            values=dict(data.get("values") or {}),
        )


def worst(findings: list[Finding]) -> Severity | None:
    """The highest severity among findings, or None for none."""
    if not findings:
        return None
    return max((f.severity for f in findings), key=lambda s: s.rank)


def internal_error(who: str, exc: Exception, step: int | None, consequence: str) -> Finding:
    """``guard.internal_error``: the guard's own fault, never the run's."""
    error = f"{type(exc).__name__}: {exc}"
    return Finding(
        Code.GUARD_INTERNAL_ERROR,
        Severity.WARN,
        f"{who} raised {error}. This is a fault in the guard or in the data handed to it, not in "
        f"the run; {consequence}. Please report it with the event log.",
        step,
        {"who": who, "error": error},
    )
