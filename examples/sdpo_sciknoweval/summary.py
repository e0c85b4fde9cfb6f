"""What the demo concludes: ``summary.json`` and the table printed at the end."""

from __future__ import annotations

from typing import Any

from examples.sdpo_sciknoweval.arms import ArmSpec, ArmTrace
from examples.sdpo_sciknoweval.faults import FAULTS


def arm_summary(spec: ArmSpec, trace: ArmTrace, halted: bool) -> dict[str, Any]:
    """The per-arm record of ``summary.json`` (keys fixed by the issue)."""
    trained = [r for r in trace.records if "loss" in r]
    return {
        "fault": spec.fault,
        "teacher_cpu_backup": spec.backup,
        "guard_preset": spec.preset,
        "step0_loss": trained[0]["loss"] if trained else None,
        "final_loss": trained[-1]["loss"] if trained else None,
        "entropy_start": trained[0]["student_entropy"] if trained else None,
        "entropy_end": trained[-1]["student_entropy"] if trained else None,
        "eval_accuracy": [
            [r["step"], r["eval_accuracy"]] for r in trace.records if "eval_accuracy" in r
        ],
        "teacher_uniform_fraction": trace.uniform_rows / trace.scored_rows
        if trace.scored_rows
        else 0.0,
        "first_finding": trace.first_finding,
        "repairs": trace.records[-1]["repairs"] if trace.records else 0,
        "halted": halted,
        "poisoned_updates": trace.poisoned_updates,
        "steps": len(trained),
    }


def _fmt(x: Any, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def _first(a: dict[str, Any]) -> str:
    ff = a["first_finding"]
    return f"{ff['code']} @{ff['step']}" if ff else "-"


def format_table(arms: dict[str, dict[str, Any]], fault: str = "none") -> str:
    """The demo's verdict, shaped like the table of the real runs in ``docs/invariants.md`` §1.5;
    under a fault, a title line names it first."""
    w = max([24, *(len(_first(a)) for a in arms.values())])
    head = (
        f"{'arm':<10} {'backup':<6} {'guard':<12} {'step-0 loss':>11} {'entropy':>15} "
        f"{'end loss':>9} {'eval accuracy':>15} {'uniform':>8} {'first finding':<{w}} "
        f"{'repairs':>7} {'poisoned':>8}"
    )
    lines = [head, "-" * len(head)]
    if fault != "none":
        lines.insert(0, f"fault={fault}: {FAULTS[fault]}")
    for name, a in arms.items():
        acc = a["eval_accuracy"]
        first = _first(a)
        lines.append(
            f"{name:<10} {'yes' if a['teacher_cpu_backup'] else 'no':<6} {a['guard_preset']:<12} "
            f"{_fmt(a['step0_loss']):>11} "
            f"{_fmt(a['entropy_start'], '.2f') + ' → ' + _fmt(a['entropy_end'], '.2f'):>15} "
            f"{_fmt(a['final_loss'], '.4f'):>9} "
            f"{_fmt(acc[0][1] if acc else None, '.2f') + ' → ' + _fmt(acc[-1][1] if acc else None, '.2f'):>15} "
            f"{a['teacher_uniform_fraction']:>8.0%} "
            f"{first:<{w}} {a['repairs']:>7} "
            f"{a['poisoned_updates']:>8}"
        )
    return "\n".join(lines)
