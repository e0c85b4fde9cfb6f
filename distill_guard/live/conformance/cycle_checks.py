"""The checks that put the teacher to sleep and wake it by the guard's own sleep
(:func:`~distill_guard.live.conformance.cycle.sleep_and_wake`): each memory tag alone,
``weights`` alone, the full sleep ``cycles`` times; then the checksum across them, the
temperature on input logprobs, and, last, that the teacher is left as it was found."""

from __future__ import annotations

import math

from distill_guard.live.colocate import ColocatedTeacher
from distill_guard.live.conformance.cycle import (
    cycle_row,
    lost_text,
    read_checksum,
    run_repair,
    sleep_and_wake,
    why_not_cycled,
)
from distill_guard.live.conformance.report import ConformanceRow, Result
from distill_guard.live.conformance.state import Cycle, Run, codes
from distill_guard.live.probe import ProbeReport, restore
from distill_guard.live.teacher_temperature import measure_temperature, takes_temperature
from distill_guard.teachers.sglang_engine import SGLangEngineTeacher


def _num(x: float | None) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.3g}"


def _tolerance(run: Run) -> str:
    check = run.canary.check
    if run.canary.is_deterministic(run.teacher):
        return f"bit-exact (≤ {check.deterministic_tolerance:g}, deterministic inference)"
    return f"mean {check.tolerance_mean:g}, max {check.tolerance_max:g} nats"


def check_tags(run: Run) -> list[ConformanceRow]:
    """Each memory tag but ``weights`` released alone by the guard's sleep: the weights stay
    (without the backup, a server that ignored the tag would lose them, and the canary shows it)."""
    rows = []
    for tag in (t for t in run.caps.memory_tags if t != "weights"):
        if run.halted:
            break
        rows.append(_tag_row(run, tag))
    return rows


def _tag_row(run: Run, tag: str) -> ConformanceRow:
    name = f"tag {tag}"
    assumes = f"a release of `{tag}` alone keeps the weights (tags honoured from 0.4.8)"
    why = why_not_cycled(run) or (
        None
        if run.caps.tags
        else "the guard sends no tags to this version: every release acts on everything"
    )
    if why:
        return ConformanceRow(name, assumes, why, Result.SKIPPED)
    out = sleep_and_wake(run, [tag])
    run.done.append(out)
    row = cycle_row(name, assumes, out)
    if row is not None:
        return row
    if out.lost:
        observed = f"the weights were {lost_text(out)}: the server does not honour `{tag}`"
        return ConformanceRow(name, assumes, observed, Result.FAIL)
    observed = f"weights kept: canary unchanged (max |Δ logprob| {_num(out.max_delta)})"
    if run.keeps_weights:
        observed += "; with the backup on, an ignored tag would look the same"
    return ConformanceRow(name, assumes, observed, Result.PASS)


def check_weights(run: Run) -> list[ConformanceRow]:
    """``weights`` released alone: lost and repaired without the backup (expected), kept with it."""
    name = "tag weights"
    if run.keeps_weights:
        assumes = "kept across a release (the server keeps them, by its arguments)"
    else:
        assumes = "lost at the wake (no backup): the guard repairs (reload, verify)"
    why = why_not_cycled(run)
    if why:
        return [ConformanceRow(name, assumes, why, Result.SKIPPED)]
    out = sleep_and_wake(run, ["weights"])
    run.done.append(out)
    return [_weights_result(run, name, assumes, out, "")]


def _weights_result(run: Run, name: str, assumes: str, out: Cycle, kept: str) -> ConformanceRow:
    """A cycle that released the weights, against whether the server keeps them."""
    row = cycle_row(name, assumes, out)
    if row is not None:
        return row
    if out.lost:
        if run.keeps_weights:
            observed = f"{lost_text(out)}, although its arguments say the server keeps them"
            return ConformanceRow(name, assumes, observed, Result.FAIL)
        return ConformanceRow(
            name, assumes, lost_text(out), Result.PASS if out.repaired else Result.FAIL
        )
    observed = kept or f"kept: canary unchanged (max |Δ logprob| {_num(out.max_delta)})"
    if not run.keeps_weights:
        return ConformanceRow(
            name, assumes, observed + ", although the server reports no backup", Result.WARN
        )
    return ConformanceRow(name, assumes, observed, Result.PASS)


def check_cycles(run: Run) -> list[ConformanceRow]:
    """The guard's default sleep (every tag), ``cycles`` times as ``probe`` does: the canary
    after each wake within its tolerance of the one before the sleep."""
    name = f"full sleep/wake ×{run.cycles}"
    assumes = f"logprobs after the wake within the canary's tolerance ({_tolerance(run)})"
    if not run.keeps_weights:
        assumes = "the weights lost at the wake (no backup), repaired and verified"
    why = why_not_cycled(run) or (None if run.cycles else "--cycles 0")
    if why:
        return [ConformanceRow(name, assumes, why, Result.SKIPPED)]
    outs: list[Cycle] = []
    for _ in range(run.cycles):
        out = sleep_and_wake(run, None)
        outs.append(out)
        run.done.append(out)
        if out.skipped or out.failed or out.lost or run.halted:
            break
    ran = [o for o in outs if not o.skipped]
    if not ran:  # the first was not released: its reason
        return [ConformanceRow(name, assumes, f"not released: {outs[0].skipped}", Result.SKIPPED)]
    deltas = [o.max_delta for o in ran if o.max_delta is not None]
    kept = f"{len(ran)} cycle(s): max |Δ logprob| {_num(max(deltas) if deltas else None)}"
    if outs[-1].skipped:
        kept += f"; cycle {len(outs)} not released ({outs[-1].skipped})"
    return [_weights_result(run, name, assumes, ran[-1], kept)]


def check_checksum(run: Run) -> list[ConformanceRow]:
    """Two reads agree; across each sleep the checksum after the wake (or after the repair)
    equals the one before."""
    name = "checksum"
    assumes = "two reads agree; with the backup, the same after a wake (after a repair, without)"
    if not callable(getattr(run.teacher, "checksum", None)):
        observed = (
            "in process: sglang.Engine has no /weights_checker"
            if isinstance(run.teacher, SGLangEngineTeacher)
            else "this teacher has no checksum"
        )
        return [ConformanceRow(name, assumes, observed, Result.SKIPPED)]
    if not run.caps.checksum:
        return [ConformanceRow(name, assumes, "no checksum on this version", Result.SKIPPED)]
    if not run.awake:
        return [ConformanceRow(name, assumes, "not read: not known awake", Result.SKIPPED)]
    a, b = read_checksum(run), read_checksum(run)
    if a is None or b is None:
        observed = "unreadable: the guard finds no checksum in the answer"
        return [ConformanceRow(name, assumes, observed, Result.FAIL)]
    pairs = [(o.checksum_before, o.checksum_after) for o in run.done if o.checksum_after]
    moved = sum(before != after for before, after in pairs)
    across = (
        f"across {len(pairs)} sleep(s): {f'{moved} changed' if moved else 'the same'}"
        if pairs
        else "no sleep completed to compare across"
    )
    observed = f"two reads {'agree' if a == b else 'DIFFER'} ({a[:12]}…); {across}"
    return [
        ConformanceRow(
            name, assumes, observed, Result.PASS if a == b and not moved else Result.FAIL
        )
    ]


def check_temperature(run: Run) -> list[ConformanceRow]:
    """The canary at 1, at T, at 1: no SGLang release applies ``sampling_params.temperature`` to
    input logprobs, and the guard relies on it (``docs/sglang-contract.md`` §1.8)."""
    name = "temperature on input logprobs"
    assumes = "not applied: input logprobs are at T = 1 whatever `sampling_params.temperature`"
    if not takes_temperature(run.teacher):
        return [ConformanceRow(name, assumes, "this client sends no temperature", Result.SKIPPED)]
    if not run.awake:
        return [ConformanceRow(name, assumes, "not measured: not known awake", Result.SKIPPED)]
    m = measure_temperature(run.teacher, run.temperature, run.canary)
    if m is None:
        observed = "the canary is flat: a uniform distribution is the same at every temperature"
        return [ConformanceRow(name, assumes, observed, Result.SKIPPED)]
    t = f"T = {run.temperature:g} against 1: max |Δ| {_num(m['max_abs_delta'])}"
    if m["ignored"]:
        observed = f"not applied ({t}, within {_num(m['bound'])})"
        return [ConformanceRow(name, assumes, observed, Result.PASS)]
    observed = f"APPLIED ({t} > {_num(m['bound'])}, repeat noise {_num(m['repeat_noise'])})"
    return [ConformanceRow(name, assumes, observed, Result.FAIL)]


def check_left_as_found(run: Run) -> ConformanceRow:
    """Last: the teacher awake, its traffic not held, and the canary as at the first measurement;
    anything else is put back as ``probe`` puts it back."""
    name = "left as found"
    assumes = "awake, traffic not held, canary as at the start"
    if run.halted:
        observed = (
            f"UNKNOWN: {run.halted}. Nothing more was sent. Check the server (its log says "
            "whether the last release or resume ran) before using it"
        )
        return ConformanceRow(name, assumes, observed, Result.FAIL)
    restored = ""
    if run.teacher.asleep or any(c.held for c in run.colocated):
        colocated = run.colocated[-1]
        report = ProbeReport(cycles=[])
        restore(colocated, report, None)
        restored = f"put back: {report.interrupted}; "
        if not run.awake or any(c.held for c in run.colocated):
            return ConformanceRow(name, assumes, restored + "not awake", Result.FAIL)
    if run.broken:
        observed = f"{restored}awake; broken before the probe ({codes(run.broken)}), as found"
        return ConformanceRow(name, assumes, observed, Result.FAIL)
    run.canary.accept(run.first)
    found = run.canary.verify(run.teacher, step=run.step + 1)
    cmp = run.canary.last_comparison
    delta = _num(cmp.max_abs_delta if cmp is not None else None)
    if found:
        out = Cycle()
        colocated = (
            run.colocated[-1] if run.colocated else ColocatedTeacher(run.teacher, run.canary)
        )
        run_repair(run, colocated, out, found)
        observed = f"{restored}the canary differed from the start ({codes(found)}): {out.repair}"
        return ConformanceRow(name, assumes, observed, Result.FAIL)
    observed = f"{restored}awake, traffic not held, canary as at the start (max |Δ| {delta})"
    return ConformanceRow(name, assumes, observed, Result.FAIL if restored else Result.PASS)
