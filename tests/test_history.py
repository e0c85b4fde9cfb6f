"""load_history: JSONL and wandb CSV exports into per-step role values, with clear errors."""

from __future__ import annotations

import math

import pytest

from distill_guard.history import HistoryError, load_history
from distill_guard.testing.histories import healthy_history
from tests.conftest import write_csv, write_jsonl


def test_jsonl_rows_become_roles_in_step_order(tmp_path):
    rows = list(healthy_history(20, seed=1))
    h = load_history(write_jsonl(rows, tmp_path / "h.jsonl"))
    assert [s for s, _ in h.steps] == list(range(20))
    assert h.keys["loss"] == "train/loss" and h.keys["student_entropy"] == "train/entropy_loss"
    # eval/* resolves to the accuracy key, not the truncation ratio logged beside it
    assert h.keys["eval_accuracy"] == "eval/sciknoweval-biology"
    for (_, values), row in zip(h.steps, rows):
        assert values["loss"] == row["train/loss"]
        assert values["teacher_logprob"] == row["rollout/teacher_log_probs"]
        assert ("eval_accuracy" in values) == ("eval/sciknoweval-biology" in row)
    assert h.missing == []


def test_eval_wildcard_skips_truncation_ratios_and_sub_metrics(tmp_path):
    row = {
        "train/loss": 0.1,
        "eval/aime-truncated_ratio": 0.9,  # sorts first, but is not an accuracy
        "eval/aime/pass@1": 0.2,  # a sub-metric
        "eval/math": 0.4,
    }
    h = load_history(write_jsonl([row], tmp_path / "h.jsonl"))
    assert h.keys["eval_accuracy"] == "eval/math"
    assert h.steps == [(0, {"loss": 0.1, "eval_accuracy": 0.4})]


def test_rows_of_one_step_are_merged_and_steps_sorted(tmp_path):
    rows = [
        {"_step": 5, "train/loss": 0.1},
        {"_step": 2, "train/loss": 0.2},
        {"_step": 5, "eval/acc": 0.5},
    ]
    h = load_history(write_jsonl(rows, tmp_path / "h.jsonl"))
    assert h.steps == [(2, {"loss": 0.2}), (5, {"loss": 0.1, "eval_accuracy": 0.5})]
    assert sorted(h.missing) == ["student_entropy", "teacher_logprob", "truncated_ratio"]


def test_without_a_step_key_the_row_index_is_the_step(tmp_path):
    h = load_history(write_jsonl([{"train/loss": 0.3}, {"train/loss": 0.2}], tmp_path / "h.jsonl"))
    assert [s for s, _ in h.steps] == [0, 1]


def test_wandb_csv_export_with_empty_cells(tmp_path):
    rows = [
        {"_step": 0, "train/loss": 0.02, "eval/acc": 0.3},
        {"_step": 1, "train/loss": 0.021},
        {"_step": 2, "train/loss": "nan"},
    ]
    h = load_history(write_csv(rows, tmp_path / "h.csv", ["_step", "train/loss", "eval/acc"]))
    assert h.steps[0] == (0, {"loss": 0.02, "eval_accuracy": 0.3})
    assert h.steps[1] == (1, {"loss": 0.021})  # the empty eval cell is absent, not 0 or NaN
    assert math.isnan(h.steps[2][1]["loss"])


def test_key_map_remaps_a_role(tmp_path):
    path = write_jsonl([{"step": 0, "my_loss": 0.5, "train/loss": 9.0}], tmp_path / "h.jsonl")
    assert load_history(path, {"loss": "my_loss"}).steps == [(0, {"loss": 0.5})]
    with pytest.raises(HistoryError, match="unknown role 'los'"):
        load_history(path, {"los": "my_loss"})


@pytest.mark.parametrize(
    "content,problem,line",
    [
        ('{"train/loss": 0.1}\n{"train/loss": 0.2\n', "not valid JSON", 2),
        ('{"train/loss": 0.1}\n[1, 2]\n', "one JSON object per line", 2),
        ('{"train/loss": 0.1}\n{"train/loss": "abc"}\n', "'abc', expected a number", 2),
        ('{"train/loss": true}\n', "boolean", 1),
        ('{"train/loss": 0.1, "_step": 1.5}\n', "whole number", 1),
        ('{"train/loss": 0.1, "_step": -1}\n', "whole number", 1),
        (
            '{"loss": 0.1}\n{"loss": 0.2}\n',
            "'train/loss' (role loss) is in none of the 2 rows",
            None,
        ),
        ("", "empty", None),
        ("\n  \n", "empty", None),
    ],
)
def test_bad_jsonl_names_file_line_and_problem(tmp_path, content, problem, line):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(HistoryError) as info:
        load_history(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}:{line}:" if line else f"{path}:")
    assert problem in msg


@pytest.mark.parametrize(
    "content,problem,line",
    [
        ("_step,train/loss\n", "header but no rows", None),
        ("_step,train/loss\n0,0.1\n1,0.1,7\n", "more cells", 3),
        ("_step,train/loss\n0,0.1\n1,abc\n", "'abc', expected a number", 3),
        ("_step,loss\n0,0.1\n", "--key loss=NAME", None),
    ],
)
def test_bad_csv_names_file_line_and_problem(tmp_path, content, problem, line):
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(HistoryError) as info:
        load_history(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}:{line}:" if line else f"{path}:")
    assert problem in msg


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(HistoryError, match="file not found"):
        load_history(tmp_path / "nope.jsonl")
    with pytest.raises(HistoryError, match="is a directory"):
        load_history(tmp_path)
