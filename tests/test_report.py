"""Report: the replay timeline plot and the human summary table."""

from __future__ import annotations

import dataclasses
import math
import struct

import pytest
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.text import Text
from matplotlib.transforms import Bbox

from distill_guard.findings import Code, Finding, Severity
from distill_guard.history import load_history
from distill_guard.observations import Metric
from distill_guard.replay import ReplayResult, format_table, replay
from distill_guard.report import NO_VOCAB_LABEL, RefLine, plot_replay, replay_figure, y_limits
from distill_guard.testing.histories import collapsed_history, healthy_history
from tests.conftest import LN_QWEN3_V, QWEN3_V, write_jsonl

LN2 = math.log(2)


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])


@pytest.fixture
def collapsed_result(tmp_path) -> ReplayResult:
    path = write_jsonl(collapsed_history(), tmp_path / "collapsed.jsonl")
    return replay(load_history(path), "default", [f"run.vocab_size={QWEN3_V}"])


def test_plot_has_one_panel_per_metric_present(tmp_path, collapsed_result):
    full = tmp_path / "full.png"
    plot_replay(collapsed_result, full)
    loss_only = write_jsonl(
        (
            {"train/step": r["train/step"], "train/loss": r["train/loss"]}
            for r in collapsed_history()
        ),
        tmp_path / "loss.jsonl",
    )
    small = tmp_path / "small.png"
    plot_replay(replay(load_history(loss_only)), small)
    (w_full, h_full), (w_small, h_small) = png_size(full), png_size(small)
    assert w_full == w_small
    # four panels (loss, entropy, truncation, eval) vs one, each over the guard strip: the
    # figure grows with them
    assert h_full > 2.2 * h_small


def test_plot_of_a_run_without_findings_and_with_nan(tmp_path):
    rows = list(healthy_history(30, spike_step=None))
    rows[3]["train/loss"] = float("nan")
    rows[4]["rollout/teacher_log_probs"] = float("inf")
    result = replay(load_history(write_jsonl(rows, tmp_path / "h.jsonl")))
    out = tmp_path / "h.png"
    plot_replay(result, out)
    assert png_size(out)[0] > 0


def test_table_counts_and_first_steps_match_the_findings(collapsed_result):
    table = format_table(collapsed_result)
    counts: dict[str, int] = {}
    for f in collapsed_result.findings:
        counts[f.code] = counts.get(f.code, 0) + 1
    assert counts, "the collapsed run should have findings"
    rows = {
        ln.split()[0]: ln.split()
        for ln in table.splitlines()
        if ln.split() and ln.split()[0] in counts
    }
    assert set(rows) == set(counts)
    for code, parts in rows.items():
        assert int(parts[3]) == counts[code]
        assert int(parts[2]) == collapsed_result.first[code]
    # ordered worst first
    order = [ln.split()[0] for ln in table.splitlines() if ln.split() and ln.split()[0] in counts]
    ranks = [max(f.severity.rank for f in collapsed_result.findings if f.code == c) for c in order]
    assert ranks == sorted(ranks, reverse=True)
    assert f"- {Code.LOSS_JSD_CEILING} (step 0):" in table
    assert "First action: rewake at step 0 (reason: " in table
    # the step-0 critical nothing could act on, confirmed by the student at step 3
    assert "\nHalt: step 3 (reason: halt: an open teacher-attributed critical" in table


def test_table_gives_the_halt_reason(tmp_path):
    rows = [{"train/step": t, "train/loss": 0.69} for t in range(5)]
    result = replay(load_history(write_jsonl(rows, tmp_path / "dead.jsonl")))
    assert result.first_action == (0, "rewake")
    assert result.halt_step == 2  # the default preset halts after 3 critical steps
    table = format_table(result)
    assert "First action: rewake at step 0 (reason: rewake: " in table
    assert "Halt: step 2 (reason: halt: critical findings on 3 consecutive steps" in table


def test_table_of_a_quiet_run(tmp_path):
    path = write_jsonl(healthy_history(60, spike_step=None), tmp_path / "q.jsonl")
    table = format_table(replay(load_history(path)))
    assert "No findings" in table and "60 steps" in table
    assert "First action: none" in table and "Halt: none." in table


def test_replay_result_exit_code_and_worst(collapsed_result, tmp_path):
    assert collapsed_result.exit_code() == 1
    assert collapsed_result.worst.value == "critical"
    empty = ReplayResult(collapsed_result.history, "default")
    assert empty.exit_code() == 0 and empty.worst is None
    assert empty.first_action is None and empty.halt_step is None


# ---------------------------------------------------------------- the plot's contents


def legend_texts(fig: Figure) -> list[str]:
    """Every legend entry of the figure: the panels' and the figure's own."""
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend()] + list(fig.legends)
    return [t.get_text() for lg in legends for t in lg.get_texts()]


def panel(fig: Figure, ylabel: str) -> Axes:
    return next(ax for ax in fig.axes if ax.get_ylabel() == ylabel)


def drawn_texts(fig: Figure, monkeypatch) -> list[tuple[str, Bbox]]:
    """(text, window box) of every non-empty text the renderer actually draws: tick labels
    outside the view and hidden shared-axis labels are not drawn, so they do not count."""
    drawn: list[tuple[str, Bbox]] = []
    draw = Text.draw

    def spy(self, renderer):
        draw(self, renderer)
        if self.get_visible() and self.get_text().strip():
            drawn.append((self.get_text(), self.get_window_extent(renderer)))

    monkeypatch.setattr(Text, "draw", spy)
    fig.canvas.draw()
    monkeypatch.undo()
    return drawn


def overlapping(texts: list[tuple[str, Bbox]]) -> list[tuple[str, str]]:
    """Pairs of drawn texts whose boxes overlap by more than a pixel."""
    out = []
    for i, (a, box_a) in enumerate(texts):
        for b, box_b in texts[i + 1 :]:
            w = min(box_a.x1, box_b.x1) - max(box_a.x0, box_b.x0)
            h = min(box_a.y1, box_b.y1) - max(box_a.y0, box_b.y0)
            if w > 1 and h > 1:
                out.append((a, b))
    return out


def ceiling_from_step_40(tmp_path, vocab: bool = True) -> ReplayResult:
    """Healthy for 40 steps, then the loss at the JSD ceiling: rewake at 40, halt at 42."""
    rows = list(healthy_history(80, seed=0, spike_step=None))
    for r in rows[40:]:
        r["train/loss"] = 0.69
    path = write_jsonl(rows, tmp_path / "ceiling40.jsonl")
    return replay(load_history(path), "default", [f"run.vocab_size={QWEN3_V}"] if vocab else [])


def test_plot_draws_the_bounds_first_action_and_halt_in_legends(tmp_path):
    fig = replay_figure(ceiling_from_step_40(tmp_path))
    texts = legend_texts(fig)
    assert "JSD ceiling H(β=0.5) = 0.693" in texts
    assert any(t.startswith(f"ln V (V={QWEN3_V}) = 11.931") for t in texts)
    assert any(t.startswith(f"−ln V (V={QWEN3_V}) = −11.931") for t in texts)
    assert "first action: rewake at step 40" in texts and "halt at step 42" in texts
    assert f"{Code.LOSS_JSD_CEILING} (first at step 40)" in texts
    for ax in fig.axes[:-1]:  # a legend in every panel: its series, its bound where it has one
        assert ax.get_legend() is not None
    assert fig.axes[-1] is strip(fig)  # the guard strip names its rows on the y axis instead
    # the loss reaches the ceiling: the ceiling line is inside the panel, not noted off scale
    loss = panel(fig, "loss")
    low, high = loss.get_ylim()
    assert low < LN2 < high
    # the student's entropy (0.41) is far from ln V: kept off scale, its value in the legend
    entropy = panel(fig, "student entropy (nats)")
    assert entropy.get_ylim()[1] < 1.0
    assert f"ln V (V={QWEN3_V}) = 11.931 (off scale, above)" in texts


def test_plot_without_vocab_size_says_so_and_keeps_the_ceiling(tmp_path):
    fig = replay_figure(ceiling_from_step_40(tmp_path, vocab=False))
    texts = legend_texts(fig)
    assert "JSD ceiling H(β=0.5) = 0.693" in texts
    assert NO_VOCAB_LABEL in texts
    assert not any("ln V (V=" in t for t in texts)


def test_plot_draws_minus_ln_v_as_inferred_by_the_check(collapsed_result):
    """A uniform-teacher finding that inferred V from a flat column gives the panel its line."""
    history = collapsed_result.history
    steps = [(s, {**v, Metric.TEACHER_LOGPROB: -LN_QWEN3_V}) for s, v in history.steps]
    keys = {**history.keys, Metric.TEACHER_LOGPROB: "rollout/teacher_log_probs"}
    inferred = Finding(
        Code.TEACHER_UNIFORM, Severity.CRITICAL, "flat", 0, {"inferred_vocab_size": QWEN3_V}
    )
    result = ReplayResult(dataclasses.replace(history, steps=steps, keys=keys), "default")
    result.findings.append(inferred)
    texts = legend_texts(replay_figure(result))
    assert f"−ln V (inferred V={QWEN3_V}) = −11.931" in texts
    assert f"inferred V = {QWEN3_V}" in result.notices[0]


@pytest.mark.parametrize("value", [0.69, -LN_QWEN3_V, 0.0, 1e-4])
def test_a_constant_series_gets_a_readable_y_range_not_offset_noise(tmp_path, value):
    rows = [
        {"train/step": t, "train/loss": 0.02, "rollout/teacher_log_probs": value} for t in range(80)
    ]
    path = write_jsonl(rows, tmp_path / "flat.jsonl")
    fig = replay_figure(replay(load_history(path), "default", [f"run.vocab_size={QWEN3_V}"]))
    fig.canvas.draw()
    for ax in fig.axes:
        low, high = ax.get_ylim()
        assert high - low >= 0.05
        assert ax.yaxis.get_offset_text().get_text() == ""  # no "+1.1931e1" above the axis
    teacher = panel(fig, "teacher logprob")
    low, high = teacher.get_ylim()
    assert low < value < high
    if value == -LN_QWEN3_V:  # pinned at −ln V: the line is in view, the value plain
        assert low < -LN_QWEN3_V < high


def test_y_limits_keep_near_bounds_in_view_and_far_ones_out():
    low, high, inside = y_limits([0.0, 0.69], [RefLine(LN2, "ceiling")])
    assert inside == {0} and low < 0.0 and high > LN2
    low, high, inside = y_limits([0.41, 0.42], [RefLine(11.93, "ln V")])
    assert inside == set() and high < 1.0
    low, high, _ = y_limits([5.0, 5.0], [])
    assert high - low >= 0.5  # ±5 % of the magnitude


def test_finding_markers_have_distinct_colours_and_no_labels_collide(collapsed_result, monkeypatch):
    fig = replay_figure(collapsed_result)
    codes = sorted({f.code for f in collapsed_result.findings})
    assert len(codes) >= 4
    [figure_legend] = fig.legends
    entries = dict(
        zip([t.get_text() for t in figure_legend.get_texts()], figure_legend.legend_handles)
    )
    colours = [
        tuple(entries[f"{c} (first at step {collapsed_result.first[c]})"].get_color())
        for c in codes
    ]
    assert len(set(colours)) == len(codes)
    texts = drawn_texts(fig, monkeypatch)
    assert any(t == "JSD ceiling H(β=0.5) = 0.693" for t, _ in texts)
    assert overlapping(texts) == []
    assert not any(t.get_rotation() for t in fig.findobj(Text) if t.get_text() in codes)


def test_no_labels_collide_on_the_rewake_then_halt_run(tmp_path, monkeypatch):
    texts = drawn_texts(replay_figure(ceiling_from_step_40(tmp_path)), monkeypatch)
    assert {"first action: rewake at step 40", "halt at step 42"} <= {t for t, _ in texts}
    assert overlapping(texts) == []


# ---------------------------------------------------------------- the guard strip


def strip(fig: Figure) -> Axes:
    return panel(fig, "guard")


def marks(ax: Axes, marker: str) -> list[float]:
    """The x of every point drawn with ``marker`` on ``ax``."""
    return [x for line in ax.get_lines() if line.get_marker() == marker for x in line.get_xdata()]


def test_the_guard_strip_marks_each_rewake_and_the_halt_with_their_counts(tmp_path):
    result = ceiling_from_step_40(tmp_path)
    fig = replay_figure(result)
    ax = strip(fig)
    assert marks(ax, "^") == [40, 41]  # the rewakes (reloads) before the halt
    assert marks(ax, "X") == [42]  # the halt, once: the run stops there
    assert sorted(marks(ax, "|")) == list(range(40, 80))  # every critical step, after it too
    # top to bottom: findings, the rewakes (intended: a replay has no live teacher), the halt
    assert [t.get_text() for t in ax.get_yticklabels()][::-1] == [
        "findings at warn+: 40 steps",
        "rewake: teacher reload + verify (intended): 2 steps",
        "halt: 1 step",
    ]
    assert "after the halt: the run would have stopped" in legend_texts(fig)


def test_the_guard_strip_of_a_quiet_run_says_so(tmp_path):
    path = write_jsonl(healthy_history(30, spike_step=None), tmp_path / "q.jsonl")
    fig = replay_figure(replay(load_history(path)))
    assert [t.get_text() for t in strip(fig).get_yticklabels()] == ["no findings, no actions"]
    assert not any(line.get_marker() in ("^", "X", "x") for line in strip(fig).get_lines())


def test_monitor_only_marks_what_the_guard_would_have_done(tmp_path):
    rows = list(healthy_history(80, seed=0, spike_step=None))
    for r in rows[40:]:
        r["train/loss"] = 0.69
    path = write_jsonl(rows, tmp_path / "ceiling40.jsonl")
    fig = replay_figure(replay(load_history(path), "monitor_only"))
    labels = [t.get_text() for t in strip(fig).get_yticklabels()]
    assert "halt (intended): 1 step" in labels
