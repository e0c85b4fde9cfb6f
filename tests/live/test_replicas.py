"""A replicated teacher: the fleet's pure decisions, then the driver against four reference
replicas behind the real ``sglang-router`` (one waking with zeroed weights), counting the
``/generate`` calls that reach each replica."""

from __future__ import annotations

import contextlib
import importlib.util
from pathlib import Path

import httpx
import pytest

from distill_guard.checks.canary import CanaryCheck
from distill_guard.errors import GuardValueError
from distill_guard.findings import Code, Finding, Severity
from distill_guard.live.replicas import (
    Move,
    ReplicaState,
    ReplicatedTeacher,
    after_repair,
    after_wake,
    fleet_decision,
)
from distill_guard.live.teacher_reference import reference_from_checkpoint
from distill_guard.policy import Action
from distill_guard.teachers.base import TeacherError
from distill_guard.teachers.replicas import make_replicas, replica_urls
from distill_guard.teachers.sglang_router import SGLangRouter
from distill_guard.testing.router import reference_replicas, sglang_router
from distill_guard.testing.tiny import build_tiny_qwen3

CHECK = CanaryCheck(length=16, top_k=4)
SCORE = {
    "input_ids": [1, 2, 3, 4, 5],
    "sampling_params": {"max_new_tokens": 0},
    "return_logprob": True,
    "logprob_start_len": 0,
}
S, Q = ReplicaState.SERVING, ReplicaState.QUARANTINED


def _finding(severity: Severity) -> Finding:
    return Finding(Code.TEACHER_UNIFORM, severity, "x 1", 0)


# -- the decisions -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "severity", "move"),
    [
        (S, None, Move.KEEP),
        (S, Severity.WARN, Move.KEEP),
        (S, Severity.CRITICAL, Move.QUARANTINE),
        (Q, Severity.CRITICAL, Move.REPAIR),
        (Q, None, Move.READMIT),
    ],
)
def test_after_wake(state, severity, move) -> None:
    findings = [_finding(severity)] if severity else []
    assert after_wake(state, findings) is move


def test_after_repair_readmits_only_a_verified_replica() -> None:
    assert after_repair(True) is Move.READMIT and after_repair(False) is None


def test_fleet_decision_halts_only_below_the_bound() -> None:
    three = {"a": S, "b": S, "c": S, "d": Q}
    assert fleet_decision(4, three, 3).action is Action.CONTINUE
    warned = fleet_decision(4, three, 3, [_finding(Severity.WARN), _finding(Severity.INFO)])
    assert warned.action is Action.ALERT and len(warned.reasons) == 1
    assert "1 quarantined: d" in warned.message
    halt = fleet_decision(4, {**three, "c": Q}, 3)
    assert halt.action is Action.HALT
    below = halt.reasons[0]
    assert below.code == Code.TEACHER_REPLICAS_BELOW_MIN and below.severity is Severity.CRITICAL
    assert below.values == {
        "serving": ["a", "b"],
        "quarantined": ["c", "d"],
        "min_healthy_replicas": 3,
    }
    exposed = fleet_decision(4, {"a": S, "b": S, "c": S, "d": S}, 1, unquarantined=["d"])
    assert exposed.action is Action.HALT and "still get the run's traffic" in exposed.message


def test_replica_urls_refuse_a_replica_named_twice_and_none() -> None:
    assert replica_urls(["http://a:1/", "http://b:2"]) == ["http://a:1", "http://b:2"]
    with pytest.raises(GuardValueError, match="twice"):
        replica_urls(["http://a:1", "http://a:1/"])
    with pytest.raises(GuardValueError, match="at least one"):
        replica_urls([])


# -- the driver, against the real router -------------------------------------------------

needs_router = pytest.mark.skipif(
    importlib.util.find_spec("sglang_router") is None,
    reason="needs sglang-router: pip install 'distill_guard[router]'",
)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return build_tiny_qwen3(tmp_path_factory.mktemp("replicas_tiny"), vocab_size=512)


@pytest.fixture(scope="module")
def reference(tiny_dir):
    """The canary as the checkpoint scores it: what every replica is verified against."""
    return reference_from_checkpoint(tiny_dir, CHECK)


@contextlib.contextmanager
def fleet(tiny_dir, backups, *, router=True):
    with reference_replicas(tiny_dir, backups) as replicas:
        if not router:
            yield replicas, None
            return
        with sglang_router([r.url for r in replicas]) as url, SGLangRouter(url) as client:
            yield replicas, client


def _routed(router: SGLangRouter, replicas, n: int) -> list[int]:
    """``n`` scoring calls through the router; how many reached each replica."""
    before = [r.calls["generate"] for r in replicas]
    with httpx.Client(timeout=10) as client:
        for _ in range(n):
            assert client.post(router.url + "/generate", json=SCORE).status_code == 200
    return [r.calls["generate"] - b for r, b in zip(replicas, before)]


def _teacher(replicas, reference, router, **kw) -> ReplicatedTeacher:
    return ReplicatedTeacher(
        make_replicas([r.url for r in replicas]),
        reference,
        router=router,
        canary=CHECK,
        repair_backoff_s=0.01,
        **kw,
    )


@needs_router
def test_a_zeroed_replica_is_out_of_the_router_before_its_repair_and_back_after(
    tiny_dir, reference
) -> None:
    with fleet(tiny_dir, [True, False, True, True]) as (replicas, router):
        during: list[list[int]] = []

        def on_event(kind: str, payload: dict) -> None:
            if kind == "replica.quarantined":  # out, not yet repaired: the router's traffic
                during.append(_routed(router, replicas, 12))

        teacher = _teacher(replicas, reference, router, min_healthy_replicas=3, on_event=on_event)
        first = router.worker(replicas[1].url)
        for step in range(2):
            teacher.sleep(step)
            woke = teacher.wake(step)
            assert woke.decision.action is not Action.HALT
            bad = woke.replicas[1]
            assert bad.moves == [Move.QUARANTINE, Move.REPAIR, Move.READMIT]
            codes = [f.code for f in bad.findings]
            assert codes[0] == Code.TEACHER_FINGERPRINT_MISMATCH  # its checksum, traffic held
            assert Code.TEACHER_REPLICA_QUARANTINED in codes and Code.TEACHER_REPAIRED in codes
            assert codes[-1] == Code.TEACHER_REPLICA_READMITTED
            assert all(
                not r.findings and r.state is S for i, r in enumerate(woke.replicas) if i != 1
            )
            assert teacher.serving == [r.url for r in replicas]
            assert _routed(router, replicas, 12) == [3, 3, 3, 3]  # readmitted: it serves again
        assert during == [[4, 0, 4, 4], [4, 0, 4, 4]]  # quarantined: none reached it
        again = router.worker(replicas[1].url)
        assert again is not None and again.healthy and again.id != first.id
        assert not again.health_check  # put back as it was listed
        assert all(r.server.dead_reason is None for r in replicas)


@needs_router
def test_a_replica_whose_repair_fails_stays_out_while_the_run_trains_on_the_rest(
    tiny_dir, reference
) -> None:
    with fleet(tiny_dir, [True, True, False, True]) as (replicas, router):
        broken = replicas[2]
        reload = broken.teacher.reload_weights
        fail = {"on": True}

        def unreadable(*args, **kw):
            if fail["on"]:
                raise TeacherError("checkpoint unreadable (a test's broken disk)")
            return reload(*args, **kw)

        broken.teacher.reload_weights = unreadable
        teacher = _teacher(replicas, reference, router, min_healthy_replicas=3, repair_attempts=1)
        for step in range(2):
            teacher.sleep(step)
            woke = teacher.wake(step)
            assert woke.decision.action is Action.ALERT  # 3 serve: the run goes on
            assert woke.replicas[2].state is Q
            assert Code.TEACHER_REPAIR_FAILED in {f.code for f in woke.replicas[2].findings}
            assert router.worker(broken.url) is None
            assert _routed(router, replicas, 12) == [4, 4, 0, 4]
        assert teacher.serving == [replicas[i].url for i in (0, 1, 3)]
        fail["on"] = False  # the disk is back: the next wake repairs, verifies and readmits
        teacher.sleep(2)
        woke = teacher.wake(2)
        assert woke.replicas[2].state is S and woke.replicas[2].moves == [Move.REPAIR, Move.READMIT]
        assert woke.decision.action is not Action.HALT
        assert _routed(router, replicas, 12) == [3, 3, 3, 3]


@needs_router
def test_below_min_healthy_replicas_the_run_halts(tiny_dir, reference) -> None:
    with fleet(tiny_dir, [True, False, False, True]) as (replicas, router):
        for r in replicas[1:3]:
            r.teacher.reload_weights = lambda *a, **k: (_ for _ in ()).throw(TeacherError("no"))
        teacher = _teacher(replicas, reference, router, min_healthy_replicas=3, repair_attempts=1)
        teacher.sleep(0)
        woke = teacher.wake(0)
        assert woke.decision.action is Action.HALT
        assert woke.decision.reasons[0].code == Code.TEACHER_REPLICAS_BELOW_MIN
        assert "2 of 4 teacher replicas serve" in woke.decision.reasons[0].message
        assert sorted(w.url for w in router.workers()) == sorted([replicas[0].url, replicas[3].url])


@needs_router
def test_a_replica_wrong_from_the_start_is_judged_against_the_checkpoint_not_itself(
    tiny_dir, reference, tmp_path
) -> None:
    other = build_tiny_qwen3(tmp_path / "other", vocab_size=512, seed=7)
    with (
        reference_replicas(tiny_dir, [True, True]) as replicas,
        reference_replicas(other, [True]) as wrong,
        sglang_router([r.url for r in (*replicas, *wrong)]) as url,
        SGLangRouter(url) as router,
    ):
        everyone = [*replicas, *wrong]
        teacher = _teacher(everyone, reference, router, min_healthy_replicas=2, repair_attempts=1)
        teacher.sleep(0)  # its fingerprint is its own: it matches itself across the sleep
        woke = teacher.wake(0)
        codes = [f.code for f in woke.replicas[2].findings]
        assert codes[0] == Code.TEACHER_REFERENCE_MISMATCH and Code.TEACHER_REPAIR_FAILED in codes
        assert woke.replicas[2].state is Q and woke.decision.action is Action.ALERT
        assert _routed(router, everyone, 10) == [5, 5, 0]


@needs_router
def test_without_a_router_the_trainer_routes_by_serving(tiny_dir, reference) -> None:
    with fleet(tiny_dir, [True, False], router=False) as (replicas, _):
        replicas[1].teacher.reload_weights = lambda *a, **k: (_ for _ in ()).throw(
            TeacherError("no")
        )
        teacher = _teacher(replicas, reference, None, repair_attempts=1)
        teacher.sleep(0)
        woke = teacher.wake(0)
        assert woke.serving == teacher.serving == [replicas[0].url]
        out = next(
            f for f in woke.replicas[1].findings if f.code == Code.TEACHER_REPLICA_QUARANTINED
        )
        assert "trainer's replica list" in out.message
    with pytest.raises(GuardValueError, match="min_healthy_replicas"):
        ReplicatedTeacher(make_replicas(["http://127.0.0.1:1"]), reference, min_healthy_replicas=2)


@needs_router
@pytest.mark.parametrize("repairs", [True, False], ids=["repaired", "not-repaired"])
def test_a_router_that_cannot_take_a_replica_out_halts_unless_it_is_repaired(
    tiny_dir, reference, repairs
) -> None:
    with reference_replicas(tiny_dir, [True, False]) as replicas:
        with sglang_router([r.url for r in replicas]) as url:
            router = SGLangRouter(url, timeout_s=2)
            router.retry_backoff_s = 0.0  # its retries find the router gone all the same
            teacher = _teacher(replicas, reference, router, repair_attempts=1)
        if not repairs:
            replicas[1].teacher.reload_weights = lambda *a, **k: (_ for _ in ()).throw(
                TeacherError("no")
            )
        teacher.sleep(0)  # the router is gone now: its worker API does not answer
        woke = teacher.wake(0)
        codes = [f.code for f in woke.replicas[1].findings]
        assert Code.TEACHER_ROUTER_FAILED in codes
        failed = next(f for f in woke.replicas[1].findings if f.code == Code.TEACHER_ROUTER_FAILED)
        assert failed.severity is Severity.CRITICAL and "may still route" in failed.message
        if repairs:  # still routed, but verified: it serves, the run goes on
            assert woke.replicas[1].state is S and woke.decision.action is not Action.HALT
        else:
            assert woke.decision.action is Action.HALT
            assert "could not be taken out of the router" in woke.decision.message


@needs_router
@pytest.mark.slow
def test_soak_two_flapping_replicas_never_halt_above_the_bound(tiny_dir, reference) -> None:
    """20 steps, two replicas that wake zeroed every time, one of whose checkpoint is unreadable
    at every third step: each quarantined at its wake, readmitted after its verified repair, the
    router's traffic after each wake spread over the serving replicas only."""
    with fleet(tiny_dir, [False, True, False, True]) as (replicas, router):
        reload = replicas[2].teacher.reload_weights
        step_now = {"step": 0}

        def flaky(*args, **kw):
            if step_now["step"] % 3 == 2:
                raise TeacherError("checkpoint unreadable this step")
            return reload(*args, **kw)

        replicas[2].teacher.reload_weights = flaky
        teacher = _teacher(replicas, reference, router, min_healthy_replicas=2, repair_attempts=1)
        for step in range(20):
            step_now["step"] = step
            woke = teacher.wake(step)
            assert woke.decision.action is not Action.HALT
            serving = set(teacher.serving)
            routed = _routed(router, replicas, 12)
            assert all((n > 0) == (r.url in serving) for r, n in zip(replicas, routed))
            teacher.sleep(step)
        assert all(r.server.dead_reason is None for r in replicas)
