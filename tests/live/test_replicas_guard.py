"""A teacher made of replicas driven by the guard: ``guard.wake`` and ``guard.sleep`` drive every
replica, the fleet's decision is the guard's (recorded, alerted once per incident, a halt kept),
and the fleet is in the guard's state for a resumed run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from distill_guard.checks.canary import CanaryCheck
from distill_guard.errors import GuardStateError
from distill_guard.findings import Code
from distill_guard.guard import DistillGuard
from distill_guard.live.replicas import ReplicaState, ReplicatedTeacher
from distill_guard.live.teacher_reference import reference_from_checkpoint
from distill_guard.policy import Action
from distill_guard.teachers.base import TeacherError
from distill_guard.teachers.replicas import make_replicas
from distill_guard.testing.router import reference_replicas
from distill_guard.testing.tiny import build_tiny_qwen3

CHECK = CanaryCheck(length=16, top_k=4)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return build_tiny_qwen3(tmp_path_factory.mktemp("replicas_guard_tiny"), vocab_size=512)


@pytest.fixture(scope="module")
def reference(tiny_dir):
    return reference_from_checkpoint(tiny_dir, CHECK)


def _fleet(replicas, reference, **kw) -> ReplicatedTeacher:
    return ReplicatedTeacher(
        make_replicas([r.url for r in replicas]),
        reference,
        canary=CHECK,
        repair_attempts=1,
        repair_backoff_s=0.01,
        **kw,
    )


def test_the_guard_drives_the_replicas_alerts_once_and_resumes_the_fleet(
    tiny_dir, reference, tmp_path
) -> None:
    with reference_replicas(tiny_dir, [True, False]) as replicas:
        guard = DistillGuard(events=tmp_path / "events.jsonl")
        fleet = guard.attach_replicas(_fleet(replicas, reference))
        assert guard.replicated is fleet and guard.reference is reference
        decisions = []
        for step in range(2):
            guard.sleep(step)
            decisions.append(guard.wake(step))
        assert [d.action for d in decisions] == [Action.ALERT, Action.ALERT]
        assert [d.notify for d in decisions] == [True, False]  # one alert for the incident
        assert guard.repairs == 2 and not guard.halted
        assert guard.summary.count[Code.TEACHER_REPLICA_QUARANTINED] == 2
        state = guard.state_dict()
        assert state["replicas"]["wakes"] == 2
        guard.close()
        kinds = [json.loads(line)["kind"] for line in (tmp_path / "events.jsonl").open()]
        assert kinds.count("decision") == 2

        again = DistillGuard()  # a resumed run: the state loaded before the fleet is attached
        again.load_state_dict(json.loads(json.dumps(state)))
        resumed = again.attach_replicas(_fleet(replicas, reference))
        assert resumed.wakes == 2 and resumed.ledger.verdicts == fleet.ledger.verdicts
        assert resumed.metrics() == fleet.metrics()
        again.sleep(2)
        third = again.wake(2)
        assert third.action is Action.ALERT and not third.notify  # the same incident, counted
        assert resumed.receipt(replicas[1].url).wake == 3


def test_below_the_bound_the_guard_halts_and_keeps_the_halt(tiny_dir, reference) -> None:
    with reference_replicas(tiny_dir, [True, False]) as replicas:
        replicas[1].teacher.reload_weights = lambda *a, **k: (_ for _ in ()).throw(
            TeacherError("checkpoint unreadable")
        )
        guard = DistillGuard()
        fleet = guard.attach_replicas(_fleet(replicas, reference, min_healthy_replicas=2))
        guard.sleep(0)
        decision = guard.wake(0)
        assert decision.action is Action.HALT and guard.halted
        assert decision.reasons[0].code == Code.TEACHER_REPLICAS_BELOW_MIN
        assert fleet.states[replicas[1].url] is ReplicaState.QUARANTINED
        assert guard.wake(1).action is Action.HALT  # kept: later hooks answer the halt


def test_a_corrupted_fleet_state_is_refused_whole() -> None:
    guard = DistillGuard()
    bad = {"replicas": {"wakes": 1, "replicas": {"http://a:1": {"colocated": {"canary": 3}}}}}
    with pytest.raises(GuardStateError, match=r"replicas\.replicas\.http://a:1\.colocated"):
        guard.load_state_dict(bad)
    assert guard.teachers._replicas_state is None  # nothing taken
