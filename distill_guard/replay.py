"""Replay a metric history through a guard: what it would have found, and when it would have acted."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from distill_guard.alerts import Alerter
from distill_guard.config import build_guard
from distill_guard.findings import Finding, Severity, worst
from distill_guard.history import History
from distill_guard.policy import Action, Decision


@dataclass
class ReplayResult:
    history: History
    preset: str
    findings: list[Finding] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)

    @property
    def first(self) -> dict[str, int | None]:
        out: dict[str, int | None] = {}
        for f in self.findings:
            out.setdefault(f.code, f.step)
        return out

    @property
    def halt_step(self) -> int | None:
        """First step whose decision is rewake or halt (what an acting guard would have done)."""
        for d in self.decisions:
            if Action.REWAKE in (d.action, d.intended) or Action.HALT in (d.action, d.intended):
                return d.step
        return None

    @property
    def worst(self) -> Severity | None:
        return worst(self.findings)

    def exit_code(self) -> int:
        """0: nothing at warn or above; 1: warnings, or the guard would have repaired or halted."""
        worst = self.worst
        return 1 if worst is not None and worst >= Severity.WARN else 0

    def to_json(self) -> dict[str, Any]:
        return {
            "findings": [
                {"step": f.step, "code": f.code, "severity": f.severity.value, "message": f.message}
                for f in self.findings
            ],
            "first": self.first,
            "halt_step": self.halt_step,
        }


def replay(
    history: History, preset: str = "default", overrides: list[str] | None = None
) -> ReplayResult:
    """Feed every step's metrics to a guard built from ``preset``; nothing is sent anywhere."""
    result = ReplayResult(history, preset)
    guard = build_guard(
        preset,
        overrides or [],
        events=None,
        alerter=Alerter(use_wandb=False, log_alerts=False),
        on_finding=result.findings.append,
        stop_on_halt=False,
    )
    for step, values in history.steps:
        d = guard.on_step_metrics(step, values)
        if d.action is not Action.CONTINUE or d.intended is not None:
            result.decisions.append(d)
    return result


def format_table(result: ReplayResult) -> str:
    """The human summary: per finding code its first step, count and severity, then decisions."""
    h = result.history
    first = result.first
    counts: dict[str, int] = {}
    severity: dict[str, Severity] = {}
    message: dict[str, str] = {}
    for f in result.findings:
        counts[f.code] = counts.get(f.code, 0) + 1
        if f.code not in severity or f.severity > severity[f.code]:
            severity[f.code] = f.severity
        message.setdefault(f.code, f.message)
    lines = [f"distill_guard replay of {h.path}: {len(h.steps)} steps, preset '{result.preset}'"]
    lines.append("metrics: " + ", ".join(f"{r}={k}" for r, k in sorted(h.keys.items())))
    if h.missing:
        lines.append("not in the file (their checks were skipped): " + ", ".join(h.missing))
    lines.append("")
    if not counts:
        lines.append("No findings: the guard would have let this run continue untouched.")
        return "\n".join(lines)
    order = sorted(
        counts, key=lambda c: (-severity[c].rank, first[c] if first[c] is not None else -1)
    )
    width = max(len(c) for c in order)
    lines.append(f"{'finding':<{width}}  {'severity':<8}  {'first step':>10}  {'count':>6}")
    for code in order:
        lines.append(
            f"{code:<{width}}  {severity[code].value:<8}  {first[code]!s:>10}  {counts[code]:>6}"
        )
    lines.append("")
    acted: dict[str, int | None] = {}
    for d in result.decisions:
        for a in (d.action, d.intended):
            if a is not None and a is not Action.CONTINUE:
                acted.setdefault(a.value, d.step)
    if result.halt_step is None:
        lines.append("Decision: alert only; the guard would not have repaired or halted.")
    else:
        steps = ", ".join(
            f"{a} at step {s}" for a, s in sorted(acted.items(), key=lambda kv: kv[1])
        )
        lines.append(f"Decision: {steps}.")
        halt = next((d for d in result.decisions if Action.HALT in (d.action, d.intended)), None)
        if halt is not None:
            lines.append(f"  halt reason: {halt.message}")
    lines.append("")
    lines.append("What each finding means (first occurrence):")
    for code in order:
        lines.append(f"- {code} (step {first[code]}): {message[code]}")
    return "\n".join(lines)
