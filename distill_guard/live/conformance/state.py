"""The state of one conformance run that its checks share: the teacher and what it said at the
start (:class:`Run`), and what each guard sleep and wake did (:class:`Cycle`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from distill_guard.checks.canary import CanaryMeasurement
from distill_guard.findings import Code, Finding
from distill_guard.live.canary import Canary
from distill_guard.live.colocate import ColocatedTeacher
from distill_guard.live.conformance.report import Result
from distill_guard.teachers.base import Teacher, unknown_state
from distill_guard.teachers.capabilities import Capabilities
from distill_guard.teachers.sglang_http import SGLangHTTPTeacher


@dataclass
class Cycle:
    """What one guard sleep and wake did."""

    skipped: str | None = None
    """Not released: the guard's sleep found it unsafe this time (never forced)."""
    failed: str | None = None
    """The guard's own sleep or wake failed, or the wake could not be verified."""
    lost: list[Finding] = field(default_factory=list)
    """What showed the weights lost after the wake (the canary, the checksum, the config)."""
    repair: str | None = None
    """How the repair went, where one ran."""
    repaired: bool = True
    max_delta: float | None = None
    checksum_before: str | None = None
    checksum_after: str | None = None


@dataclass
class Run:
    """One conformance run: the teacher, what it said at the start, and what the checks saw."""

    teacher: Teacher
    canary: Canary
    caps: Capabilities
    info: dict[str, Any]
    http: SGLangHTTPTeacher | None
    first: CanaryMeasurement
    broken: list[Finding]
    preflight: list[Finding]
    cycles: int
    temperature: float
    step: int = 0
    colocated: list[ColocatedTeacher] = field(default_factory=list)
    done: list[Cycle] = field(default_factory=list)
    continue_status: int | None = None
    halted: str | None = None
    """Why nothing more is sent (the sleep state cannot be known)."""

    @property
    def keeps_weights(self) -> bool:
        """The server keeps its weights across a release, by its own arguments (preflight)."""
        lost = (Code.CONFIG_NO_WEIGHTS_BACKUP, Code.CONFIG_BACKUP_DISABLED_BY_CACHE_MODE)
        return not any(f.code in lost for f in self.preflight)

    def agree(self, ok: bool) -> Result:
        """A disagreement with the table FAILs where the table covers the version; on another
        version the guard already assumes the least, so it is a warning."""
        return Result.PASS if ok else Result.FAIL if self.caps.known else Result.WARN

    @property
    def awake(self) -> bool:
        """Known awake by the guard's own tracking: only then may anything reach its memory."""
        return not self.teacher.asleep and not unknown_state(self.teacher)


def codes(findings: list[Finding]) -> str:
    """The findings' codes, sorted, for a row."""
    return ", ".join(sorted({f.code for f in findings})) or "no finding"
