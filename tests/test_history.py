"""load_history: JSONL and wandb CSV exports into per-step role values, with clear errors."""

from __future__ import annotations

import math

import pytest

from distill_guard.history import HistoryError, load_history
from distill_guard.metric_names import CONVENTIONS, METRIC_CANDIDATES
from distill_guard.observations import Metric
from distill_guard.testing.histories import healthy_history, renamed, seed_history
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
            '{"my_loss": 0.1}\n{"my_loss": 0.2}\n',
            "metric 'train/loss' or 'loss' (role loss) is in none of the 2 rows",
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
        ("_step,jsd\n0,0.1\n", "--key loss=NAME", None),
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


# ---------------------------------------------------------------- every convention, no --key


@pytest.mark.parametrize("convention", sorted(CONVENTIONS))
def test_a_history_under_any_convention_loads_without_key(tmp_path, convention):
    relax_rows = list(healthy_history(20, seed=3, spike_step=None))
    rows = list(renamed(relax_rows, convention))
    h = load_history(write_jsonl(rows, tmp_path / f"{convention}.jsonl"))
    names = CONVENTIONS[convention].names
    expected = {
        role: "eval/sciknoweval-biology" if "*" in names[role][0] else names[role][0]
        for role in names
    }
    if Metric.TEACHER_LOGPROB not in names:  # TRL logs no teacher logprob: not in the file
        assert h.missing == [Metric.TEACHER_LOGPROB]
    else:
        assert h.missing == []
    assert h.keys == expected
    assert [s for s, _ in h.steps] == list(range(20))  # the convention's own step column
    for (_, values), row in zip(h.steps, relax_rows):
        assert values[Metric.LOSS] == row["train/loss"]
        assert values[Metric.STUDENT_ENTROPY] == row["train/entropy_loss"]
        assert values[Metric.TRUNCATED_RATIO] == row["rollout/truncated_ratio"]
        assert values.get(Metric.EVAL_ACCURACY) == row.get("eval/sciknoweval-biology")
    assert h.lookalikes == {}  # nothing in the file looks like a role that was not read


def test_the_seed_failure_under_trl_names_reaches_the_same_roles_as_under_relax(tmp_path):
    relax = load_history(write_jsonl(seed_history(), tmp_path / "relax.jsonl"))
    trl = load_history(write_jsonl(renamed(seed_history(), "trl"), tmp_path / "trl.jsonl"))
    assert trl.keys == {
        Metric.LOSS: "train/loss",
        Metric.STUDENT_ENTROPY: "train/entropy",
        Metric.TRUNCATED_RATIO: "train/completions/clipped_ratio",
        Metric.EVAL_ACCURACY: "eval/accuracy",
    }
    assert trl.steps == relax.steps and len(relax.steps) == 190
    assert relax.missing == trl.missing == [Metric.TEACHER_LOGPROB]


def test_seed_history_is_the_failed_run_of_issue_23():
    for shape in ("saturating", "linear"):
        rows = list(seed_history(shape=shape))
        assert len(rows) == 190 and rows == list(seed_history(shape=shape))  # seeded
        assert rows[0]["train/loss"] == 0.688
        assert all(
            list(seed_history(2, seed=s))[1]["train/loss"] < 0.95 * math.log(2) for s in range(20)
        )
        assert rows[-1]["train/loss"] < 2e-4
        assert rows[0]["train/entropy_loss"] == pytest.approx(0.42, abs=0.04)
        assert rows[-1]["train/entropy_loss"] == pytest.approx(3.49, abs=0.04)
        assert rows[0]["rollout/truncated_ratio"] == pytest.approx(0.06, abs=0.02)
        assert rows[-1]["rollout/truncated_ratio"] == pytest.approx(1.0, abs=0.02)
        evals = {r["train/step"]: r["eval/sciknoweval-biology"] for r in rows if len(r) == 5}
        assert sorted(evals) == list(range(0, 190, 10))
        assert (
            evals[0] == 0.361
            and evals[10] == 0.011
            and set(evals.values()) - {0.361, 0.011} == {0.0}
        )
        assert not any("teacher" in k for r in rows for k in r)
    saturating = [r["train/entropy_loss"] for r in seed_history(shape="saturating")]
    linear = [r["train/entropy_loss"] for r in seed_history(shape="linear")]
    assert saturating[47] > 2.0 > linear[47]  # a quarter of the way: mostly risen vs a quarter
    assert list(seed_history(5, seed=1)) != list(seed_history(5, seed=2))
    with pytest.raises(ValueError, match="shape"):
        list(seed_history(shape="cliff"))


def test_lookalikes_of_roles_not_read_are_reported_and_resolved_ones_are_not(tmp_path):
    rows = [
        {
            "_step": t,
            "train/loss": 0.02,
            "train/pg_loss": 0.01,  # beside a read loss: not news
            "actor/entropy_mean": 0.4,  # no known entropy name: news
            "rollout/truncated_ratio": 0.03,
            "val/loss": 0.5,  # an evaluation's loss
        }
        for t in range(3)
    ]
    h = load_history(write_jsonl(rows, tmp_path / "h.jsonl"))
    assert h.lookalikes == {"actor/entropy_mean": Metric.STUDENT_ENTROPY}
    assert Metric.STUDENT_ENTROPY in h.missing
    assert h.tried[Metric.STUDENT_ENTROPY] == METRIC_CANDIDATES[Metric.STUDENT_ENTROPY]
    # mapped with --key, it is read and no longer a look-alike
    mapped = load_history(tmp_path / "h.jsonl", {Metric.STUDENT_ENTROPY: "actor/entropy_mean"})
    assert mapped.keys[Metric.STUDENT_ENTROPY] == "actor/entropy_mean"
    assert mapped.lookalikes == {} and mapped.tried[Metric.STUDENT_ENTROPY] == (
        "actor/entropy_mean",
    )
    assert mapped.steps[0][1][Metric.STUDENT_ENTROPY] == 0.4


def test_a_missing_loss_names_what_was_tried_and_what_looks_like_it(tmp_path):
    path = write_jsonl([{"_step": 0, "train/opd_loss": 0.1}], tmp_path / "h.jsonl")
    with pytest.raises(HistoryError) as info:
        load_history(path)
    msg = str(info.value)
    assert "metric 'train/loss' or 'loss' (role loss) is in none of the 1 rows" in msg
    assert "'train/opd_loss' looks like it" in msg and "--key loss=NAME" in msg
