"""Report: the replay timeline plot and the human summary table."""

from __future__ import annotations

import struct

import pytest

from distill_guard.findings import Code
from distill_guard.history import load_history
from distill_guard.replay import ReplayResult, format_table, replay
from distill_guard.report import plot_replay
from distill_guard.testing.histories import collapsed_history, healthy_history
from tests.conftest import QWEN3_V, write_jsonl


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
    # four panels (loss, entropy, truncation, eval) vs one: the figure grows with them
    assert h_full > 2.5 * h_small


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
    assert "rewake at step 0" in table and "halt reason:" not in table  # one critical step


def test_table_gives_the_halt_reason(tmp_path):
    rows = [{"train/step": t, "train/loss": 0.69} for t in range(5)]
    result = replay(load_history(write_jsonl(rows, tmp_path / "dead.jsonl")))
    assert result.halt_step == 0
    table = format_table(result)
    assert "halt at step 2" in table  # the default preset halts after 3 critical steps
    assert "halt reason: halt: critical findings on 3 consecutive steps" in table


def test_table_of_a_quiet_run(tmp_path):
    path = write_jsonl(healthy_history(60, spike_step=None), tmp_path / "q.jsonl")
    table = format_table(replay(load_history(path)))
    assert "No findings" in table and "60 steps" in table


def test_replay_result_exit_code_and_worst(collapsed_result, tmp_path):
    assert collapsed_result.exit_code() == 1
    assert collapsed_result.worst.value == "critical"
    empty = ReplayResult(collapsed_result.history, "default")
    assert empty.exit_code() == 0 and empty.worst is None and empty.halt_step is None
