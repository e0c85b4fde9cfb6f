"""Wake receipts and the gate before the optimizer: the pure gate (a wake found failed after it
scored, a pending one, healthy samples never dropped), then the receipts a replicated teacher
hands out, against reference replicas."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from distill_guard.checks.canary import CanaryCheck
from distill_guard.findings import Code
from distill_guard.live.receipts import (
    Verdict,
    WakeLedger,
    WakeReceipt,
    current,
    gate,
)
from distill_guard.live.replicas import (
    REPLICA_METRICS,
    Move,
    ReplicaState,
    ReplicatedTeacher,
    metric_id,
)
from distill_guard.live.teacher_reference import reference_from_checkpoint
from distill_guard.metric_names import looks_like
from distill_guard.policy import Action
from distill_guard.teachers.replicas import make_replicas
from distill_guard.testing.router import reference_replicas
from distill_guard.testing.tiny import build_tiny_qwen3

H, P, F = Verdict.HEALTHY, Verdict.PENDING, Verdict.FAILED
A, B = "http://a:1", "http://b:2"
CHECK = CanaryCheck(length=16, top_k=4)


def _r(url: str | None, wake: int, verdict: Verdict = H, repair: int = 0, **kw) -> WakeReceipt:
    return WakeReceipt(url, wake, verdict, repair, **kw)


# -- the gate, pure ----------------------------------------------------------------------


def test_a_wake_found_failed_after_it_scored_has_its_samples_refused() -> None:
    """The receipts were handed out healthy; a later canary failed A's wake 3: every sample it
    scored is refused, B's and A's after the repair are admitted."""
    receipts = [_r(A, 3), _r(B, 3), _r(A, 3), _r(B, 3), _r(A, 3, repair=1)]
    before = {(A, 3, 0): H, (B, 3, 0): H, (A, 3, 1): H}
    assert gate(receipts, before).admit == (0, 1, 2, 3, 4)
    after = {**before, (A, 3, 0): F}
    g = gate(receipts, after)
    assert g.refuse == (0, 2) and g.admit == (1, 3, 4) and g.hold == ()
    assert receipts[0].verdict is H and current(receipts[0], after) is F  # the receipt as given


def test_a_pending_wake_holds_its_samples_until_its_check_ends() -> None:
    receipts = [_r(A, 1, P), _r(B, 1, P), _r(A, 0)]
    ledger = WakeLedger()
    ledger.open((A, 1, 0))
    ledger.open((B, 1, 0))
    g = gate(receipts, ledger.verdicts)
    assert g.hold == (0, 1, 2) and g.admit == g.refuse == ()  # wake 0 is unknown: held too
    ledger.settle((A, 1, 0), H)
    ledger.settle((B, 1, 0), F)
    g = gate(receipts, ledger.verdicts)
    assert g.admit == (0,) and g.refuse == (1,) and g.hold == (2,)


def test_healthy_samples_are_never_dropped() -> None:
    """Seeded random receipts and verdicts: a sample whose every wake is healthy is admitted,
    one with a failed wake refused, every other held, and each sample lands in exactly one."""
    rng = random.Random(29)
    urls = [f"http://r{i}:1" for i in range(4)]
    for _ in range(200):
        verdicts = {
            (u, w, k): rng.choice(list(Verdict)) for u in urls for w in (1, 2) for k in (0, 1)
        }
        receipts = []
        for _ in range(12):
            if rng.random() < 0.3:
                keys = tuple(rng.sample(sorted(verdicts), rng.randint(1, 3)))
                receipts.append(_r(None, 2, candidates=keys))
            else:
                receipts.append(_r(rng.choice(urls), rng.choice((1, 2)), repair=rng.randint(0, 1)))
        g = gate(receipts, verdicts)
        assert sorted(g.admit + g.refuse + g.hold) == list(range(len(receipts)))
        for i, r in enumerate(receipts):
            vs = {verdicts[k] for k in r.keys}
            if vs == {H}:
                assert i in g.admit
            elif F in vs:
                assert i in g.refuse
            else:
                assert i in g.hold


def test_a_routed_receipt_is_refused_when_any_replica_it_may_have_reached_failed() -> None:
    routed = _r(None, 4, candidates=((A, 4, 0), (B, 4, 0)))
    assert gate([routed], {(A, 4, 0): H, (B, 4, 0): H}).admit == (0,)
    assert gate([routed], {(A, 4, 0): H, (B, 4, 0): F}).refuse == (0,)
    assert gate([routed], {(A, 4, 0): H}).hold == (0,)
    assert gate([_r(None, 4)], {}).hold == (0,)  # no replica named at all: nothing vouches


def test_the_ledger_keeps_a_failure_and_its_recent_wakes_and_resumes() -> None:
    ledger = WakeLedger(keep_wakes=2)
    ledger.open((A, 1, 0))
    ledger.settle((A, 1, 0), F)
    ledger.settle((A, 1, 0), H)
    assert ledger.get((A, 1, 0)) is F  # a later check cannot vouch for a failed wake's samples
    ledger.open((A, 2, 0))
    ledger.open((A, 3, 0))
    assert (A, 1, 0) not in ledger.verdicts and ledger.get((A, 1, 0)) is P
    again = WakeLedger()
    again.load_state_dict(ledger.state_dict())
    assert again.verdicts == ledger.verdicts and again.keep_wakes == 2


# -- the receipts of a replicated teacher -------------------------------------------------


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return build_tiny_qwen3(tmp_path_factory.mktemp("receipts_tiny"), vocab_size=512)


@pytest.fixture(scope="module")
def reference(tiny_dir):
    return reference_from_checkpoint(tiny_dir, CHECK)


def test_the_replica_that_scored_is_named_and_a_late_canary_refuses_its_samples(
    tiny_dir, reference
) -> None:
    """Two replicas scored by the guard's round robin; one's weights go bad after its wake was
    verified (a bad push). The canary after scoring fails that wake: the gate refuses exactly
    its samples, the replica is quarantined, repaired, verified and readmitted, and what it
    scores after carries the repair's receipt, healthy."""
    with reference_replicas(tiny_dir, [True, True]) as replicas:
        teacher = ReplicatedTeacher(
            make_replicas([r.url for r in replicas]), reference, canary=CHECK, repair_attempts=1
        )
        assert teacher.receipt(replicas[0].url).verdict is P  # before any wake: pending
        teacher.sleep(0)
        teacher.wake(0)
        scored = [teacher.score([[1, 2, 3, 4, 5, 6]]) for _ in range(4)]
        receipts = [r for _, r in scored]
        assert [r.replica for r in receipts] == [replicas[i].url for i in (0, 1, 0, 1)]
        assert {(r.wake, r.repair, r.verdict) for r in receipts} == {(1, 0, H)}
        replicas[1].corrupt(seed=3)
        assert teacher.gate(receipts).admit == (0, 1, 2, 3)  # not yet known
        late = teacher.recheck(0)
        assert teacher.gate(receipts).to_dict() == {"admit": [0, 2], "refuse": [1, 3], "hold": []}
        bad = late.replicas[1]
        assert bad.moves == [Move.QUARANTINE, Move.REPAIR, Move.READMIT]
        out = next(f for f in bad.findings if f.code == Code.TEACHER_REPLICA_QUARANTINED)
        assert "failed its check after scoring (its wake's samples are refused)" in out.message
        assert bad.state is ReplicaState.SERVING and late.replicas[0].moves == []
        after = teacher.receipt(replicas[1].url)
        assert (after.wake, after.repair, after.verdict) == (1, 1, H)
        assert teacher.gate([*receipts, after]).refuse == (1, 3)
        routed = teacher.routed_receipt()
        assert set(routed.candidates) == {(replicas[0].url, 1, 0), (replicas[1].url, 1, 1)}
        assert routed.verdict is H and teacher.gate([routed]).admit == (0,)


# -- per-replica metrics and one alert per incident per replica ---------------------------


def test_one_alert_per_incident_per_replica_and_its_metrics(tiny_dir, reference) -> None:
    """A replica that wakes zeroed three times in a row is one incident: alerted at its first
    wake, counted at the next two (the decision does not notify); a clean wake ends it, and its
    weights going bad later is a new incident, alerted again. The metrics count each."""
    with reference_replicas(tiny_dir, [True, False]) as replicas:
        teacher = ReplicatedTeacher(
            make_replicas([r.url for r in replicas]),
            reference,
            canary=CHECK,
            repair_attempts=1,
            repair_backoff_s=0.01,
        )
        bad = metric_id(replicas[1].url)
        alerted, notified = [], []
        for step in range(3):
            teacher.sleep(step)
            woke = teacher.wake(step)
            alerted.append([f.code for f in woke.alerts])
            notified.append(woke.decision.notify)
            assert woke.decision.action is Action.ALERT
        assert alerted == [[Code.TEACHER_REPLICA_QUARANTINED], [], []]
        assert notified == [True, False, False]
        m = teacher.metrics()
        assert m["guard/replicas_healthy"] == 2.0 and m["guard/replicas_quarantined"] == 0.0
        assert {k.rsplit("/", 1)[1]: v for k, v in m.items() if f"/{bad}/" in k} == {
            "serving": 1.0,
            "quarantines": 3.0,
            "failed_wakes": 3.0,
            "repairs": 3.0,
            "incidents": 1.0,
        }
        assert m[f"guard/replica/{metric_id(replicas[0].url)}/quarantines"] == 0.0
        replicas[1].next_wakes(backup=True)
        teacher.sleep(3)
        clean = teacher.wake(3)  # unaided: the incident is over
        assert not clean.alerts and clean.decision.action is Action.CONTINUE
        replicas[1].corrupt(seed=1)
        late = teacher.recheck(3)
        assert [r.alert is not None for r in late.replicas] == [False, True]
        assert late.decision.notify
        m = teacher.metrics()
        assert m[f"guard/replica/{bad}/incidents"] == 2.0
        assert m[f"guard/replica/{bad}/failed_wakes"] == 4.0
        assert all(looks_like(k) is None for k in m)  # never taken for a training metric
        assert set(REPLICA_METRICS) == {re.sub(r"/replica/[^/]+/", "/replica/<id>/", k) for k in m}
