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


def test_a_failed_fingerprint_leaves_no_stale_reference_for_a_moving_teacher(tmp_path):
    """An EMA teacher moves between steps; when the fingerprint before sleep fails, the wake must
    not be judged against the reference of an earlier step (it used to reload the disk
    checkpoint three times and halt a healthy run)."""
    teacher = TorchTeacher.from_pretrained(
        build_tiny_qwen3(tmp_path / "m", vocab_size=64), enable_cpu_backup=True
    )
    guard = DistillGuard(teacher=teacher, canary=Canary(length=8), repair_backoff_s=0)
    assert guard.sleep(0).action is Action.CONTINUE and guard.wake(0).action is Action.CONTINUE
    with torch.no_grad():  # the EMA update of this step
        for p in teacher.model.parameters():
            p.mul_(0.5)
    real_score = teacher._score
    teacher._score = lambda *a: (_ for _ in ()).throw(TeacherError("scoring timed out"))
    slept = guard.sleep(1)  # the fingerprint fails: recorded, the reference is dropped
    assert Code.TEACHER_UNREACHABLE in {f.code for f in slept.reasons}
    teacher._score = real_score
    woke = guard.wake(1)
    assert woke.action is Action.CONTINUE and guard.repairs == 0 and not guard.halted


def test_a_torn_last_event_line_does_not_lose_the_good_events(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text('{"kind": "finding", "step": 1}\n{"kind": "halt", "step": 2}\n{"kind": "de')
    assert [e["kind"] for e in read_events(path)] == ["finding", "halt"]
    path.write_text('{"kind": "finding"}\nnot json\n{"kind": "halt"}\n')
    import pytest

    with pytest.raises(ValueError, match="events.jsonl:2"):
        read_events(path)


def test_a_resume_that_fails_says_the_teacher_was_left_asleep_not_weight_loss(tmp_path):
    teacher = TorchTeacher.from_pretrained(build_tiny_qwen3(tmp_path / "m", vocab_size=64))
    guard = DistillGuard(teacher=teacher, canary=Canary(length=8), repair_attempts=1)
    guard.sleep(0)
    teacher._resume = lambda tags: (_ for _ in ()).throw(TeacherError("HTTP 500"))
    d = guard.wake(0)
    (finding,) = [f for f in d.reasons if f.code == Code.TEACHER_UNREACHABLE]
    assert "left asleep" in finding.message and "--enable-weights-cpu-backup" not in finding.message
    assert Code.TEACHER_UNIFORM not in {f.code for f in d.reasons}
