"""DistillGuard with a live teacher: canary after every wake, repair, one alert per incident."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from distill_guard import Action, DistillGuard, RunSpec
from distill_guard.config import build_guard, compose_guard_config
from distill_guard.events import read_events
from distill_guard.findings import Code
from distill_guard.live.canary import Canary
from distill_guard.teachers import SGLangHTTPTeacher, TorchTeacher
from distill_guard.testing.tiny import build_tiny_qwen3


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_qwen3(tmp_path_factory.mktemp("tiny"), vocab_size=512)


def _teacher(model_dir: Path, **kw) -> TorchTeacher:
    return TorchTeacher.from_pretrained(model_dir, **kw)


def _cycle(guard: DistillGuard, teacher: TorchTeacher, step: int):
    assert guard.sleep(step).action is Action.CONTINUE
    assert teacher.asleep  # the guard released it
    decision = guard.wake(step)
    assert not teacher.asleep  # ... and resumed it
    return decision


def _scores(teacher: TorchTeacher) -> torch.Tensor:
    return teacher.score([list(range(1, 40))], top_k=4).topk_logprobs[0]


def test_lost_weights_are_repaired_at_every_wake_with_one_alert(model_dir, tmp_path, caplog):
    teacher = _teacher(model_dir, enable_cpu_backup=False)
    healthy = _scores(teacher)
    events = tmp_path / "events.jsonl"
    guard = DistillGuard(teacher=teacher, canary=Canary(), events=events, repair_backoff_s=0)
    assert guard.run.vocab_size == 512  # learnt from the teacher
    with caplog.at_level(logging.WARNING, logger="distill_guard"):
        decisions = [_cycle(guard, teacher, step) for step in range(5)]
    assert [d.action for d in decisions] == [Action.REWAKE] * 5  # repaired, never halted
    assert all(d.repaired for d in decisions)  # the decision says so, no counter to compare
    assert not guard.halted
    assert guard.repairs == 5 and guard.colocated.incidents.total_repairs == 5
    assert guard.summary.first[Code.TEACHER_UNIFORM] == 0
    torch.testing.assert_close(_scores(teacher), healthy)  # the teacher scores correctly again
    alerts = [e for e in read_events(events) if e["kind"] == "alert"]
    assert len(alerts) == 1, alerts  # one incident, one alert with the configuration fix
    assert "--enable-weights-cpu-backup" in caplog.text
    kinds = [e["kind"] for e in read_events(events)]
    assert kinds.count("repair.ok") == 5


def test_healthy_teacher_with_backup_passes_five_cycles_silently(model_dir, tmp_path, caplog):
    teacher = _teacher(model_dir, enable_cpu_backup=True)
    guard = DistillGuard(teacher=teacher, canary=Canary(), events=tmp_path / "e.jsonl")
    with caplog.at_level(logging.WARNING, logger="distill_guard"):
        decisions = [_cycle(guard, teacher, step) for step in range(5)]
    assert all(d.action is Action.CONTINUE and not d.repaired for d in decisions)
    assert guard.summary.count == {} and guard.repairs == 0
    assert caplog.records == []


def test_failed_repair_halts_and_records_why(model_dir, tmp_path):
    teacher = _teacher(model_dir, enable_cpu_backup=False)

    def broken_reloader(t):  # e.g. an EMA teacher whose snapshot was lost
        pass

    events = tmp_path / "events.jsonl"
    guard = DistillGuard(
        teacher=teacher,
        canary=Canary(),
        events=events,
        reloader=broken_reloader,
        repair_attempts=2,
        repair_backoff_s=0,
    )
    d = _cycle(guard, teacher, 3)
    assert d.action is Action.HALT and guard.halted
    assert Code.TEACHER_REPAIR_FAILED in {f.code for f in d.reasons}
    log = read_events(events)
    assert [e["kind"] for e in log].count("repair.attempt") == 2
    assert log[-1]["kind"] == "halt" and "repair failed" in log[-1]["message"]
    assert guard.halt.step == 3 and guard.halt.stage == "wake"
    assert Code.TEACHER_REPAIR_FAILED in guard.halt.codes
    assert guard.wake(4).action is Action.HALT  # sticky


def test_garbage_weights_are_caught_by_the_fingerprint(model_dir):
    teacher = _teacher(model_dir, enable_cpu_backup=False, fault="garbage")
    guard = DistillGuard(teacher=teacher, canary=Canary(), repair_backoff_s=0)
    d = _cycle(guard, teacher, 0)
    assert d.action is Action.REWAKE
    assert Code.TEACHER_FINGERPRINT_MISMATCH in guard.summary.count
    assert Code.TEACHER_UNIFORM not in guard.summary.count  # garbage is not uniform


def test_unreachable_teacher_is_a_finding_not_an_exception():
    teacher = SGLangHTTPTeacher("http://127.0.0.1:9", timeout_s=0.5, max_retries=0, vocab_size=512)
    guard = DistillGuard(run=RunSpec(vocab_size=512), teacher=teacher, canary=Canary())
    slept = guard.sleep(0)  # fingerprint and release fail: recorded, not raised
    assert slept.action is Action.ALERT
    assert {f.values["during"] for f in slept.reasons} == {
        "fingerprint before sleep",
        "drain before release (not released)",  # an undrained teacher is never released
    }
    d = guard.wake(0)  # never released, so never resumed: only the canary, which fails too
    assert d.action is Action.ALERT
    assert Code.TEACHER_UNREACHABLE in guard.summary.count


def test_build_guard_attaches_the_configured_canary(model_dir):
    teacher = _teacher(model_dir, enable_cpu_backup=False)
    cfg = compose_guard_config("default", ["checks.canary.length=16", "repair.backoff_s=0"])
    guard = build_guard(cfg, teacher=teacher)
    assert isinstance(guard.canary, Canary) and guard.canary.length == 16
    assert _cycle(guard, teacher, 0).action is Action.REWAKE and guard.repairs == 1


def test_a_repair_that_does_not_fix_the_scores_counts_toward_the_halt(model_dir):
    """One replica of several serving garbage: the guard's teacher passes its canary after each
    reload, yet the next batch's scores are near uniform again. A verified repair used to reset
    the count, so the run reloaded a healthy teacher at every step and never halted."""
    teacher = _teacher(model_dir, enable_cpu_backup=True)
    guard = DistillGuard(teacher=teacher, canary=Canary(), repair_backoff_s=0)
    v = guard.run.vocab_size
    garbage_rows = (
        torch.full((16, 4), -0.7 * torch.log(torch.tensor(float(v)))) - torch.arange(4) * 0.01
    )
    actions = []
    for step in range(5):
        _cycle(guard, teacher, step)
        decision = guard.on_teacher_scores(step, topk_logprobs=garbage_rows)
        actions.append(decision.action)
        if guard.halted:
            break
    assert actions == [Action.REWAKE, Action.REWAKE, Action.HALT]
    assert guard.repairs == 2 and guard.halt.codes == (Code.TEACHER_NEAR_UNIFORM,)
