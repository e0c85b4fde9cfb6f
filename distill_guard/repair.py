"""Rewake: bring a teacher that lost its weights back, verify it, and count repeats as one incident."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from distill_guard.checks.canary import CanaryCheck, teacher_error_finding
from distill_guard.findings import Code, Finding, Severity
from distill_guard.teachers.base import Teacher, TeacherError

Reloader = Callable[[Teacher], None]
"""Puts the right weights back into a woken teacher: for EMA or tensor-pushed teachers, whose
current weights are not the checkpoint at ``model_path``."""
EventSink = Callable[[str, dict[str, Any]], None]

CONFIG_FIX = (
    "Relaunch the teacher with its weights CPU backup: SGLang --enable-weights-cpu-backup "
    "(Relax: --teacher-sglang-enable-weights-cpu-backup; the teacher also inherits "
    "--sglang-enable-weights-cpu-backup from the student)."
)


@dataclass
class RepairOutcome:
    """How a rewake went."""

    ok: bool
    """The canary passed after the last attempt."""
    attempts: int
    findings: list[Finding]
    """``teacher.repaired`` (warn) on success; else ``teacher.repair_failed`` (critical) followed by
    what the last attempt saw."""
    seconds: float


def _noop(kind: str, payload: dict[str, Any]) -> None:
    pass


def repair_teacher(
    teacher: Teacher,
    canary: CanaryCheck,
    *,
    reloader: Reloader | None = None,
    max_attempts: int = 3,
    backoff_s: float = 1.0,
    on_event: EventSink | None = None,
    step: int | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> RepairOutcome:
    """Resume if asleep, reload, flush, verify with the canary; retry with backoff, then give up.

    Each attempt emits ``repair.attempt``, then ``repair.resume`` / ``repair.reload`` /
    ``repair.flush`` as they happen, and ends with ``repair.ok``, ``repair.failed`` (the canary
    still fails) or ``repair.error`` (a teacher call failed); after the last, ``repair.gave_up``.
    The reload uses ``reloader(teacher)`` if given, else ``teacher.reload_weights()`` (the
    server's own ``model_path``). The canary is held against its last fingerprint, so for an EMA
    teacher the reloader must restore the weights the teacher had before it slept.
    """
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
    emit = on_event or _noop
    t0 = time.perf_counter()
    last: list[Finding] = []
    for attempt in range(1, max_attempts + 1):
        emit("repair.attempt", {"attempt": attempt, "max_attempts": max_attempts, "step": step})
        stage = "resume"
        try:
            if teacher.asleep:
                teacher.resume()
                emit("repair.resume", {"attempt": attempt})
            stage = "reload"
            if reloader is not None:
                reloader(teacher)
            else:
                teacher.reload_weights()
            emit("repair.reload", {"attempt": attempt, "custom_reloader": reloader is not None})
            stage = "flush"
            teacher.flush_cache()
            emit("repair.flush", {"attempt": attempt})
            stage = "verify"
            last = canary.verify(teacher, step=step)
        except TeacherError as e:
            last = [teacher_error_finding(e, step, during=f"repair {stage}")]
            emit("repair.error", {"attempt": attempt, "stage": stage, "error": str(e)})
        else:
            if not last:
                seconds = time.perf_counter() - t0
                emit("repair.ok", {"attempt": attempt, "seconds": seconds})
                done = Finding(
                    Code.TEACHER_REPAIRED,
                    Severity.WARN,
                    f"Teacher repaired by rewake (resume, reload, flush) on attempt {attempt} of "
                    f"{max_attempts} in {seconds:.2f} s; the canary now matches its fingerprint.",
                    step,
                    {"attempts": attempt, "seconds": seconds},
                )
                return RepairOutcome(True, attempt, [done], seconds)
            emit(
                "repair.failed",
                {"attempt": attempt, "findings": [f.to_dict() for f in last]},
            )
        if attempt < max_attempts:
            sleep(backoff_s * 2 ** (attempt - 1))
    seconds = time.perf_counter() - t0
    emit("repair.gave_up", {"attempts": max_attempts, "seconds": seconds})
    failed = Finding(
        Code.TEACHER_REPAIR_FAILED,
        Severity.CRITICAL,
        f"Rewake failed {max_attempts} times in {seconds:.1f} s (last: "
        f"{'; '.join(f.code for f in last) or 'no finding'}): the teacher cannot be trusted. Halt "
        f"the run; check the teacher's checkpoint ({'custom reloader' if reloader else 'model_path'})"
        f" and server logs. {CONFIG_FIX}",
        step,
        {"attempts": max_attempts, "seconds": seconds, "last_codes": [f.code for f in last]},
    )
    return RepairOutcome(False, max_attempts, [failed, *last], seconds)


@dataclass
class WeightLossIncident:
    """A stretch of wakes that each lost the weights, from the first until a clean wake."""

    first_step: int | None
    last_step: int | None
    repairs: int = 0
    """Successful rewakes during the incident."""
    failures: int = 0
    """Rewakes that gave up."""


@dataclass
class IncidentTracker:
    """Turns "lost the weights at every wake" into one incident with a repair count, not N alerts.

    Call :meth:`on_repair` after each rewake and :meth:`on_clean_wake` when a wake passed the
    canary unaided. The first repair of an incident returns one alert finding with the
    configuration fix; later repairs return nothing and only count. A failed repair always
    returns its finding: it is not a repeat of a handled problem.
    """

    config_fix: str = CONFIG_FIX
    """The fix to name in the alert (preflight findings can supply a more precise one)."""
    current: WeightLossIncident | None = None
    closed: list[WeightLossIncident] = field(default_factory=list)

    @property
    def total_repairs(self) -> int:
        return sum(i.repairs for i in self.closed) + (self.current.repairs if self.current else 0)

    def on_repair(
        self, outcome: RepairOutcome, *, step: int | None = None, cause: list[Finding] | None = None
    ) -> Finding | None:
        """Record a rewake; the finding to alert on, or None when this incident already alerted."""
        first = self.current is None
        if self.current is None:
            self.current = WeightLossIncident(first_step=step, last_step=step)
        inc = self.current
        inc.last_step = step
        if not outcome.ok:
            inc.failures += 1
            return outcome.findings[0]
        inc.repairs += 1
        if not first:
            return None
        codes = sorted({f.code for f in cause or []})
        return Finding(
            Code.TEACHER_REPAIRED,
            Severity.WARN,
            f"The teacher lost its weights on wake at step {step} ({', '.join(codes) or 'canary'})"
            f" and was repaired by rewake in {outcome.seconds:.2f} s. This repeats at every wake "
            f"until the configuration is fixed; further repairs are counted, not alerted. "
            f"{self.config_fix}",
            step,
            {"incident_first_step": inc.first_step, "repairs": inc.repairs, "cause_codes": codes},
        )

    def on_clean_wake(self, step: int | None = None) -> None:
        """A wake passed the canary without repair: the incident, if any, is over."""
        if self.current is not None:
            self.closed.append(self.current)
            self.current = None

    def state_dict(self) -> dict[str, Any]:
        def enc(i: WeightLossIncident) -> dict[str, Any]:
            return {
                "first_step": i.first_step,
                "last_step": i.last_step,
                "repairs": i.repairs,
                "failures": i.failures,
            }

        return {
            "current": enc(self.current) if self.current else None,
            "closed": [enc(i) for i in self.closed],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        cur = state.get("current")
        self.current = WeightLossIncident(**cur) if cur else None
        self.closed = [WeightLossIncident(**i) for i in state.get("closed", [])]
