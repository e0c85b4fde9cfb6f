"""Pictures of what the guard saw: the replay timeline with its findings marked.

:func:`replay_figure` builds the figure (for tests and notebooks), :func:`plot_replay` writes it
to a file. Neither touches pyplot's global state.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from distill_guard.extras import needed
from distill_guard.findings import Severity
from distill_guard.observations import Metric
from distill_guard.replay import acting

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    from distill_guard.replay import ReplayResult

PANELS = (
    (Metric.LOSS, "loss"),
    (Metric.STUDENT_ENTROPY, "student entropy (nats)"),
    (Metric.TEACHER_LOGPROB, "teacher logprob"),
    (Metric.TRUNCATED_RATIO, "truncated ratio"),
    (Metric.EVAL_ACCURACY, "eval accuracy"),
)
MIN_HALF_SPAN_ABS = 0.025
"""A panel's y-range is at least ±this around a (near-)constant series..."""
MIN_HALF_SPAN_REL = 0.05
"""...or ±this fraction of its magnitude, whichever is larger: no 1e-6 autoscale noise."""
NEAR_FACTOR = 3.0
"""A reference line joins the y-range only if that widens it at most this many times; otherwise
it would flatten the data, and its value is given in the legend instead."""
NO_VOCAB_LABEL = "−ln V not drawn: V unknown (pass --vocab-size)"
FIRST_ACTION_STYLE = {"color": "black", "ls": "--", "lw": 1.2}
HALT_STYLE = {"color": "black", "ls": ":", "lw": 2.0}
STRIP_ROWS = {  # row of the guard strip → (label, mark style); drawn top to bottom in this order
    "findings": ("findings at warn+", {"marker": "|", "color": "tab:orange", "ms": 8}),
    "skip_batch": ("skip_batch", {"marker": "x", "color": "black", "ms": 6, "mew": 1.5}),
    "rewake": ("rewake: teacher reload + verify", {"marker": "^", "color": "tab:blue", "ms": 5}),
    "repaired": ("repaired (reload verified)", {"marker": "^", "color": "tab:green", "ms": 5}),
    "halt": ("halt", {"marker": "X", "color": "black", "ms": 10}),
}
ACTION_ROWS = ("skip_batch", "rewake", "halt")
"""Rows that are the guard's actions: under monitor_only they are what it would have done."""


@dataclass(frozen=True)
class RefLine:
    """A horizontal line a panel's series is judged against (a ceiling, ±ln V)."""

    value: float
    label: str


def reference_lines(result: ReplayResult, role: str) -> list[RefLine]:
    """The bound each panel is judged against: the JSD ceiling H(β) (times the loss scale) on
    the loss, ln V on the student entropy, −ln V on the teacher logprob (V given or inferred)."""
    run = result.run
    if role == Metric.LOSS and run.loss_ceiling is not None:
        value = run.loss_ceiling * run.loss_scale
        scale = f" × {run.loss_scale:g}" if run.loss_scale != 1 else ""
        return [RefLine(value, f"JSD ceiling H(β={run.beta:g}){scale} = {value:.3f}")]
    if role == Metric.STUDENT_ENTROPY and run.vocab_size:
        return [
            RefLine(math.log(run.vocab_size), f"ln V (V={run.vocab_size}) = {run.log_vocab:.3f}")
        ]
    if role == Metric.TEACHER_LOGPROB:
        vocab, how = run.vocab_size, "V="
        if not vocab:
            vocab, how = result.inferred_vocab_size, "inferred V="
        if vocab:
            value = -math.log(vocab)
            return [RefLine(value, f"−ln V ({how}{vocab}) = {_num(value)}")]
    return []


def _num(value: float) -> str:
    """Three decimals with a true minus sign, as on the tick labels."""
    return f"{value:.3f}".replace("-", "−")


def y_limits(values: Sequence[float], refs: Sequence[RefLine]) -> tuple[float, float, set[int]]:
    """(low, high, indices of the refs inside): the data padded to a minimum span, widened to
    each reference line that is near enough to show without flattening the data."""
    lo, hi = min(values), max(values)
    half = max((hi - lo) / 2, MIN_HALF_SPAN_ABS, MIN_HALF_SPAN_REL * max(abs(lo), abs(hi)))
    mid = (lo + hi) / 2
    lo, hi = mid - half, mid + half
    inside: set[int] = set()
    for i, ref in enumerate(refs):
        new_lo, new_hi = min(lo, ref.value), max(hi, ref.value)
        if new_hi - new_lo <= NEAR_FACTOR * (hi - lo):
            inside.add(i)
    for i in inside:
        lo, hi = min(lo, refs[i].value), max(hi, refs[i].value)
    margin = 0.06 * (hi - lo)
    return lo - margin, hi + margin, inside


def _series(result: ReplayResult, role: str) -> list[tuple[int, float]]:
    return [(s, v[role]) for s, v in result.history.steps if role in v and math.isfinite(v[role])]


def _draw_panel(ax: Axes, result: ReplayResult, role: str, ylabel: str) -> None:
    """The series, its reference lines and the panel legend; y-range without offset noise."""
    pts = _series(result, role)
    refs = reference_lines(result, role)
    if pts:
        ax.plot(
            *zip(*pts),
            lw=1.2,
            marker="." if len(pts) < 60 else None,
            color="tab:blue",
            label=result.history.keys[role],
        )
        lo, hi, inside = y_limits([v for _, v in pts], refs)
        ax.set_ylim(lo, hi)
    else:
        inside = set(range(len(refs)))
    top = ax.get_ylim()[1]
    for i, ref in enumerate(refs):
        where = "" if i in inside else f" (off scale, {'above' if ref.value > top else 'below'})"
        ax.axhline(ref.value, color="tab:gray", ls="-.", lw=1.0, label=ref.label + where)
    if role == Metric.TEACHER_LOGPROB and not refs:
        ax.plot([], [], " ", label=NO_VOCAB_LABEL)
    ax.ticklabel_format(axis="y", useOffset=False)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)


def _draw_markers(axes: Sequence[Axes], result: ReplayResult) -> list[tuple[Line2D | Patch, str]]:
    """Vertical lines on every panel: each finding code's first step (one colour per code), the
    first action and the halt. Returns one (line, label) per mark, for the figure legend."""
    from matplotlib import colormaps

    palette = colormaps["tab10"].colors
    marks: list[tuple[float, dict, str]] = []
    firsts = [(c, s) for c, s in result.first.items() if s is not None]
    for i, (code, step) in enumerate(sorted(firsts, key=lambda cs: (cs[1], cs[0]))):
        style = {"color": palette[(i + 1) % len(palette)], "ls": "-", "lw": 1.0, "alpha": 0.8}
        marks.append((step, style, f"{code} (first at step {step})"))
    first_action = result.first_action
    if first_action is not None and first_action.step is not None:
        label = f"first action: {first_action.action} at step {first_action.step}"
        marks.append((first_action.step, FIRST_ACTION_STYLE, label))
    if result.halt_step is not None:
        marks.append((result.halt_step, HALT_STYLE, f"halt at step {result.halt_step}"))
    legend: list[tuple[Line2D | Patch, str]] = []
    for n, ax in enumerate(axes):
        for step, style, label in marks:
            line = ax.axvline(step, **style, label="_nolegend_")
            if n == 0:
                legend.append((line, label))
    return legend


def action_steps(result: ReplayResult) -> tuple[dict[str, list[int]], set[str]]:
    """The steps of each row of the guard strip, and the action rows only intended (monitor_only,
    or a rewake with no live teacher to reload). Rows: findings at warn or above; the guard's
    skips, rewakes (reload and verify the teacher: a repair) and halt, up to the first halt (the
    run stops there); ``repaired`` where a decision records a repair carried out."""
    rows: dict[str, set[int]] = {row: set() for row in STRIP_ROWS}
    done: set[str] = set()
    for f in result.findings:
        if f.step is not None and f.severity.rank >= Severity.WARN.rank:
            rows["findings"].add(f.step)
    halt = result.halt_step
    for d in result.decisions:
        if d.step is None or (halt is not None and d.step > halt):
            continue
        action = acting(d)
        if action is not None:
            rows[action.value].add(d.step)
            if d.action is action:
                done.add(action.value)
        if d.repaired:
            rows["repaired"].add(d.step)
    intended = {row for row in ACTION_ROWS if rows[row] and row not in done}
    return {row: sorted(steps) for row, steps in rows.items()}, intended


def _draw_guard_strip(ax: Axes, result: ReplayResult) -> None:
    """One row per kind of guard event, a mark at each step it happened, its count in the row's
    label; rows with nothing are left out."""
    steps_of, intended = action_steps(result)
    rows = [(row, steps) for row, steps in steps_of.items() if steps]
    ticks = []
    for y, (row, steps) in enumerate(reversed(rows)):
        ax.plot(steps, [y] * len(steps), ls="none", label="_nolegend_", **STRIP_ROWS[row][1])
        label = STRIP_ROWS[row][0] + (" (intended)" if row in intended else "")
        ticks.append((y, f"{label}: {len(steps)} step{'s' if len(steps) != 1 else ''}"))
    if not ticks:
        ticks.append((0, "no findings, no actions"))
    ax.set_yticks([y for y, _ in ticks], [t for _, t in ticks], fontsize=7)
    ax.set_ylim(-0.6, max(len(ticks), 1) - 0.4)
    ax.set_ylabel("guard", fontsize=8)
    ax.tick_params(axis="x", labelsize=7)
    ax.grid(axis="x", alpha=0.3)


def _shade_after_halt(axes: Sequence[Axes], result: ReplayResult) -> list[tuple[Patch, str]]:
    """Grey out the steps after the halt on every panel: the run would have stopped there."""
    halt, steps = result.halt_step, result.history.steps
    if halt is None or not steps or steps[-1][0] <= halt:
        return []
    patch = None
    for ax in axes:
        patch = ax.axvspan(halt, steps[-1][0], color="0.85", alpha=0.5, lw=0, zorder=0)
    assert patch is not None
    return [(patch, "after the halt: the run would have stopped")]


def replay_figure(result: ReplayResult) -> Figure:
    """One panel per metric present, each with its reference line and legend; findings, first
    action and halt as vertical lines, named in a legend under the panels; a strip under them
    with a mark per step where the guard found, skipped, rewoke (repaired) or halted."""
    with needed("the replay plot (--plot)", "plot"):
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

    panels = [(r, label) for r, label in PANELS if r in result.history.keys]
    fig = Figure(figsize=(11, 2.0 * len(panels) + 2.2), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(
        len(panels) + 1,
        1,
        sharex=True,
        squeeze=False,
        gridspec_kw={"height_ratios": [2.0] * len(panels) + [1.2]},
    )[:, 0]
    markers = _draw_markers(axes, result)
    markers += _shade_after_halt(axes, result)
    for ax, (role, label) in zip(axes, panels):
        _draw_panel(ax, result, role, label)
    _draw_guard_strip(axes[-1], result)
    axes[-1].set_xlabel("step", fontsize=8)
    if markers:
        handles, labels = zip(*markers)
        fig.legend(
            handles,
            labels,
            loc="outside lower center",
            ncols=min(3, len(markers)),
            fontsize=7,
            frameon=False,
        )
    run = result.run
    vocab = f", V={run.vocab_size}" if run.vocab_size else ", V unknown"
    fig.suptitle(
        f"distill_guard replay: {os.path.basename(result.history.path)} "
        f"(preset {result.preset}, {run.loss.value}, β={run.beta:g}{vocab})",
        fontsize=10,
    )
    return fig


def plot_replay(result: ReplayResult, path: str | os.PathLike[str]) -> None:
    """Write :func:`replay_figure` to ``path`` (PNG, SVG, PDF: by its suffix)."""
    replay_figure(result).savefig(path, dpi=110)
