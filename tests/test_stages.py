"""Stages are named once: each guard hook concludes one stage, each check stage one check hook."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from distill_guard.checks.base import CHECK_HOOKS, Check
from distill_guard.observations import RunSpec, StepMetrics, TeacherScores
from distill_guard.stages import Stage

ROOT = Path(__file__).resolve().parents[1]


def test_each_guard_hook_concludes_its_own_stage_in_step_order(make_guard):
    guard = make_guard()
    concluded: list[Stage] = []
    guard.record_findings = lambda stage, findings: concluded.append(stage)
    guard.wake(0)
    guard.on_teacher_scores(0)
    guard.on_step_metrics(0, {"loss": 0.1}, before_update=True)
    guard.on_step_metrics(0, {"loss": 0.1})
    guard.sleep(0)
    assert concluded == list(Stage)


class _Recorder(Check):
    name = "recorder"

    def __init__(self) -> None:
        self.calls: list[str] = []

    def on_teacher_scores(self, scores, run):
        self.calls.append("on_teacher_scores")
        return []

    def on_step_metrics(self, metrics, run):
        self.calls.append("on_step_metrics")
        return []


@pytest.mark.parametrize("stage", list(CHECK_HOOKS))
def test_each_check_stage_calls_exactly_one_check_hook(stage):
    check = _Recorder()
    observation = (
        TeacherScores(0) if stage is Stage.TEACHER_SCORES else StepMetrics(0, {"loss": 0.1})
    )
    CHECK_HOOKS[stage](check, observation, RunSpec())
    expected = "on_teacher_scores" if stage is Stage.TEACHER_SCORES else "on_step_metrics"
    assert check.calls == [expected]


def test_every_stage_is_either_a_check_stage_or_the_live_teachers():
    teacher_stages = {Stage.WAKE, Stage.SLEEP}
    assert set(CHECK_HOOKS).isdisjoint(teacher_stages)
    assert set(CHECK_HOOKS) | teacher_stages == set(Stage)


def test_stages_before_the_update_are_the_ones_a_skip_can_still_act_on():
    assert [s for s in Stage if s.update_pending] == [
        Stage.WAKE,
        Stage.TEACHER_SCORES,
        Stage.STEP_METRICS_BEFORE_UPDATE,
    ]
    assert str(Stage.WAKE) == "wake" and f"{Stage.SLEEP}" == "sleep"  # events and messages


def test_no_hook_is_dispatched_by_string():
    pattern = re.compile(r"getattr\([^)]*hook|\"wake\", \"wake\"")
    offenders = [
        f"{path.relative_to(ROOT)}:{n}"
        for folder in ("distill_guard", "examples")
        for path in (ROOT / folder).rglob("*.py")
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.search(line)
    ]
    assert offenders == []
