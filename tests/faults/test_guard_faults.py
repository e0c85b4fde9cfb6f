"""Faults that used to escape into the training loop or mislead the guard (issue 13, first part):
each fails on the code before its fix."""

from __future__ import annotations

import math

import torch

from distill_guard.checks import TeacherCollapseCheck
from distill_guard.events import read_events
from distill_guard.findings import Code, Finding, Severity
from distill_guard.guard import DistillGuard
from distill_guard.live.canary import Canary
from distill_guard.observations import RunSpec, TeacherScores
from distill_guard.policy import Action
from distill_guard.teachers import TeacherError, TorchTeacher
from distill_guard.testing.tiny import build_tiny_qwen3


def test_a_teacher_failing_during_the_guards_own_repair_is_a_halt_not_an_exception(tmp_path):
    teacher = TorchTeacher.from_pretrained(build_tiny_qwen3(tmp_path / "m", vocab_size=64))

    def failing_reload(t):
        raise TeacherError("reload: the server went away")

    events = tmp_path / "events.jsonl"
    guard = DistillGuard(
        teacher=teacher, canary=Canary(length=8), reloader=failing_reload, events=events,
        repair_attempts=2, repair_backoff_s=0,
    )  # fmt: skip
    guard.sleep(0)
    decision = guard.wake(0)  # lost weights, and the repair's reload fails: must not raise
    assert decision.action is Action.HALT and guard.halted
    kinds = [e["kind"] for e in read_events(events)]
    assert kinds.count("repair.error") == 2 and "halt" in kinds
    assert all(e["during"] == "reload" for e in read_events(events) if e["kind"] == "repair.error")


def test_a_finding_carrying_a_tensor_is_recorded(tmp_path):
    finding = Finding(Code.TEACHER_UNIFORM, Severity.WARN, "m", 0, {"rows": torch.ones(2, 3)})
    assert finding.to_dict()["values"]["rows"] == [[1.0] * 3] * 2
    guard = DistillGuard(events=tmp_path / "e.jsonl")
    guard._record("teacher_scores", [finding])
    assert read_events(tmp_path / "e.jsonl")[-1]["values"]["rows"] == [[1.0] * 3] * 2


def test_a_fault_inside_the_decision_becomes_a_safe_decision(tmp_path):
    guard = DistillGuard(events=tmp_path / "e.jsonl")

    def broken(*args, **kwargs):
        raise RuntimeError("policy bug")

    guard.policy.decide = broken
    d = guard.on_teacher_scores(0, token_logprobs=torch.full((8,), -1.0))
    assert d.action is Action.SKIP_BATCH and d.reasons[0].code == Code.GUARD_INTERNAL_ERROR
    assert guard.on_step_metrics(0, {"loss": 0.1}).action is Action.ALERT


def test_top_k_rows_of_only_minus_inf_are_a_dead_teacher_not_masked_entries():
    """fp16 log_softmax of a zero-weight teacher gives rows of −inf: no probability anywhere."""
    check = TeacherCollapseCheck()
    dead = torch.full((8, 4), -math.inf)
    found = check.on_teacher_scores(TeacherScores(0, topk_logprobs=dead), RunSpec(vocab_size=512))
    assert [f.code for f in found] == [Code.TEACHER_NONFINITE]
    masked_entries = torch.tensor([[-0.1, -3.0, -math.inf, -math.inf]] * 8)  # union padding
    assert check.on_teacher_scores(TeacherScores(0, topk_logprobs=masked_entries), RunSpec()) == []
