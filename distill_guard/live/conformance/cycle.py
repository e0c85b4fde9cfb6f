"""One guard sleep and wake as a conformance check runs it (:func:`sleep_and_wake`): the guard's
own :class:`~distill_guard.live.colocate.ColocatedTeacher`, so ``/pause_generation`` only inside
its sleep and no release where that version's sleep is not safe; whatever the wake broke is
repaired at once (:func:`run_repair`). Once the sleep state cannot be known the run halts
(:func:`halt_if_unknown`): nothing more is sent."""

from __future__ import annotations

from distill_guard.findings import Code, Finding, Severity
from distill_guard.live.colocate import ColocatedTeacher
from distill_guard.live.conformance.report import ConformanceRow, Result
from distill_guard.live.conformance.state import Cycle, Run, codes
from distill_guard.teachers.base import TeacherError, unknown_state
from distill_guard.teachers.capabilities import SleepPlan, plan_sleep


def read_checksum(run: Run) -> str | None:
    """The weights checksum, where the version has one and the teacher is known awake."""
    read = getattr(run.teacher, "checksum", None)
    if not callable(read) or not run.caps.checksum or not run.awake:
        return None
    try:
        return read()
    except TeacherError:
        return None


def sleep_and_wake(run: Run, tags: list[str] | None) -> Cycle:
    """One guard sleep and wake of ``tags``; whatever the wake broke is repaired at once."""
    run.step += 1
    colocated = ColocatedTeacher(
        run.teacher, run.canary, repair_attempts=3, repair_backoff_s=0.5, tags=tags
    )
    run.colocated.append(colocated)
    out = Cycle(checksum_before=read_checksum(run))
    slept = colocated.sleep(run.step)
    if halt_if_unknown(run, out):
        return out
    if not colocated.asleep:
        skipped = [f for f in slept if f.code == Code.TEACHER_RELEASE_SKIPPED]
        if skipped:
            out.skipped = skipped[0].message
        else:
            out.failed = "not released: " + (slept[-1].message if slept else "no finding")
        return out
    run.canary.last_comparison = None
    woke = colocated.wake(run.step)
    if halt_if_unknown(run, out):
        return out
    cmp = run.canary.last_comparison
    out.max_delta = cmp.max_abs_delta if cmp is not None else None
    critical = [f for f in woke if f.severity >= Severity.CRITICAL]
    if colocated.asleep:
        out.failed = "the resume failed: " + (critical[0].message if critical else "asleep")
    elif critical or colocated.held:
        out.lost = critical
    elif cmp is None:
        out.failed = "the wake was not verified: " + (woke[0].message if woke else "no canary")
        return out
    else:
        out.checksum_after = read_checksum(run)
        return out
    run_repair(run, colocated, out, woke)
    return out


def run_repair(run: Run, colocated: ColocatedTeacher, out: Cycle, cause: list[Finding]) -> None:
    """The guard's repair (resume, reload, checksum, flush, canary), as its wake would run it."""
    outcome, _ = colocated.repair(run.step, cause)
    out.repaired = outcome.ok
    if outcome.ok:
        out.repair = f"repaired in {outcome.attempts} attempt(s), {outcome.seconds:.2f} s"
        out.checksum_after = read_checksum(run)
    else:
        why = outcome.findings[0].message if outcome.findings else "no finding"
        out.repair = f"NOT repaired ({why})"
    halt_if_unknown(run, out)


def halt_if_unknown(run: Run, out: Cycle) -> bool:
    """The sleep state cannot be known any more: nothing more is sent to the teacher."""
    unknown = unknown_state(run.teacher)
    if unknown:
        run.halted = str(unknown)
        out.failed = out.failed or f"the sleep state is unknown: {unknown}"
    return bool(unknown)


def why_not_cycled(run: Run) -> str | None:
    """Why no release is tried at all: a teacher broken before, or a version on which the
    guard's sleep never releases (never forced)."""
    if run.broken:
        return f"the teacher was broken before the first sleep ({codes(run.broken)}): not cycled"
    if run.http is not None and plan_sleep(run.caps) is SleepPlan.NEVER:
        return f"{run.caps.note}: the guard's sleep is {SleepPlan.NEVER.value}"
    return None


def lost_text(out: Cycle) -> str:
    return f"lost, {out.repair} ({codes(out.lost)})"


def cycle_row(name: str, assumes: str, out: Cycle) -> ConformanceRow | None:
    """The row of a cycle that was not released or did not complete; None when it did."""
    if out.skipped:
        return ConformanceRow(name, assumes, f"not released: {out.skipped}", Result.SKIPPED)
    if out.failed:
        repaired = f"; {out.repair}" if out.repair else ""
        return ConformanceRow(name, assumes, out.failed + repaired, Result.FAIL)
    return None
