"""timeline.png's contents, on traces shaped like the demo's (no training: the figure alone)."""

from __future__ import annotations

import math

import pytest
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from examples.sdpo_sciknoweval.arms import ArmTrace
from examples.sdpo_sciknoweval.timeline import Bounds, arm_label, plot_timeline, timeline_figure
from tests.test_report import drawn_texts, legend_texts, overlapping, panel

V = 1024
STEPS = 30


def trace(arm: str) -> tuple[ArmTrace, dict]:
    """An arm of the default demo: healthy learns; unguarded trains on a uniform teacher every
    step; guarded repairs at every wake and tracks healthy."""
    dead = arm == "unguarded"
    t = ArmTrace(first_finding=None if arm == "healthy" else {"step": 0, "code": "teacher.uniform"})
    for step in range(STEPS):
        t.records.append(
            {
                "step": step,
                "loss": 0.67 * math.exp(-step / 5) if dead else 0.09 * math.exp(-step / 20),
                "student_entropy": 0.25 + (6.0 * step / STEPS if dead else 0.0),
                "teacher_logprob": -math.log(V) if dead else -0.4,
                "trained": True,
                "poisoned": dead,
                "repairs": step + 1 if arm == "guarded" else 0,
                **({"eval_accuracy": 0.36 - 0.01 * step * dead} if step % 5 == 0 else {}),
            }
        )
    summary = {
        "fault": "none",
        "teacher_cpu_backup": arm == "healthy",
        "guard_preset": "default" if arm == "guarded" else "monitor_only",
        "first_finding": t.first_finding,
        "repairs": STEPS if arm == "guarded" else 0,
        "halted": False,
        "poisoned_updates": STEPS if dead else 0,
    }
    return t, summary


@pytest.fixture(scope="module")
def figure() -> Figure:
    arms = {a: trace(a) for a in ("healthy", "unguarded", "guarded")}
    traces = {a: t for a, (t, _) in arms.items()}
    summaries = {a: s for a, (_, s) in arms.items()}
    return timeline_figure(traces, summaries, Bounds(beta=0.5, vocab_size=V))


def marks(ax: Axes, marker: str) -> list[tuple[float, float]]:
    return [
        (x, y)
        for line in ax.get_lines()
        if line.get_marker() == marker
        for x, y in zip(line.get_xdata(), line.get_ydata())
    ]


def test_the_bounds_are_drawn_where_they_are_on_scale_and_named_where_not(figure):
    texts = legend_texts(figure)
    assert "JSD ceiling ln 2 = 0.693" in texts
    assert f"−ln V = −{math.log(V):.2f}: uniform (dead) teacher" in texts
    # the unguarded entropy climbs to 6.25 of ln V = 6.93: the line is in view, not off scale
    assert f"ln V (V={V}) = {math.log(V):.2f}: uniform student" in texts
    for key, value in (("JSD loss (nats)", math.log(2)), ("student entropy (nats)", math.log(V))):
        ax = panel(figure, key)
        assert any(list(line.get_ydata()) == [value, value] for line in ax.get_lines())


def test_a_bound_far_from_the_data_is_noted_off_scale():
    t, s = trace("healthy")
    fig = timeline_figure({"healthy": t}, {"healthy": s}, Bounds(beta=0.5, vocab_size=V))
    assert f"ln V (V={V}) = {math.log(V):.2f}: uniform student (off scale, above)" in (
        legend_texts(fig)
    )


def test_the_legend_names_each_arm_with_its_backup_and_guard(figure):
    texts = legend_texts(figure)
    assert "healthy (CPU backup; guard monitor_only: watches only)" in texts
    assert "unguarded (no CPU backup; guard monitor_only: watches only)" in texts
    assert "guarded (no CPU backup; guard default: acts)" in texts
    assert arm_label("x", {**trace("guarded")[1], "fault": "partial"}).startswith(
        "x (no CPU backup, fault partial;"
    )


def test_the_guard_strip_marks_every_repair_and_poisoned_update_per_arm(figure):
    strip = panel(figure, "guard")
    rows = {
        t.get_text().split(":")[0]: y for t, y in zip(strip.get_yticklabels(), strip.get_yticks())
    }
    repairs = marks(strip, "^")
    assert [x for x, _ in repairs] == list(range(STEPS))  # one mark per repair
    assert {y for _, y in repairs} == {rows["guarded"]}
    poisoned = marks(strip, "s")
    assert len(poisoned) == STEPS and {y for _, y in poisoned} == {rows["unguarded"]}
    labels = [t.get_text() for t in strip.get_yticklabels()]
    assert f"guarded: 0 poisoned, {STEPS} repairs\nfirst: teacher.uniform @0" in labels
    assert "healthy: 0 poisoned, 0 repairs\nno finding" in labels
    assert "repair: teacher reloaded and verified" in legend_texts(figure)


def test_no_labels_collide(figure, monkeypatch):
    assert overlapping(drawn_texts(figure, monkeypatch)) == []


def test_a_halt_is_marked_and_the_file_is_small(tmp_path):
    t, s = trace("guarded")
    t.records, t.halted = t.records[:3], True
    path = tmp_path / "timeline.png"
    plot_timeline({"guarded": t}, {**{"guarded": s}}, Bounds(beta=0.5, vocab_size=V), path)
    fig = timeline_figure({"guarded": t}, {"guarded": s}, Bounds(beta=0.5, vocab_size=V))
    assert [x for x, _ in marks(panel(fig, "guard"), "X")] == [2]
    assert "halt" in legend_texts(fig)
    assert 10_000 < path.stat().st_size < 300_000
