"""The demo app, shortened, composed by Hydra from conf/ exactly as `make demo` composes it."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from distill_guard import DistillGuard
from distill_guard.events import read_events
from distill_guard.summary import GUARD_METRICS, VERDICT_SKIP
from distill_guard.testing.servers import reference_teacher
from examples.sdpo_sciknoweval import app, run_arm
from examples.sdpo_sciknoweval.arms import ArmSpec
from examples.sdpo_sciknoweval.pretrain import pretrain
from examples.sdpo_sciknoweval.summary import format_table

CONF = Path(__file__).resolve().parents[3] / "conf"


def compose_demo(overrides: list[str]):
    """The demo's config with ``overrides``, on one torch thread (the tests share the cores)."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="sdpo_sciknoweval", overrides=["threads=1", *overrides])


def pretrain_ahead(folder: str | Path) -> None:
    """Train the demo config's teacher and student into ``folder``, as ``app.run`` would (the
    ``demo_pretrain`` fixture runs this in a background process, see conftest.py)."""
    pretrain(folder, app.pretrain_config(compose_demo([])), threads=1)


@pytest.fixture(scope="module")
def demo(tmp_path_factory, demo_pretrain) -> tuple[dict, Path]:
    """The whole app, shortened, once per module; its warm-up found in the cache (``app.run``
    trains the same models when the cache is missing: the hash says so)."""
    out = tmp_path_factory.mktemp("demo")
    (out / "pretrain").symlink_to(demo_pretrain, target_is_directory=True)
    cfg = compose_demo(
        [
            f"out_dir={out}",
            "arm.steps=4",
            "arm.batch_size=16",
            "arm.eval_every=2",
            "wandb.mode=offline",
        ]
    )
    return app.run(cfg), out


def test_summary_has_the_issue_schema(demo):
    result, out = demo
    assert json.loads((out / "summary.json").read_text()) == json.loads(json.dumps(result))
    keys = {
        "step0_loss",
        "final_loss",
        "entropy_start",
        "entropy_end",
        "eval_accuracy",
        "teacher_uniform_fraction",
        "first_finding",
        "repairs",
        "halted",
        "poisoned_updates",
    }
    assert set(result["arms"]) == {"healthy", "unguarded", "guarded"}
    for arm in result["arms"].values():
        assert keys <= set(arm)
        assert all(len(p) == 2 for p in arm["eval_accuracy"])
    assert (out / "timeline.png").stat().st_size > 10_000


def test_unguarded_trains_on_a_uniform_teacher_at_the_jsd_ceiling(demo):
    u = demo[0]["arms"]["unguarded"]
    assert u["step0_loss"] >= 0.9 * math.log(2)
    assert u["teacher_uniform_fraction"] == 1.0
    assert u["poisoned_updates"] == 4 and u["repairs"] == 0 and not u["halted"]
    assert u["first_finding"] == {"step": 0, "code": "teacher.uniform"}  # it watched, never acted
    assert u["entropy_end"] > u["entropy_start"]


def test_guarded_repairs_at_every_wake_and_never_trains_on_the_dead_teacher(demo):
    result, out = demo
    g, h = result["arms"]["guarded"], result["arms"]["healthy"]
    assert g["poisoned_updates"] == 0 and g["teacher_uniform_fraction"] == 0.0
    assert g["repairs"] == 4 and not g["halted"]
    assert g["first_finding"] == {"step": 0, "code": "teacher.uniform"}
    # repaired before scoring, the guarded arm trains on what the healthy teacher says
    assert g["step0_loss"] == pytest.approx(h["step0_loss"], rel=1e-4)
    events = read_events(out / "events_guarded.jsonl")
    assert [e["kind"] for e in events].count("repair.ok") == 4
    alerts = [e for e in events if e["kind"] == "alert"]
    assert len(alerts) == 1 and "teacher.uniform" in alerts[0]["title"]  # one incident, one alert


def test_healthy_arm_is_left_alone(demo):
    result, out = demo
    h = result["arms"]["healthy"]
    assert h["first_finding"] is None and h["repairs"] == 0 and h["poisoned_updates"] == 0
    # its event file says only that the guard attached and closed: no finding, alert or repair
    kinds = [e["kind"] for e in read_events(out / "events_healthy.jsonl")]
    assert kinds == ["attached", "closed"]


def test_wandb_rows_are_namespaced_and_carry_the_guards_metrics():
    guard = DistillGuard()
    record = {"step": 3, "loss": 0.1, "student_entropy": 0.2, "eval_accuracy": 0.5}
    row = app.wandb_row({**record, "trained": False, "guard_action": "skip_batch"}, guard)
    assert set(row) == {"train/loss", "train/entropy", "eval/accuracy", "train/update_applied"} | (
        set(GUARD_METRICS)
    )
    assert row["train/entropy"] == 0.2 and row["guard/verdict"] == VERDICT_SKIP
    assert app.wandb_row({"step": 4, "eval_accuracy": 0.5}, guard)["guard/verdict"] == 0


def test_an_unknown_arm_is_refused():
    with pytest.raises(ValueError, match="unknown arm"):
        app.main.__wrapped__(compose_demo(["arms=[healthy,sideways]"]))


# ---------------------------------------------------------------------- teachers over HTTP


@pytest.fixture()
def run_short(demo, tmp_path, monkeypatch):
    """``app.run`` on the module's pretrained models (no second pretraining), shortened, without
    the greedy evaluations and the plot: what is asserted is the bookkeeping's. 4 prompts a step:
    over HTTP a ``student_topk`` step ships the teacher's log-probs over the whole vocabulary
    (V = 4096) at every response position as JSON, ~0.25 s a prompt here; the count of poisoned
    updates does not depend on how many prompts an update had."""
    monkeypatch.setattr(run_arm, "evaluate", lambda *args, **kwargs: 0.0)
    monkeypatch.setattr(app, "plot_timeline", lambda *args, **kwargs: None)
    (tmp_path / "pretrain").symlink_to(demo[1] / "pretrain", target_is_directory=True)

    def go(*overrides: str, steps: int = 2) -> dict:
        base = [f"out_dir={tmp_path}", f"arm.steps={steps}", "arm.batch_size=4"]
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


def test_the_backup_column_says_what_the_server_says(run_short, demo, caplog):
    """A server launched with the weights CPU backup, an arm configured without: the summary gives
    the server's setting (its ``/get_server_info``), and the teacher indeed keeps its weights."""
    teacher_dir = demo[1] / "pretrain" / "teacher"
    assert not ArmSpec.named("unguarded").backup
    with reference_teacher(teacher_dir, enable_cpu_backup=True) as (url, _):
        arms = run_short("teacher=sglang_http", f"teacher.url={url}", "arms=[unguarded]")
    u = arms["unguarded"]
    assert u["teacher_cpu_backup"] is True
    assert u["teacher_uniform_fraction"] == 0.0 and u["poisoned_updates"] == 0
    assert format_table(arms).splitlines()[2].split()[:2] == ["unguarded", "yes"]


# ---------------------------------------------------------------------- fault=<name>


@pytest.fixture()
def run_fault(demo, tmp_path, monkeypatch):
    """Only the unguarded and guarded arms of ``fault=<name>``, shortened, on the module's
    pretrained models (no second pretraining); what is asserted is the guard's and the
    bookkeeping's, so the greedy evaluations and the plot are left out to save time."""
    monkeypatch.setattr(run_arm, "evaluate", lambda *args, **kwargs: 0.0)
    monkeypatch.setattr(app, "plot_timeline", lambda *args, **kwargs: None)
    (tmp_path / "pretrain").symlink_to(demo[1] / "pretrain", target_is_directory=True)
    return lambda fault, steps: _run_fault(tmp_path, fault, steps)


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
    """config.beta_at_end is a warning, said once, before step 0's update. It stops nothing: with
    AdamW the loss's scale barely matters (the full demo's student still learns, 0.36 → 0.66)."""
    arms = run_fault("beta_end", steps=1)
    u, g = arms["unguarded"], arms["guarded"]
    assert u["step0_loss"] < 1e-4
    assert u["first_finding"] == g["first_finding"] == {"step": 0, "code": "config.beta_at_end"}
    assert u["poisoned_updates"] == g["poisoned_updates"] == 1 and not g["halted"]


def test_an_unknown_fault_is_refused():
    with pytest.raises(ValueError, match="unknown fault"):
        app.main.__wrapped__(compose_demo(["fault=sideways"]))
