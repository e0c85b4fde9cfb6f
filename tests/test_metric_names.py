"""The one metric-name resolver: replay and every live integration read the same keys."""

from __future__ import annotations

import math

import torch

from distill_guard.history import load_history
from distill_guard.metric_names import (
    RELAX_METRIC_NAMES,
    pick_metrics,
    resolve_key,
    resolve_names,
)
from distill_guard.observations import Metric

from .conftest import write_jsonl


def test_roles_and_wildcards():
    logs = {
        "train/loss": torch.tensor(0.5),
        "eval/x-truncated_ratio": 0.1,
        "eval/x": 0.4,
        "eval/x/pass@4": 0.9,
        "n": None,
    }
    keys = {Metric.LOSS: "train/loss", Metric.EVAL_ACCURACY: "eval/*", Metric.STUDENT_ENTROPY: "n"}
    assert pick_metrics(logs, keys) == {Metric.LOSS: 0.5, Metric.EVAL_ACCURACY: 0.4}
    assert math.isnan(pick_metrics({"loss": float("nan")}, {Metric.LOSS: "loss"})[Metric.LOSS])


def test_values_that_are_not_numbers_are_left_out():
    assert pick_metrics({"loss": "n/a", "entropy": 2}, {"loss": "loss", "e": "entropy"}) == {
        "e": 2.0
    }


def test_a_pattern_picks_the_same_key_whatever_order_it_was_logged_in():
    # live logs arrive in the framework's order; a replayed file's keys come as a set
    assert resolve_key("eval/*", ["eval/zeta", "eval/alpha"]) == "eval/alpha"
    assert resolve_key("eval/*", ["eval/alpha", "eval/zeta"]) == "eval/alpha"
    assert resolve_key("eval/*", ["eval/a-truncated_ratio"]) is None
    assert resolve_key("train/loss", ["train/loss2"]) is None
    assert resolve_key("", ["x"]) is None


def test_live_and_replay_take_the_same_eval_key(tmp_path):
    """The bug this resolver fixed: on one history the live path read eval/zeta, replay eval/alpha."""
    row = {"train/loss": 0.02, "eval/zeta": 0.1, "eval/alpha": 0.7}
    history = load_history(write_jsonl([row], tmp_path / "h.jsonl"))
    assert history.keys[Metric.EVAL_ACCURACY] == "eval/alpha"
    live = pick_metrics(row, RELAX_METRIC_NAMES)
    assert live[Metric.EVAL_ACCURACY] == history.steps[0][1][Metric.EVAL_ACCURACY] == 0.7


def test_resolve_names_keeps_only_roles_found():
    got = resolve_names(RELAX_METRIC_NAMES, ["train/loss", "rollout/truncated_ratio"])
    assert got == {Metric.LOSS: "train/loss", Metric.TRUNCATED_RATIO: "rollout/truncated_ratio"}
