"""Alerts as the integrations use them: rank 0 only, WARN/ERROR, throttled per title, never fatal,
always in the event file, in the logger once per incident."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from distill_guard.alerts import MAX_TITLE, Alerter, alert_title
from distill_guard.findings import Code
from distill_guard.guard import DistillGuard
from distill_guard.observations import RunSpec
from distill_guard.policy import Action, Policy

from ._tiny import events

V = 1000


class Run:
    def __init__(self, fail=False):
        self.sent, self.fail = [], fail

    def alert(self, title, text, level, wait_duration):
        if self.fail:
            raise RuntimeError("wandb: 500 from the server")
        self.sent.append((title, getattr(level, "value", level), wait_duration))


def guard(tmp_path, run, rank=0, **policy):
    return DistillGuard(
        policy=Policy(**policy),
        run=RunSpec(vocab_size=V),
        events=tmp_path / "events.jsonl",
        alerter=Alerter(rank=rank, run=run, min_interval_s=600.0),
        rank=rank,
    )


def uniform():
    return torch.full((8, 4), -math.log(V))


def test_levels_titles_throttle_and_mirror(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="distill_guard")
    run = Run()
    g = guard(tmp_path, run, critical_action=Action.SKIP_BATCH, halt_after_critical_steps=3)
    g.on_step_metrics(0, {"loss": 0.9})  # above the ceiling: a warning
    g.on_step_metrics(1, {"loss": 0.9})  # same title again: throttled for wandb
    g.on_teacher_scores(2, topk_logprobs=uniform())  # skip: an error
    assert run.sent == [
        ("distill_guard: loss.above_ceiling", "WARN", 600.0),
        ("distill_guard skip_batch: teacher.uniform", "ERROR", 600.0),
    ]
    alerts = [e for e in events(tmp_path / "events.jsonl") if e["kind"] == "alert"]
    assert [a["level"] for a in alerts] == ["WARN", "WARN", "ERROR"]  # every one, throttled or not
    logged = [r for r in caplog.records if "loss.above_ceiling" in r.getMessage()]
    assert len(logged) == 1 and logged[0].levelno == logging.WARNING  # the repeat is counted


def test_only_rank_0_talks_to_wandb(tmp_path):
    run = Run()
    g = guard(tmp_path, run, rank=1)
    g.on_teacher_scores(0, topk_logprobs=uniform())
    assert (
        run.sent == []
        and [e["kind"] for e in events(tmp_path / "events.jsonl")].count("alert") == 1
    )


@pytest.mark.parametrize("kind", ["raising", "finished", "disabled", "no_run"])
def test_an_alert_is_never_fatal(tmp_path, kind, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = None
    if kind == "raising":
        run = Run(fail=True)
    elif kind == "finished":  # Run.alert raises after finish()
        run = wandb.init(mode="offline", dir=str(tmp_path), project="dg-test")
        run.finish()
    elif kind == "disabled":
        run = wandb.init(mode="disabled")
    g = guard(tmp_path, run, critical_action=Action.HALT)
    d = g.on_teacher_scores(0, topk_logprobs=uniform())
    assert d.action is Action.HALT and g.halted  # the run's own fate is untouched
    kinds = [e["kind"] for e in events(tmp_path / "events.jsonl")]
    assert "alert" in kinds and "halt" in kinds
    if kind in ("raising", "finished"):
        assert "alert_failed" in kinds
    if kind == "disabled":
        run.finish()


def test_titles_are_stable_and_short():
    codes = [v for k, v in vars(Code).items() if k.isupper()]
    for code in codes:
        for action in (None, *[a.value for a in Action]):
            title = alert_title(code, action)
            assert len(title) <= MAX_TITLE < 64 and title == alert_title(code, action)


def _assert_each_incident_logged_once(records, path, steps):
    loud = [r for r in records if r.levelno >= logging.WARNING]
    assert 1 <= len(loud) <= 5, [r.getMessage() for r in loud]
    first = loud[0].getMessage()
    # the first line is the full message: what was measured, against what bound, what to do
    assert "teacher.uniform" in first and "within 0.001 of −ln V" in first
    assert "--enable-weights-cpu-backup" in first
    alerts = [e for e in events(path) if e["kind"] == "alert"]
    assert len(alerts) >= 2 * steps  # nothing is lost: the event file has every alert
    assert any("more time(s)" in r.getMessage() for r in records)  # the repeats, counted at close


def test_a_monitor_only_run_on_a_dead_teacher_logs_each_incident_once(tmp_path, caplog):
    """The scores and metrics of the demo's unguarded arm: a dead (uniform) teacher, a JSD at
    its ceiling, entropy climbing, a guard that only watches, for 40 steps."""
    from distill_guard.config import build_guard

    path = tmp_path / "events.jsonl"
    g = build_guard(
        "monitor_only", [f"run.vocab_size={V}", f"events_path={path}", "alerts.use_wandb=false"]
    )
    caplog.set_level(logging.INFO, logger="distill_guard")
    steps = 40
    for step in range(steps):
        assert g.on_teacher_scores(step, topk_logprobs=uniform()).action is Action.ALERT
        metrics = {"loss": 0.69, "student_entropy": 2.0 + 0.2 * step, "truncated_ratio": 0.5}
        assert g.on_step_metrics(step, metrics).action is Action.ALERT
    g.close()
    _assert_each_incident_logged_once(caplog.records, path, steps)


@pytest.mark.slow
def test_a_monitor_only_run_on_a_live_dead_teacher_logs_each_incident_once(tmp_path, caplog):
    """The same with a real teacher that loses its weights at every wake: the canary at wake
    and the scores both find teacher.uniform, one title, one full log line."""
    from distill_guard.config import build_guard
    from distill_guard.teachers import TorchTeacher
    from distill_guard.testing.tiny import build_tiny_qwen3

    teacher = TorchTeacher.from_pretrained(
        build_tiny_qwen3(tmp_path / "teacher", vocab_size=512), enable_cpu_backup=False
    )
    path = tmp_path / "events.jsonl"
    g = build_guard("monitor_only", [f"events_path={path}", "alerts.use_wandb=false"])
    g.attach_teacher(teacher)
    caplog.set_level(logging.INFO, logger="distill_guard")
    steps = 32
    for step in range(steps):
        g.wake(step)  # from step 1 on, the canary finds the weights gone
        top = teacher.score([list(range(1, 20))], top_k=4).topk_logprobs[0]
        g.on_teacher_scores(step, topk_logprobs=top)
        loss = 0.02 if step == 0 else 0.69  # at the ceiling once the teacher is dead
        g.on_step_metrics(step, {"loss": loss, "student_entropy": 2.0 + 0.1 * step})
        g.sleep(step)
    g.close()
    _assert_each_incident_logged_once(caplog.records, path, steps - 1)
