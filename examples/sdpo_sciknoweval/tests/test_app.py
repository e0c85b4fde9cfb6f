"""The demo app, shortened, composed by Hydra from conf/ exactly as `make demo` composes it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from distill_guard.events import read_events
from examples.sdpo_sciknoweval import app

CONF = Path(__file__).resolve().parents[3] / "conf"


def compose_demo(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="sdpo_sciknoweval", overrides=overrides)


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("demo")
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
    assert (
        not [e for e in read_events(out / "events_healthy.jsonl")]
        if (out / "events_healthy.jsonl").exists()
        else True
    )


def test_an_unknown_arm_is_refused():
    with pytest.raises(ValueError, match="unknown arm"):
        app.main.__wrapped__(compose_demo(["arms=[healthy,sideways]"]))
