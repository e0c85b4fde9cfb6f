"""The demo app's variants, shortened, on ``make demo``'s pretrained models (no second
pretraining): its teachers over HTTP and its faults (``fault=<name>``). What is asserted is the
guard's and the bookkeeping's, so the greedy evaluations and the plot are left out to save time.
A file of its own so that a second pytest-xdist worker runs it beside the full demo run
(``test_app.py``)."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest

from distill_guard.testing.servers import reference_teacher
from examples.sdpo_sciknoweval import app, run_arm
from examples.sdpo_sciknoweval.arms import ArmSpec
from examples.sdpo_sciknoweval.summary import format_table
from examples.sdpo_sciknoweval.tests.test_app import compose_demo


@pytest.fixture()
def pretrained(demo_pretrain, tmp_path, monkeypatch) -> Path:
    """``tmp_path`` as an ``out_dir`` whose cache holds ``make demo``'s models, with the greedy
    evaluations and the plot left out."""
    monkeypatch.setattr(run_arm, "evaluate", lambda *args, **kwargs: 0.0)
    monkeypatch.setattr(app, "plot_timeline", lambda *args, **kwargs: None)
    (tmp_path / "pretrain").symlink_to(demo_pretrain, target_is_directory=True)
    return tmp_path


# ---------------------------------------------------------------------- teachers over HTTP


@pytest.fixture()
def run_short(pretrained):
    """``app.run`` on the pretrained models, shortened. 4 prompts a step:
    over HTTP a ``student_topk`` step ships the teacher's log-probs over the whole vocabulary
    (V = 4096) at every response position as JSON, ~0.25 s a prompt here; the count of poisoned
    updates does not depend on how many prompts an update had."""

    def go(*overrides: str, steps: int = 2) -> dict:
        base = [f"out_dir={pretrained}", f"arm.steps={steps}", "arm.batch_size=4"]
        base += [f"arm.eval_every={steps}", "wandb.mode=disabled"]
        return app.run(compose_demo([*base, *overrides]))["arms"]

    return go


def test_a_dead_teacher_over_http_poisons_the_unguarded_updates_as_in_process(run_short, caplog):
    """The poisoned count reads what the trainer consumed, not the teacher object: the same for
    a loopback-HTTP teacher as for the in-process one (an HTTP client has no weights to look at).
    """
    caplog.set_level(logging.INFO)
    arms = run_short("teacher=reference_server", "arms=[unguarded,guarded]")
    u, g = arms["unguarded"], arms["guarded"]
    assert u["teacher_uniform_fraction"] == 1.0 and u["poisoned_updates"] == 2
    assert g["poisoned_updates"] == 0 and g["repairs"] == 2
    assert not [r for r in caplog.records if r.name.startswith("httpx")]  # no line per request


def test_the_backup_column_says_what_the_server_says(run_short, demo_pretrain, caplog):
    """A server launched with the weights CPU backup, an arm configured without: the summary gives
    the server's setting (its ``/get_server_info``), and the teacher indeed keeps its weights."""
    teacher_dir = demo_pretrain / "teacher"
    assert not ArmSpec.named("unguarded").backup
    with reference_teacher(teacher_dir, enable_cpu_backup=True) as (url, _):
        arms = run_short("teacher=sglang_http", f"teacher.url={url}", "arms=[unguarded]")
    u = arms["unguarded"]
    assert u["teacher_cpu_backup"] is True
    assert u["teacher_uniform_fraction"] == 0.0 and u["poisoned_updates"] == 0
    assert format_table(arms).splitlines()[2].split()[:2] == ["unguarded", "yes"]


# ---------------------------------------------------------------------- fault=<name>


@pytest.fixture()
def run_fault(pretrained):
    """Only the unguarded and guarded arms of ``fault=<name>``, shortened, on the pretrained
    models."""
    return lambda fault, steps: _run_fault(pretrained, fault, steps)


def _run_fault(tmp_path: Path, fault: str, steps: int) -> dict:
    cfg = compose_demo(
        [
            f"out_dir={tmp_path}",
            f"fault={fault}",
            "arms=[unguarded,guarded]",
            f"arm.steps={steps}",
            "arm.batch_size=16",
            f"arm.eval_every={steps}",
            "wandb.mode=disabled",
        ]
    )
    result = app.run(cfg)
    assert result["fault"] == fault
    return result["arms"]


def test_vocab_mismatch_trains_the_unguarded_student_on_noise_and_the_guard_halts(
    run_fault, tmp_path
):
    arms = run_fault("vocab_mismatch", steps=3)
    u, g = arms["unguarded"], arms["guarded"]
    assert u["teacher_cpu_backup"] and g["teacher_cpu_backup"]  # the fault, not the weights
    assert u["poisoned_updates"] == 3 and not u["halted"]
    assert u["first_finding"] == {"step": 0, "code": "teacher.tokens_mismatch"}
    # skip, skip, halt: a reload cannot fix a tokenizer mismatch
    assert g["first_finding"] == {"step": 0, "code": "teacher.tokens_mismatch"}
    assert g["poisoned_updates"] == 0 and g["repairs"] == 0 and g["halted"]
    assert (tmp_path / "halt_guarded" / "student.pt").exists()


def test_off_by_one_is_caught_before_the_first_update(run_fault):
    """The miniature's answers use ~8 tokens, all in every top-16: the position test judges the
    teacher's first choice, which tells a shift where top-k membership could not."""
    arms = run_fault("off_by_one", steps=1)
    u, g = arms["unguarded"], arms["guarded"]
    assert u["poisoned_updates"] == 1 and u["step0_loss"] > 0.9 * math.log(2)
    assert g["first_finding"] == {"step": 0, "code": "teacher.position_shift"}
    assert g["poisoned_updates"] == 0


def test_partial_garbage_replica_is_caught_per_sample_and_never_trained_on(run_fault):
    arms = run_fault("partial", steps=1)
    u, g = arms["unguarded"], arms["guarded"]
    assert u["poisoned_updates"] == 1
    assert u["first_finding"] == {"step": 0, "code": "teacher.near_uniform"}
    assert g["first_finding"] == {"step": 0, "code": "teacher.near_uniform"}
    # a reload of the (healthy) teacher verifies, the next batch is garbage again: skipped
    assert g["poisoned_updates"] == 0 and g["repairs"] == 1 and not g["halted"]


def test_beta_at_an_end_is_only_warned_about(run_fault):
    """config.beta_at_end is a warning, said once, before step 0's update. It stops nothing."""
    arms = run_fault("beta_end", steps=1)
    u, g = arms["unguarded"], arms["guarded"]
    assert u["step0_loss"] < 1e-4
    assert u["first_finding"] == g["first_finding"] == {"step": 0, "code": "config.beta_at_end"}
    assert u["poisoned_updates"] == g["poisoned_updates"] == 1 and not g["halted"]
