"""Replay a metric history through a guard: what it would have found, and when it would have acted."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from distill_guard.alerts import Alerter
from distill_guard.config import build_guard
from distill_guard.findings import Code, Finding, Severity, worst
from distill_guard.history import History
from distill_guard.observations import Metric, RunSpec
from distill_guard.policy import Action, Decision, acting


class FirstAction(NamedTuple):
    """Where the guard would first have changed the run's course, and how."""

    step: int | None
    action: str
    """``skip_batch``, ``rewake`` or ``halt`` (the intended one under ``monitor_only``)."""


@dataclass
class ReplayResult:
    history: History
    preset: str
    findings: list[Finding] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    run: RunSpec = field(default_factory=RunSpec)
    """The run facts the guard judged with (V, loss, β, scale): what the plot's lines show."""

    @property
    def first(self) -> dict[str, int | None]:
        out: dict[str, int | None] = {}
        for f in self.findings:
            out.setdefault(f.code, f.step)
        return out

    @property
    def first_action_decision(self) -> Decision | None:
        """The first decision that would have skipped a batch, rewoken the teacher or halted."""
        return next((d for d in self.decisions if acting(d) is not None), None)

    @property
    def first_action(self) -> FirstAction | None:
        """(step, action name) of the first course change, e.g. ``(40, "rewake")``; None if the
        guard would only have alerted."""
        d = self.first_action_decision
        return None if d is None else FirstAction(d.step, acting(d).value)  # type: ignore[union-attr]

    @property
    def halt_decision(self) -> Decision | None:
        """The first decision that halts (or, monitor-only, would have)."""
        return next((d for d in self.decisions if Action.HALT in (d.action, d.intended)), None)

    @property
    def halt_step(self) -> int | None:
        """Step of the first halt; None if the guard would not have halted."""
        d = self.halt_decision
        return None if d is None else d.step

    @property
    def inferred_vocab_size(self) -> int | None:
        """V as the uniform-teacher check inferred it from a flat logprob column, if it did."""
        for f in self.findings:
            if f.code == Code.TEACHER_UNIFORM and f.values.get("inferred_vocab_size"):
                return int(f.values["inferred_vocab_size"])
        return None

    @property
    def notices(self) -> list[str]:
        """What the replay could not check as asked: a teacher logprob column without V, and
        each column that looks like a role the file has under no known name but was not read."""
        return self._teacher_notices() + [
            f"column '{column}' looks like {role} but was not read; "
            f"map it with --key {role}={column}"
            for column, role in self.history.lookalikes.items()
        ]

    def _teacher_notices(self) -> list[str]:
        column = self.history.keys.get(Metric.TEACHER_LOGPROB)
        if column is None or self.run.vocab_size is not None:
            return []
        head = (
            f"the teacher logprob column '{column}' is present but the vocabulary size is "
            "unknown: the uniform-teacher test (−ln V) ran only by inference from a flat column"
        )
        inferred = self.inferred_vocab_size
        if inferred is not None:
            head += f" (it inferred V = {inferred})"
        return [f"{head}; pass --vocab-size V to make it exact."]

    @property
    def worst(self) -> Severity | None:
        return worst(self.findings)

    def exit_code(self) -> int:
        """0: nothing at warn or above; 1: warnings, or the guard would have repaired or halted."""
        worst = self.worst
        return 1 if worst is not None and worst >= Severity.WARN else 0

    def to_json(self) -> dict[str, Any]:
        first_action = self.first_action
        return {
            "findings": [
                {"step": f.step, "code": f.code, "severity": f.severity.value, "message": f.message}
                for f in self.findings
            ],
            "first": self.first,
            "first_action": first_action._asdict() if first_action else None,
            "halt_step": self.halt_step,
            "notices": self.notices,
        }


def replay(
    history: History,
    preset: str = "default",
    overrides: list[str] | None = None,
    on_step: Callable[[int, int], None] | None = None,
) -> ReplayResult:
    """Feed every step's metrics to a guard built from ``preset``; nothing is sent anywhere.
    ``on_step(done, total)`` after each step: the CLI's progress."""
    result = ReplayResult(history, preset)
    guard = build_guard(
        preset,
        overrides or [],
        events=None,
        alerter=Alerter(use_wandb=False, log_alerts=False),
        on_finding=result.findings.append,
        stop_on_halt=False,
    )
    total = len(history.steps)
    for done, (step, values) in enumerate(history.steps, 1):
        d = guard.on_step_metrics(step, values)
        if d.action is not Action.CONTINUE or d.intended is not None:
            result.decisions.append(d)
        if on_step is not None:
            on_step(done, total)
    result.run = guard.run
    return result


def format_table(result: ReplayResult) -> str:
    """The human summary: notices, per finding code its first step, count and severity, then
    the first action and the halt (the same numbers as ``--json`` and the plot)."""
    h = result.history
    lines = [f"distill_guard replay of {h.path}: {len(h.steps)} steps, preset '{result.preset}'"]
    lines.append("metrics: " + ", ".join(f"{r}={k}" for r, k in sorted(h.keys.items())))
    if h.missing:
        lines.append("not in the file (their checks were skipped): " + _missing(h))
    lines += [f"NOTICE: {n}" for n in result.notices]
    lines.append("")
    if not result.findings:
        lines.append("No findings: the guard would have let this run continue untouched.")
        return "\n".join([*lines, *_action_lines(result)])
    lines += _finding_rows(result)
    lines.append("")
    lines += _action_lines(result)
    lines.append("")
    lines.append("What each finding means (first occurrence):")
    seen: set[str] = set()
    for f in sorted(result.findings, key=lambda f: _order_key(result, f.code)):
        if f.code not in seen:
            seen.add(f.code)
            lines.append(f"- {f.code} (step {f.step}): {f.message}")
    return "\n".join(lines)


def _missing(h: History) -> str:
    """The missing roles, each with the names tried for it."""
    return ", ".join(
        f"{role} (tried {', '.join(h.tried[role])})" if h.tried.get(role) else role
        for role in h.missing
    )


def _order_key(result: ReplayResult, code: str) -> tuple[int, int]:
    """Worst severity first, then earliest first step."""
    rank = max(f.severity.rank for f in result.findings if f.code == code)
    step = result.first[code]
    return -rank, step if step is not None else -1


def _finding_rows(result: ReplayResult) -> list[str]:
    """One row per finding code: its worst severity, first step and count."""
    counts: dict[str, int] = {}
    severity: dict[str, Severity] = {}
    for f in result.findings:
        counts[f.code] = counts.get(f.code, 0) + 1
        if f.code not in severity or f.severity > severity[f.code]:
            severity[f.code] = f.severity
    order = sorted(counts, key=lambda c: _order_key(result, c))
    width = max(len(c) for c in order)
    first = result.first
    rows = [f"{'finding':<{width}}  {'severity':<8}  {'first step':>10}  {'count':>6}"]
    for code in order:
        rows.append(
            f"{code:<{width}}  {severity[code].value:<8}  {first[code]!s:>10}  {counts[code]:>6}"
        )
    return rows


def _action_lines(result: ReplayResult) -> list[str]:
    """The first action and the halt, each with its reason, or that there was none."""
    first, act = result.first_action, result.first_action_decision
    if first is None or act is None:
        alerted = ": the guard would only have alerted" if result.findings else ""
        lines = [f"First action: none{alerted}."]
    else:
        lines = [f"First action: {first.action} at step {first.step} (reason: {act.message})."]
    halt = result.halt_decision
    lines.append(
        "Halt: none." if halt is None else f"Halt: step {halt.step} (reason: {halt.message})."
    )
    return lines
