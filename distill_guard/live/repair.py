"""Rewake: bring a teacher that lost its weights back (resume, reload, checksum, flush) and verify it."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from distill_guard.errors import GuardValueError
from distill_guard.findings import Code, Finding, Severity
from distill_guard.live.canary import Canary, teacher_error_finding
from distill_guard.teachers.base import Teacher, TeacherError, TeacherStateError, TeacherUnreachable

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


class _Unverified(Exception):
    """A check of the repair failed: the reload did not bring the teacher back (yet)."""

    def __init__(self, findings: list[Finding]) -> None:
        self.findings = findings


def repair_teacher(
    teacher: Teacher,
    canary: Canary,
    *,
    reloader: Reloader | None = None,
    max_attempts: int = 3,
    backoff_s: float = 1.0,
    on_event: EventSink | None = None,
    step: int | None = None,
    sleep: Callable[[float], None] = time.sleep,
    checksum: Callable[[int | None], list[Finding]] | None = None,
    release_hold: Callable[[], None] | None = None,
) -> RepairOutcome:
    """Resume if asleep, reload, verify, flush, canary; each failed call retried by itself with
    backoff, a failed check from the reload; then give up.

    The stages, in order: ``resume`` (only a teacher known to be released; one whose state is
    unknown is never resumed, and the repair stops), ``reload``, ``checksum`` (the reloaded
    weights against their checksum before the sleep; ``checksum`` gives it), ``flush`` (unless
    the reload flushed), then, where the guard's pause still holds the traffic,
    ``continue`` (``release_hold``: the held requests run on verified weights), and ``verify``
    (the canary). A teacher call that fails is retried from that stage, so
    a flush refused under traffic is asked again without loading the weights twice; a check
    that fails is retried from the reload.

    Each attempt emits ``repair.attempt``, then ``repair.resume`` / ``repair.reload`` /
    ``repair.flush`` as they happen, and ends with ``repair.ok``, ``repair.failed`` (a check
    still fails) or ``repair.error`` (a teacher call failed); after the last, ``repair.gave_up``.
    The reload uses ``reloader(teacher)`` if given, else ``teacher.reload_weights()`` (the
    server's own ``model_path``). The canary is held against the checkpoint's reference where
    the guard has one (the truth, whatever the last wake was), else against its last
    fingerprint, so for an EMA teacher the reloader must restore the weights the teacher had
    before it slept.
    """
    if max_attempts < 1:
        raise GuardValueError(f"max_attempts must be >= 1, got {max_attempts}")
    emit = on_event or _noop
    reference = getattr(canary, "reference", None)

    attempt = 0  # the closures below read the attempt under way

    def resume() -> None:
        if teacher.asleep:
            teacher.resume()
            emit("repair.resume", {"attempt": attempt})

    def reload() -> None:
        if reloader is not None:
            reloader(teacher)
        else:
            teacher.reload_weights()
        emit("repair.reload", {"attempt": attempt, "custom_reloader": reloader is not None})

    def flush() -> None:
        if not getattr(teacher, "reload_flushes", False):  # else the reload flushed
            teacher.flush_cache()
        emit("repair.flush", {"attempt": attempt})

    def check(found: list[Finding]) -> None:
        if found:
            raise _Unverified(found)

    # held (the guard's pause is on): flushed at once, then the traffic runs, then the canary
    stages: list[tuple[str, Callable[[], None]]] = [
        ("resume", resume),
        ("reload", reload),
        ("checksum", lambda: check(checksum(step) if checksum is not None else [])),
        ("flush", flush),
    ]
    if release_hold is not None:
        stages.append(("continue", release_hold))
    stages.append(("verify", lambda: check(canary.verify(teacher, step=step, repair=True))))
    t0 = time.perf_counter()
    last: list[Finding] = []
    first = 0
    stop = f"{max_attempts} attempts failed"
    for attempt in range(1, max_attempts + 1):
        emit("repair.attempt", {"attempt": attempt, "max_attempts": max_attempts, "step": step})
        stage = stages[first][0]
        try:
            for index in range(first, len(stages)):
                stage, run = stages[index]
                run()
        except _Unverified as failed:
            last = failed.findings
            emit(
                "repair.failed",
                {"attempt": attempt, "during": stage, "findings": [f.to_dict() for f in last]},
            )
            first = 1  # a check failed: from the reload
        except TeacherError as e:
            last = [teacher_error_finding(e, step, during=f"repair {stage}")]
            emit("repair.error", {"attempt": attempt, "during": stage, "error": str(e)})
            if isinstance(e, (TeacherUnreachable, TeacherStateError)):
                stop = (
                    f"the teacher did not answer during {stage}"
                    if isinstance(e, TeacherUnreachable)
                    else f"the teacher's state forbids {stage}"
                )
                break
            first = index  # retry only the call that failed
        else:
            seconds = time.perf_counter() - t0
            emit("repair.ok", {"attempt": attempt, "seconds": seconds})
            done = Finding(
                Code.TEACHER_REPAIRED,
                Severity.WARN,
                f"Teacher repaired by rewake (reload, flush, verify) on attempt {attempt} of "
                f"{max_attempts} in {seconds:.2f} s; the canary now matches "
                + (
                    f"its checkpoint's reference ({reference.source})."
                    if reference is not None
                    else "its fingerprint."
                ),
                step,
                {"attempts": attempt, "seconds": seconds},
            )
            return RepairOutcome(True, attempt, [done], seconds)
        if attempt < max_attempts:
            sleep(backoff_s * 2 ** (attempt - 1))
    seconds = time.perf_counter() - t0
    emit("repair.gave_up", {"attempts": attempt, "seconds": seconds, "why": stop})
    last_codes = "; ".join(f.code for f in last) or "no finding"
    source = "custom reloader" if reloader else "model_path"
    why = (
        f"Rewake gave up after {attempt} attempt(s) in {seconds:.1f} s ({stop}; last: "
        f"{last_codes}): the teacher cannot be trusted. Halt the run; check the teacher's "
        f"checkpoint ({source}) and server logs. {CONFIG_FIX}"
    )
    failed = Finding(
        Code.TEACHER_REPAIR_FAILED,
        Severity.CRITICAL,
        why,
        step,
        {"attempts": attempt, "seconds": seconds, "last_codes": [f.code for f in last]},
    )
    return RepairOutcome(False, attempt, [failed, *last], seconds)
