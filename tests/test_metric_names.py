"""The one metric-name resolver: replay and every live integration read the same keys, under
every known convention."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch

from distill_guard.history import load_history
from distill_guard.metric_names import (
    CONVENTIONS,
    HF_METRIC_NAMES,
    METRIC_CANDIDATES,
    RELAX_METRIC_NAMES,
    candidates,
    lookalikes,
    looks_like,
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


# ---------------------------------------------------------------------- every convention


def concrete(name: str) -> str:
    """A key a pattern names (``eval/*`` → ``eval/bio``)."""
    return name.replace("*", "bio")


CONVENTION_NAMES = sorted(CONVENTIONS)


@pytest.mark.parametrize("convention", CONVENTION_NAMES)
def test_each_convention_resolves_each_of_its_roles(convention):
    conv = CONVENTIONS[convention]
    assert conv.source  # every convention says where its names were read
    for role, names in conv.names.items():
        for name in names:  # alone in a file, each name is read as its role
            assert resolve_names(METRIC_CANDIDATES, [concrete(name), "_step"]) == {
                role: concrete(name)
            }, (convention, role, name)
    # a whole history of the convention: every role read under its own name
    keys = [concrete(names[0]) for names in conv.names.values()] + [conv.step_key]
    assert resolve_names(METRIC_CANDIDATES, keys) == {
        role: concrete(names[0]) for role, names in conv.names.items()
    }


def test_the_candidates_are_every_conventions_names_and_nothing_else():
    for role, tried in METRIC_CANDIDATES.items():
        assert len(set(tried)) == len(tried), role
        named = {n for c in CONVENTIONS.values() for n in c.names.get(role, ())}
        assert set(tried) == named, role
    assert CONVENTIONS["miles"] is CONVENTIONS["slime"]
    assert set(CONVENTIONS) >= {"relax", "slime", "miles", "trl", "hf", "lightning", "demo"}


@pytest.mark.parametrize(
    "role, available, expected",
    [
        # slime-lineage entropy_loss is always the student's entropy; train/entropy is generic
        (Metric.STUDENT_ENTROPY, ["train/entropy", "train/entropy_loss"], "train/entropy_loss"),
        (Metric.STUDENT_ENTROPY, ["entropy", "train/entropy"], "train/entropy"),
        (Metric.LOSS, ["loss", "train/loss"], "train/loss"),
        # trl 1.16's name before the experimental trainer's
        (
            Metric.TRUNCATED_RATIO,
            ["completions/truncated_fraction", "completions/clipped_ratio"],
            "completions/clipped_ratio",
        ),
        (
            Metric.TRUNCATED_RATIO,
            ["train/completions/clipped_ratio", "rollout/truncated_ratio"],
            "rollout/truncated_ratio",
        ),
        # exact accuracy names before any pattern; eval/* last
        (Metric.EVAL_ACCURACY, ["eval/aime", "eval/accuracy"], "eval/accuracy"),
        (Metric.EVAL_ACCURACY, ["eval/aime", "val/acc"], "val/acc"),
        (Metric.EVAL_ACCURACY, ["eval/aime", "eval/bio_accuracy"], "eval/bio_accuracy"),
        (Metric.EVAL_ACCURACY, ["eval/zeta", "eval/aime"], "eval/aime"),
    ],
)
def test_the_first_candidate_that_resolves_wins(role, available, expected):
    assert resolve_names({role: METRIC_CANDIDATES[role]}, available) == {role: expected}


def test_an_explicit_mapping_wins_for_its_role_and_only_its_role():
    names = candidates({Metric.STUDENT_ENTROPY: "train/entropy", Metric.LOSS: "my_loss"})
    assert names[Metric.STUDENT_ENTROPY] == ("train/entropy",)
    keys = ["train/entropy_loss", "train/entropy", "train/loss", "rollout/truncated_ratio"]
    got = resolve_names(names, keys)
    assert got[Metric.STUDENT_ENTROPY] == "train/entropy"  # not the earlier candidate
    assert Metric.LOSS not in got  # no fallback to train/loss: the mapping is the one name
    assert got[Metric.TRUNCATED_RATIO] == "rollout/truncated_ratio"  # the rest keep the order
    assert candidates() == METRIC_CANDIDATES


def test_a_pattern_never_reads_an_evaluations_bookkeeping_as_its_accuracy():
    # TRL's eval pass through wandb without compute_metrics; slime's eval step; miles' skips
    hf_eval = ["eval/loss", "eval/entropy", "eval/runtime", "eval/samples_per_second"]
    others = [
        "eval/steps_per_second",
        "eval/step",
        "eval/skipped_timeout",
        "eval/a-none_reward_ratio",
    ]
    assert resolve_names(METRIC_CANDIDATES, [*hf_eval, *others]) == {}
    assert resolve_key("eval/*", [*hf_eval, "eval/zebra"]) == "eval/zebra"


def test_raw_trainer_names_are_the_hf_convention_and_pick_metrics_takes_candidates():
    logs = {"loss": 0.5, "completions/truncated_fraction": 0.25, "eval_bio_accuracy": 0.4}
    assert pick_metrics(logs, HF_METRIC_NAMES) == {
        Metric.LOSS: 0.5,
        Metric.TRUNCATED_RATIO: 0.25,
        Metric.EVAL_ACCURACY: 0.4,
    }


def _rewrite_logs(d: dict) -> dict:
    """transformers' ``WandbCallback`` key rewrite (``integration_utils.rewrite_logs``)."""
    return {("eval/" + k[5:] if k.startswith("eval_") else "train/" + k): v for k, v in d.items()}


def test_trl_through_wandb_is_the_raw_names_rewritten_as_the_wandb_callback_does():
    hf, wandb = CONVENTIONS["hf"].names, CONVENTIONS["trl"].names
    assert set(hf) == set(wandb)
    for role in hf:
        assert tuple(_rewrite_logs(dict.fromkeys(hf[role])).keys()) == wandb[role], role


def _installed_source(package: str, path: str) -> str:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{package} is not installed")
    return (Path(spec.submodule_search_locations[0]) / path).read_text(encoding="utf-8")


def test_the_names_are_the_installed_trl_and_transformers_own():
    """trl 1.16's DistillationTrainer and transformers' wandb rewrite, read in their source: a
    version that renames them fails here, not silently in a run."""
    trl = _installed_source("trl", "trainer/distillation_trainer.py")
    assert '_metrics[mode]["completions/clipped_ratio"]' in trl
    assert '_metrics[mode]["entropy"]' in trl
    iw_opd = _installed_source("trl", "experimental/iw_opd/iw_opd_trainer.py")
    assert '_metrics[mode]["completions/truncated_fraction"]' in iw_opd
    rewrite = _installed_source("transformers", "integrations/integration_utils.py")
    body = rewrite.split("def rewrite_logs(d):", 1)[1].split("\ndef ", 1)[0]
    assert 'new_d["eval/" + k[eval_prefix_len:]] = v' in body
    assert 'new_d["train/" + k] = v' in body


@pytest.mark.parametrize(
    "key, role",
    [
        ("train/entropy", Metric.STUDENT_ENTROPY),
        ("actor/entropy_mean", Metric.STUDENT_ENTROPY),
        ("train/eopd_teacher_entropy_mean", None),  # the teacher's, not the student's
        ("completions/clipped_ratio", Metric.TRUNCATED_RATIO),
        ("my/truncation_rate", Metric.TRUNCATED_RATIO),
        ("train/pg_clipfrac", None),  # PPO clipping, not a cut completion
        ("val/acc", Metric.EVAL_ACCURACY),
        ("eval/mean_token_accuracy", Metric.EVAL_ACCURACY),
        ("rollout/spec_accept_rate", None),
        ("rollout/teacher_logp", Metric.TEACHER_LOGPROB),
        ("teacher/log_prob_mean", Metric.TEACHER_LOGPROB),
        ("train/pg_loss", Metric.LOSS),
        ("eval_loss", None),  # an evaluation's loss is not the training loss
        ("val/entropy", None),
        ("eval/aime-truncated_ratio", None),
        ("train/step", None),
        ("guard/findings", None),
        ("lr", None),
    ],
)
def test_looks_like_by_name(key, role):
    assert looks_like(key) == role


def test_only_roles_that_did_not_resolve_get_lookalikes():
    keys = ["train/pg_loss", "train/kl_loss", "actor/entropy_mean", "my/trunc", "lr"]
    unresolved = [Metric.STUDENT_ENTROPY, Metric.EVAL_ACCURACY]  # loss and truncation were read
    assert lookalikes(keys, unresolved) == {"actor/entropy_mean": Metric.STUDENT_ENTROPY}
    assert lookalikes(keys, []) == {}
