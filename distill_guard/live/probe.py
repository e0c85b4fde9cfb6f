"""Probe a live teacher: preflight, then sleep/wake cycles with the canary, repairing what a cycle broke."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from distill_guard.errors import GuardValueError
from distill_guard.findings import Code, Finding, Severity
from distill_guard.live.canary import Canary
from distill_guard.live.colocate import ColocatedTeacher
from distill_guard.live.preflight import preflight_teacher
from distill_guard.live.repair import EventSink
from distill_guard.policy import Action, Decision
from distill_guard.teachers.base import Teacher, TeacherError, unknown_state

log = logging.getLogger("distill_guard")


@dataclass
class CycleReport:
    """One release → resume → canary cycle."""

    cycle: int
    sleep_wake_s: float
    """Release plus resume, wall time."""
    canary_s: float
    """The canary's one scoring call after the wake."""
    max_abs_delta: float | None
    """Largest |Δ logprob| against the fingerprint taken just before this cycle's release."""
    top1_logprob: float | None
    """Mean top-1 logprob of the canary after the wake (−ln V when uniform)."""
    uniform: bool | None
    """The canary after the wake was uniform (None: not measured, e.g. the teacher was held
    for its repair because its checksum or its configuration said it lost its weights)."""
    lost_weights: bool
    """The canary failed after this wake."""
    findings: list[Finding] = field(default_factory=list)
    released: bool = True
    """The teacher was released (False: the release was refused, unsafe now, or its outcome
    unknown; nothing was woken, and the probe stops cycling)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "cycle": self.cycle,
            "sleep_wake_s": self.sleep_wake_s,
            "canary_s": self.canary_s,
            "max_abs_delta": _num(self.max_abs_delta),
            "top1_logprob": _num(self.top1_logprob),
            "uniform": self.uniform,
            "lost_weights": self.lost_weights,
            "released": self.released,
            "findings": [f.to_dict() for f in self.findings],
        }


def _num(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else x


@dataclass
class ProbeReport:
    """What a probe found; ``to_json()`` is the ``--json`` output."""

    ok: bool = True
    """No critical finding (preflight included) and no cycle lost the weights."""
    repaired: bool = False
    """A cycle lost the weights and the probe repaired and verified the teacher before returning."""
    findings: list[Finding] = field(default_factory=list)
    """Preflight findings, then canary and repair findings in the order they happened."""
    cycles: list[CycleReport] = field(default_factory=list)
    interrupted: str | None = None
    """Set when the probe was interrupted: the state it left the teacher in."""
    stopped: str | None = None
    """Set when the probe cycled fewer times than asked: ``"stopped after cycle 1 of 3: it lost
    its weights (repaired and verified)"``, or before cycle 1 for a teacher already broken."""

    @property
    def exit_code(self) -> int:
        """0 healthy; 1 weights lost or a critical configuration (even if the probe repaired it)."""
        return 0 if self.ok else 1

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "repaired": self.repaired,
            "findings": [f.to_dict() for f in self.findings],
            "cycles": [c.to_dict() for c in self.cycles],
            "stopped": self.stopped,
        }


class NothingReleased(TeacherError):
    """The first cycle's pause was refused (no route, an auth error): nothing was released."""


def run_probe(
    teacher: Teacher,
    cycles: int = 3,
    tags: Sequence[str] | None = None,
    canary: Canary | None = None,
    *,
    preflight: bool = True,
    repair: bool = True,
    max_repair_attempts: int = 3,
    on_event: EventSink | None = None,
    on_cycle: Callable[[CycleReport], None] | None = None,
) -> ProbeReport:
    """Preflight, then up to ``cycles`` release/resume cycles each checked by the canary.

    Each cycle is the guard's own colocated step (:class:`ColocatedTeacher`: fingerprint,
    release, resume, canary). The first cycle that loses the weights ends the cycling: with
    ``repair`` the teacher is rewoken (reload, flush, verify) before returning, so a probe
    never leaves a teacher worse than it found it. A teacher that is already broken before the
    first sleep is reported and not cycled. Teacher failures raise :class:`TeacherError` only
    before the first release; after it they become findings.
    """
    if cycles < 0:
        raise GuardValueError(f"cycles must be >= 0, got {cycles}")
    colocated = ColocatedTeacher(
        teacher, canary, repair_attempts=max_repair_attempts, repair_backoff_s=0.5, tags=tags
    )
    report = ProbeReport()
    if preflight:
        report.findings += preflight_teacher(teacher)
    canary = colocated.canary
    broken = canary.judge(canary.measure(teacher), teacher)  # raises: nothing touched yet
    if broken:
        report.findings += broken
        report.ok = False
        if cycles:
            report.stopped = f"stopped before cycle 1 of {cycles}: the teacher was already broken"
        return report
    try:
        _cycles(colocated, cycles, report, repair, on_event, on_cycle)
    except NothingReleased:
        raise  # refused before anything was released: the teacher is as it was
    except BaseException:  # Ctrl-C, SIGTERM: never leave the teacher asleep or weightless
        restore(colocated, report, on_event)
        raise
    if any(c.lost_weights for c in report.cycles) or any(
        f.severity >= Severity.CRITICAL for f in report.findings
    ):
        report.ok = False
    return report


def _cycles(
    colocated: ColocatedTeacher,
    cycles: int,
    report: ProbeReport,
    repair: bool,
    on_event: EventSink | None,
    on_cycle: Callable[[CycleReport], None] | None,
) -> None:
    for i in range(1, cycles + 1):
        cycle = _one_cycle(colocated, i)
        report.cycles.append(cycle)
        report.findings += cycle.findings
        if on_cycle is not None:
            on_cycle(cycle)
        if not cycle.released:
            # nothing to wake; a state that is not known is not touched again
            _stopped(report, i, cycles, "it was not released")
            break
        if not cycle.lost_weights:
            continue
        why = "it lost its weights"
        if repair:
            outcome, _ = colocated.repair(i, cycle.findings, on_event)
            report.findings += outcome.findings
            report.repaired = outcome.ok
            why += " (repaired and verified)" if outcome.ok else " (NOT repaired)"
        _stopped(report, i, cycles, why)
        break


def _stopped(report: ProbeReport, cycle: int, cycles: int, why: str) -> None:
    if cycle < cycles:
        report.stopped = f"stopped after cycle {cycle} of {cycles}: {why}"


def restore(colocated: ColocatedTeacher, report: ProbeReport, on_event: EventSink | None) -> None:
    """An interrupted probe (``probe``, or ``probe --conformance``) puts the teacher back as it
    found it: awake, and reloaded and verified if the wake lost its weights; what it could not do
    is logged, not raised, and said in ``report.interrupted``."""
    step = len(report.cycles) + 1
    try:
        if colocated.asleep:
            lost = colocated.wake(step)
        elif colocated.held:  # interrupted between the pause and the release
            colocated.settle(Decision(step, Action.CONTINUE))
            lost = colocated.canary.verify(colocated.teacher, step=step)
        else:
            lost = colocated.canary.verify(colocated.teacher, step=step)
        if lost:
            outcome, _ = colocated.repair(step, lost, on_event)
            state = "repaired and verified" if outcome.ok else "NOT repaired: reload it by hand"
        else:
            state = "awake and as it was"
    except Exception as exc:  # noqa: BLE001 - report, the interruption is what propagates
        state = f"in an unknown state ({type(exc).__name__}: {exc}): check it before use"
    log.error("distill_guard: probe interrupted; the teacher is %s", state)
    report.interrupted = state


def _one_cycle(colocated: ColocatedTeacher, i: int) -> CycleReport:
    slept = colocated.sleep(i)
    if not colocated.asleep:  # nothing released: refused, unsafe now, or its state unknown
        if i == 1 and not unknown_state(colocated.teacher):
            refused = next((f for f in slept if f.severity >= Severity.WARN), None)
            why = (refused.values.get("error") or refused.message) if refused else "not released"
            raise NothingReleased(
                f"the teacher could not be put to sleep ({why}), so nothing was cycled and it "
                "was left serving as it was"
            )
        return CycleReport(i, 0.0, 0.0, None, None, None, False, slept, released=False)
    woke = colocated.wake(i)
    sleep_wake = colocated.seconds.get("release", 0.0) + colocated.seconds.get("resume", 0.0)
    findings = slept + woke
    if colocated.held or any(f.code == Code.TEACHER_UNREACHABLE for f in woke):
        # held: the checksum failed before the traffic ran; else no resume or no canary answer
        return CycleReport(i, sleep_wake, 0.0, None, None, None, True, findings)
    cmp = colocated.canary.last_comparison
    assert cmp is not None
    return CycleReport(
        cycle=i,
        sleep_wake_s=sleep_wake,
        canary_s=cmp.seconds,
        max_abs_delta=cmp.max_abs_delta,
        top1_logprob=cmp.top1_logprob,
        uniform=cmp.uniform,
        lost_weights=bool(woke),
        findings=findings,
    )


def cycle_result(c: CycleReport) -> str:
    """A cycle's result column: ``ok``, its finding codes, or ``not released: <codes>``."""
    codes = ", ".join(sorted({f.code for f in c.findings}))
    return f"not released: {codes}" if not c.released else codes if c.lost_weights else "ok"


def format_table(report: ProbeReport) -> str:
    """The per-cycle table ``distill-guard probe`` prints."""
    head = f"{'cycle':>5}  {'sleep+wake s':>12}  {'canary s':>8}  {'max |Δ logprob|':>15}  {'top-1 logprob':>13}  {'uniform':>7}  result"
    lines = [head, "-" * len(head)]
    for c in report.cycles:
        delta = "n/a" if c.max_abs_delta is None else f"{c.max_abs_delta:.3g}"
        top1 = (
            "n/a"
            if c.top1_logprob is None or not math.isfinite(c.top1_logprob)
            else f"{c.top1_logprob:.4f}"
        )
        result = cycle_result(c)
        lines.append(
            f"{c.cycle:>5}  {c.sleep_wake_s:>12.3f}  {c.canary_s:>8.3f}  {delta:>15}  {top1:>13}  "
            f"{'n/a' if c.uniform is None else 'yes' if c.uniform else 'no':>7}  {result}"
        )
    return "\n".join(lines)


def format_report(report: ProbeReport, url: str, cycles: int, canary: Canary) -> str:
    """What ``distill-guard probe`` prints: preflight, the cycle table, findings, the verdict."""

    def findings(fs: list[Finding]) -> list[str]:
        return [f"[{f.severity.value.upper():8}] {f.code}: {f.message}" for f in fs]

    lines = [
        f"probe of {url}: {cycles} sleep/wake cycle(s), canary of {canary.length} tokens, "
        f"top-{canary.top_k}"
    ]
    pre = [f for f in report.findings if f.code.startswith("config.")]
    rest = [f for f in report.findings if not f.code.startswith("config.")]
    lines += ["preflight:", *findings(pre)] if pre else []
    lines += [format_table(report)] if report.cycles else []
    lines += ["findings:", *findings(rest)] if rest else []
    if report.stopped:
        lines.append(f"{report.stopped[0].upper()}{report.stopped[1:]}.")
    if any(c.lost_weights for c in report.cycles):
        lines.append(
            "The teacher lost its weights and was repaired (reload, flush) and verified by the "
            "canary; it is as the probe found it. Fix the configuration above: it will "
            "happen again at the next wake."
            if report.repaired
            else "The teacher lost its weights and was NOT repaired: reload its weights or "
            "restart it before use."
        )
    lines.append(f"result: {'healthy' if report.ok else 'UNHEALTHY'} (exit {report.exit_code})")
    return "\n".join(lines)
