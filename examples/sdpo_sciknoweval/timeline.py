"""``timeline.png``: every arm step by step, against the bounds the guard judges with, and what the
guard did at each step (skips, repairs, halt), so the picture tells the demo's story alone."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from distill_guard.report import RefLine, y_limits
from examples.sdpo_sciknoweval.arms import ArmTrace

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

PANELS = (
    ("loss", "JSD loss (nats)"),
    ("student_entropy", "student entropy (nats)"),
    ("teacher_logprob", "teacher logprob of\nsampled tokens"),
    ("eval_accuracy", "eval accuracy"),
)
STYLES = {  # healthy as a wide band under a dashed guarded line: when the repairs work they coincide
    "healthy": {"color": "tab:green", "lw": 4.0, "alpha": 0.45},
    "unguarded": {"color": "tab:red", "lw": 1.4},
    "guarded": {"color": "tab:blue", "lw": 1.4, "ls": "--"},
}
MARKS = {  # the guard strip: one row per arm, one mark per step where something happened
    "poisoned": {"marker": "s", "color": "tab:red", "ms": 4, "ls": "none"},
    "skipped": {"marker": "x", "color": "black", "ms": 6, "ls": "none", "mew": 1.5},
    "repair": {"marker": "^", "color": "tab:blue", "ms": 5, "ls": "none"},
    "first": {"marker": "D", "color": "tab:orange", "ms": 7, "ls": "none", "mfc": "none"},
    "halt": {"marker": "X", "color": "black", "ms": 11, "ls": "none"},
}
MARK_LABELS = {
    "poisoned": "update taken on poisoned teacher scores",
    "skipped": "update skipped by the guard",
    "repair": "repair: teacher reloaded and verified",
    "first": "guard's first finding",
    "halt": "halt",
}


@dataclass(frozen=True)
class Bounds:
    """What the panels are judged against: the JSD ceiling H(β) (times the loss scale) and V."""

    beta: float
    vocab_size: int
    loss_scale: float = 1.0

    @property
    def ceiling(self) -> float:
        b = self.beta
        return -(b * math.log(b) + (1 - b) * math.log(1 - b)) * self.loss_scale

    def lines(self, key: str) -> list[RefLine]:
        ln_v = math.log(self.vocab_size)
        if key == "loss":
            scale = f" × {self.loss_scale:g}" if self.loss_scale != 1 else ""
            name = "ln 2" if self.beta == 0.5 else f"H(β={self.beta:g})"
            return [RefLine(self.ceiling, f"JSD ceiling {name}{scale} = {self.ceiling:.3g}")]
        if key == "student_entropy":
            return [RefLine(ln_v, f"ln V (V={self.vocab_size}) = {ln_v:.2f}: uniform student")]
        if key == "teacher_logprob":
            return [RefLine(-ln_v, f"−ln V = −{ln_v:.2f}: uniform (dead) teacher")]
        return []


def arm_label(name: str, summary: dict[str, Any]) -> str:
    """The arm as a legend names it: its teacher's CPU backup, fault and guard preset."""
    backup = "CPU backup" if summary["teacher_cpu_backup"] else "no CPU backup"
    fault = summary.get("fault", "none")
    acts = "watches only" if summary["guard_preset"] == "monitor_only" else "acts"
    parts = [backup] + ([f"fault {fault}"] if fault != "none" else [])
    return f"{name} ({', '.join(parts)}; guard {summary['guard_preset']}: {acts})"


def step_marks(trace: ArmTrace) -> dict[str, list[int]]:
    """The steps of each guard-strip mark, read from the arm's records."""
    marks: dict[str, list[int]] = {k: [] for k in MARKS}
    repairs = 0
    for r in trace.records:
        if "loss" not in r:
            continue
        if r.get("poisoned"):
            marks["poisoned"].append(r["step"])
        if not r.get("trained", True):
            marks["skipped"].append(r["step"])
        if r["repairs"] > repairs:
            marks["repair"].append(r["step"])
        repairs = r["repairs"]
    if trace.first_finding is not None:
        marks["first"].append(trace.first_finding["step"])
    if trace.halted and trace.records:
        marks["halt"].append(trace.records[-1]["step"])
    return marks


def _draw_panel(
    ax: Axes, key: str, ylabel: str, traces: dict[str, ArmTrace], bounds: Bounds
) -> None:
    values: list[float] = []
    for name, trace in traces.items():
        pts = [(r["step"], r[key]) for r in trace.records if r.get(key) is not None]
        if pts:
            values += [v for _, v in pts]
            marker = "o" if key == "eval_accuracy" else None
            ax.plot(*zip(*pts), marker=marker, ms=3, label="_nolegend_", **STYLES.get(name, {}))
    refs = bounds.lines(key)
    inside = set(range(len(refs)))
    if values:
        lo, hi, inside = y_limits(values, refs)
        ax.set_ylim(lo, hi)
    top = ax.get_ylim()[1]
    for i, ref in enumerate(refs):
        if i in inside:
            ax.axhline(ref.value, color="tab:gray", ls="-.", lw=1.2, label=ref.label)
        else:  # far off: named in the legend, not drawn (it would flatten the data)
            where = "above" if ref.value > top else "below"
            ax.plot([], [], " ", label=f"{ref.label} (off scale, {where})")
    ax.ticklabel_format(axis="y", useOffset=False)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    if refs:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)


def _draw_guard_strip(
    ax: Axes, traces: dict[str, ArmTrace], summaries: dict[str, dict[str, Any]]
) -> None:
    names = list(traces)
    used: set[str] = set()
    ticks = []
    for row, name in enumerate(names):
        y = len(names) - 1 - row
        marks = step_marks(traces[name])
        for kind, steps in marks.items():
            if steps:
                ax.plot(steps, [y] * len(steps), label="_nolegend_", **MARKS[kind])
                used.add(kind)
        a = summaries[name]
        first = a["first_finding"]
        said = f"first: {first['code']} @{first['step']}" if first else "no finding"
        halt = ", halted" if a["halted"] else ""
        ticks.append(
            (y, f"{name}: {a['poisoned_updates']} poisoned, {a['repairs']} repairs{halt}\n{said}")
        )
    ax.set_yticks([y for y, _ in ticks], [t for _, t in ticks], fontsize=7)
    ax.set_ylim(-0.6, len(names) - 0.4)
    ax.set_ylabel("guard", fontsize=8)
    ax.tick_params(axis="x", labelsize=7)
    ax.grid(axis="x", alpha=0.3)
    for kind in MARKS:
        if kind in used:
            ax.plot([], [], label=MARK_LABELS[kind], **MARKS[kind])
    if used:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)


def timeline_figure(
    traces: dict[str, ArmTrace],
    summaries: dict[str, dict[str, Any]],
    bounds: Bounds,
    fault: str = "none",
) -> Figure:
    """Loss, student entropy, teacher logprob and eval accuracy of every arm against their
    bounds, and a strip of what the guard did at each step; arms named with their backup."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    fig = Figure(figsize=(11, 10.5), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(
        len(PANELS) + 1, 1, sharex=True, gridspec_kw={"height_ratios": [3] * len(PANELS) + [2]}
    )
    for ax, (key, label) in zip(axes, PANELS):
        _draw_panel(ax, key, label, traces, bounds)
    _draw_guard_strip(axes[-1], traces, summaries)
    for trace in traces.values():
        if trace.halted and trace.records:
            for ax in axes[:-1]:
                ax.axvline(trace.records[-1]["step"], color="black", ls=":", lw=1.5)
    axes[-1].set_xlabel("step", fontsize=8)
    title = "SDPO miniature: the teacher is slept and woken every step"
    if fault != "none":
        title += f"; fault={fault}"
    fig.legend(  # the arms, under the title: what each line is
        [Line2D([], [], **STYLES.get(name, {})) for name in traces],
        [arm_label(name, summaries[name]) for name in traces],
        loc="outside upper center",
        fontsize=8,
        frameon=False,
        title=title,
        title_fontsize=10,
    )
    return fig


def plot_timeline(
    traces: dict[str, ArmTrace],
    summaries: dict[str, dict[str, Any]],
    bounds: Bounds,
    path: str | os.PathLike[str],
    fault: str = "none",
) -> None:
    """Write :func:`timeline_figure` to ``path``."""
    timeline_figure(traces, summaries, bounds, fault).savefig(path, dpi=90)
