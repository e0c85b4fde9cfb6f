"""Rewake: resume, reload, flush, verify; bounded attempts; one incident for repeated losses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from distill_guard.findings import Code, Severity
from distill_guard.live.canary import Canary
from distill_guard.live.incidents import IncidentTracker
from distill_guard.live.repair import RepairOutcome, repair_teacher
from distill_guard.teachers import TeacherError, TorchTeacher
from distill_guard.testing.tiny import build_tiny_qwen3


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_qwen3(tmp_path_factory.mktemp("repair_tiny"), vocab_size=512)


class Events:
    def __init__(self) -> None:
        self.log: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, kind: str, payload: dict[str, Any]) -> None:
        self.log.append((kind, payload))

    @property
    def kinds(self) -> list[str]:
        return [k for k, _ in self.log]


def lose_weights(t: TorchTeacher, canary: Canary) -> None:
    canary.fingerprint(t)
    t.release()
    t.resume()
    assert [f.code for f in canary.verify(t)] == [Code.TEACHER_UNIFORM]


def test_repair_brings_a_zero_weight_teacher_back_and_the_canary_passes(tiny_dir) -> None:
    t = TorchTeacher.from_pretrained(tiny_dir)
    canary = Canary(deterministic=True)
    lose_weights(t, canary)
    events = Events()
    out = repair_teacher(t, canary, on_event=events, step=9)
    assert out.ok and out.attempts == 1 and out.seconds > 0
    assert [f.code for f in out.findings] == [Code.TEACHER_REPAIRED]
    assert events.kinds == ["repair.attempt", "repair.reload", "repair.flush", "repair.ok"]
    assert canary.verify(t) == [] and canary.last_comparison.max_abs_delta == 0.0


def test_an_asleep_teacher_is_resumed_first(tiny_dir) -> None:
    t = TorchTeacher.from_pretrained(tiny_dir)
    canary = Canary()
    canary.fingerprint(t)
    t.release()
    events = Events()
    assert repair_teacher(t, canary, on_event=events).ok
    assert events.kinds[:2] == ["repair.attempt", "repair.resume"] and not t.asleep


def test_a_repair_that_does_not_verify_is_retried_with_backoff_then_given_up(tiny_dir) -> None:
    t = TorchTeacher.from_pretrained(tiny_dir, snapshot_buffers=False)  # reload cannot fix RoPE
    canary = Canary(deterministic=True)
    lose_weights(t, canary)
    events, pauses = Events(), []
    out = repair_teacher(
        t, canary, max_attempts=3, backoff_s=0.5, on_event=events, sleep=pauses.append
    )
    assert not out.ok and out.attempts == 3
    assert pauses == [0.5, 1.0]
    assert events.kinds.count("repair.attempt") == 3 and events.kinds.count("repair.failed") == 3
    assert events.kinds[-1] == "repair.gave_up"
    assert out.findings[0].code == Code.TEACHER_REPAIR_FAILED
    assert out.findings[0].severity is Severity.CRITICAL
    assert out.findings[1].code == Code.TEACHER_FINGERPRINT_MISMATCH


def test_a_custom_reloader_restores_an_ema_teacher(tiny_dir) -> None:
    t = TorchTeacher.from_pretrained(tiny_dir)
    with torch.no_grad():
        for p in t.model.parameters():
            p.mul_(0.5)  # the EMA weights are not the checkpoint any more
    ema_state = {k: v.clone() for k, v in t.model.state_dict().items()}
    canary = Canary(deterministic=True)
    lose_weights(t, canary)
    # the default reload (checkpoint) would not match; the EMA reloader does
    assert not repair_teacher(t, canary, max_attempts=1).ok
    t.model.load_state_dict(ema_state)  # undo, lose again, then repair properly
    lose_weights(t, canary)
    out = repair_teacher(
        t, canary, reloader=lambda teacher: teacher.model.load_state_dict(ema_state)
    )
    assert out.ok


def test_teacher_errors_during_repair_are_events_not_crashes(tiny_dir) -> None:
    t = TorchTeacher.from_pretrained(tiny_dir)
    canary = Canary()
    lose_weights(t, canary)

    def broken(teacher: Any) -> None:
        raise TeacherError("checkpoint store unreachable")

    events = Events()
    out = repair_teacher(
        t, canary, reloader=broken, max_attempts=2, sleep=lambda s: None, on_event=events
    )
    assert not out.ok
    errors = [p for k, p in events.log if k == "repair.error"]
    assert len(errors) == 2 and errors[0]["during"] == "reload"
    assert out.findings[1].code == Code.TEACHER_UNREACHABLE


def test_max_attempts_must_be_positive(tiny_dir) -> None:
    with pytest.raises(ValueError):
        repair_teacher(TorchTeacher.from_pretrained(tiny_dir), Canary(), max_attempts=0)


def _ok(seconds: float = 0.2) -> RepairOutcome:
    return RepairOutcome(True, 1, [], seconds)


def test_losing_weights_at_every_wake_is_one_incident_with_a_repair_count() -> None:
    tracker = IncidentTracker()
    alerts = [tracker.on_repair(_ok(), step=s, cause=[]) for s in range(5)]
    assert alerts[0] is not None and alerts[1:] == [None] * 4
    assert (
        alerts[0].code == Code.TEACHER_REPAIRED
        and "--enable-weights-cpu-backup" in alerts[0].message
    )
    assert "repeats at every wake" in alerts[0].message
    assert (
        tracker.current.repairs == 5
        and tracker.current.first_step == 0
        and tracker.current.last_step == 4
    )
    tracker.on_clean_wake(5)
    assert tracker.current is None and tracker.total_repairs == 5
    assert tracker.on_repair(_ok(), step=9) is not None  # a new incident alerts again
    state = tracker.state_dict()
    restored = IncidentTracker()
    restored.load_state_dict(state)
    assert restored.total_repairs == 6 and restored.on_repair(_ok(), step=10) is None


def test_a_failed_repair_is_always_reported() -> None:
    tracker = IncidentTracker()
    tracker.on_repair(_ok(), step=1)
    failed = RepairOutcome(False, 3, [object()], 4.0)  # type: ignore[list-item]
    assert tracker.on_repair(failed, step=2) is failed.findings[0]
    assert tracker.current.failures == 1


def test_a_teacher_that_loses_weights_at_every_wake_is_repaired_each_time_and_alerted_once(
    tiny_dir,
) -> None:
    t = TorchTeacher.from_pretrained(tiny_dir)
    canary, tracker, alerts = Canary(deterministic=True), IncidentTracker(), []
    for step in range(4):
        canary.fingerprint(t, step)  # before_sleep
        t.release()
        t.resume()
        cause = canary.verify(t, step)  # after_wake
        assert [f.code for f in cause] == [Code.TEACHER_UNIFORM]
        outcome = repair_teacher(t, canary, step=step)
        assert outcome.ok and canary.verify(t, step) == []
        alerts.append(tracker.on_repair(outcome, step=step, cause=cause))
    assert [a is not None for a in alerts] == [True, False, False, False]
    assert "teacher.uniform" in alerts[0].message and tracker.current.repairs == 4


def test_the_incident_history_stays_flat_over_a_long_run() -> None:
    """A teacher that loses its weights at every other wake for thousands of wakes: the
    tracker keeps the last incidents and counts the rest, so memory and the checkpoint stay
    flat (it used to keep every incident, in memory and in every checkpoint), and the counts
    survive a resume, also from a state that listed every incident."""
    import json

    from distill_guard.live.incidents import KEEP_CLOSED, IncidentTracker, WeightLossIncident
    from distill_guard.live.repair import RepairOutcome

    tracker = IncidentTracker()
    ok = RepairOutcome(ok=True, attempts=1, seconds=0.0, findings=[])
    sizes = []
    for wake in range(2000):
        tracker.on_repair(ok, step=2 * wake)
        tracker.on_clean_wake(2 * wake + 1)
        if wake in (99, 1999):
            sizes.append(len(json.dumps(tracker.state_dict())))
    assert tracker.total_repairs == 2000 and tracker.closed_count == 2000
    assert len(tracker.closed) == KEEP_CLOSED and sizes[1] <= sizes[0] + 64  # digits only
    resumed = IncidentTracker()
    resumed.load_state_dict(json.loads(json.dumps(tracker.state_dict())))
    assert resumed.total_repairs == 2000 and resumed.closed_count == 2000
    old = {"current": None, "closed": [vars(WeightLossIncident(i, i, 1)) for i in range(40)]}
    resumed.load_state_dict(old)
    assert resumed.total_repairs == 40 and len(resumed.closed) == KEEP_CLOSED
