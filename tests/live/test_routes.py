"""MOPD: a teacher per route, each guarded on its own with its own reference. The pure decision
of the whole and the cross-route gate, then two routes ("math", "code") over two different tiny
checkpoints served by reference replicas on loopback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from distill_guard.checks.canary import CanaryCheck
from distill_guard.errors import GuardError, GuardValueError
from distill_guard.findings import Code, Finding, Severity
from distill_guard.live.receipts import Verdict, WakeLedger, WakeReceipt
from distill_guard.live.replicas import FleetWake, Move, ReplicatedTeacher
from distill_guard.live.routes import (
    Route,
    RouteDownError,
    RouteReceipt,
    TeacherRoutes,
    route_gate,
    routes_decision,
)
from distill_guard.live.teacher_reference import reference_from_checkpoint
from distill_guard.metric_names import looks_like
from distill_guard.policy import Action, Decision
from distill_guard.teachers.base import TeacherError
from distill_guard.teachers.replicas import make_replicas
from distill_guard.testing.router import reference_replicas
from distill_guard.testing.tiny import build_tiny_qwen3

CHECK = CanaryCheck(length=16, top_k=4)
H, F = Verdict.HEALTHY, Verdict.FAILED
SEQ = [[1, 2, 3, 4, 5, 6]]


def _d(action: Action, *, notify: bool = True, reason: str | None = None) -> Decision:
    reasons = (Finding(reason, Severity.CRITICAL, "broken", 0),) if reason else ()
    return Decision(0, action, reasons, notify=notify)


# -- the decision of the whole, pure --------------------------------------------------------


def test_a_route_that_halts_is_down_and_the_others_train_on() -> None:
    d = routes_decision(
        3,
        {
            "math": _d(Action.HALT, reason=Code.TEACHER_REPLICAS_BELOW_MIN),
            "code": _d(Action.CONTINUE),
        },
        [],
    )
    assert d.action is Action.ALERT and d.notify
    assert "down: math" in d.message and "routes up: code" in d.message
    (reason,) = d.reasons
    assert reason.values["route"] == "math" and reason.message.startswith("[route math] ")


def test_only_a_required_route_or_every_route_down_halts_the_run() -> None:
    math_down = {"math": _d(Action.HALT), "code": _d(Action.CONTINUE)}
    assert routes_decision(0, math_down, ["math"]).action is Action.HALT
    assert routes_decision(0, math_down, ["code"]).action is Action.ALERT  # code is up
    both = {"math": _d(Action.HALT), "code": _d(Action.HALT)}
    halt = routes_decision(0, both, [])
    assert halt.action is Action.HALT and "every route is down" in halt.message
    ok = {"math": _d(Action.CONTINUE), "code": _d(Action.CONTINUE)}
    assert routes_decision(0, ok, ["math", "code"]).action is Action.CONTINUE


def test_a_route_that_stays_down_is_one_alert() -> None:
    math_down = {"math": _d(Action.HALT), "code": _d(Action.CONTINUE)}
    assert routes_decision(1, math_down, [], already_down=["math"]).notify is False
    repeat = {"math": _d(Action.HALT), "code": _d(Action.ALERT, notify=False)}
    assert routes_decision(1, repeat, [], already_down=["math"]).notify is False
    fresh = {"math": _d(Action.HALT), "code": _d(Action.ALERT, notify=True)}
    assert routes_decision(1, fresh, [], already_down=["math"]).notify is True


def test_the_gate_judges_each_receipt_by_its_own_routes_ledger() -> None:
    """The same replica key failed in math's ledger refuses math's sample only; a receipt of a
    route no ledger names is held (nothing vouches for it)."""
    key = ("http://a:1", 2, 0)
    r = WakeReceipt(*key[:2], H)
    receipts = [RouteReceipt("math", r), RouteReceipt("code", r), RouteReceipt("chat", r)]
    g = route_gate(receipts, {"math": {key: F}, "code": {key: H}})
    assert (g.admit, g.refuse, g.hold) == ((1,), (0,), (2,))


class _Fleet:
    """A stand-in for a route's ReplicatedTeacher: clean, or unreachable at every call."""

    def __init__(self, url: str, *, unreachable: bool = False) -> None:
        self.urls, self.unreachable, self.ledger = [url], unreachable, WakeLedger()

    def _call(self, step: int) -> FleetWake:
        if self.unreachable:
            raise TeacherError("connection refused")
        return FleetWake(Decision(step, Action.CONTINUE), [])

    wake = recheck = _call

    def sleep(self, step: int) -> dict[str, list[Finding]]:
        self._call(step)
        return {}


def test_a_route_whose_teacher_cannot_be_reached_is_down_alone() -> None:
    """Math's teacher raises at its sleep and its wake: reported (never raised) and math is
    down, alerted once; code's wake and recheck run as if math were not there."""
    mopd = TeacherRoutes(
        [
            Route("math", _Fleet("http://m:1", unreachable=True)),  # type: ignore[arg-type]
            Route("code", _Fleet("http://c:1")),  # type: ignore[arg-type]
        ]
    )
    slept = mopd.sleep(0)
    assert [f.code for f in slept["math"]] == [Code.TEACHER_UNREACHABLE] and slept["code"] == []
    first, again = mopd.wake(0), mopd.wake(1)
    assert first.down == again.down == ["math"] and first.routes["math"] is None
    assert first.decision.action is again.decision.action is Action.ALERT
    assert (first.decision.notify, again.decision.notify) == (True, False)
    assert mopd.recheck(1).decision.action is Action.ALERT


# -- two routes, two checkpoints, on loopback -----------------------------------------------


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("routes_tiny")
    return {
        "math": build_tiny_qwen3(root / "math", vocab_size=512, seed=0),
        "code": build_tiny_qwen3(root / "code", vocab_size=512, seed=1),
    }


@pytest.fixture(scope="module")
def references(checkpoints):
    return {name: reference_from_checkpoint(path, CHECK) for name, path in checkpoints.items()}


def _teacher(replicas, reference, **kw) -> ReplicatedTeacher:
    return ReplicatedTeacher(
        make_replicas([r.url for r in replicas]),
        reference,
        canary=CHECK,
        repair_attempts=1,
        repair_backoff_s=0.01,
        **kw,
    )


def test_each_route_is_checked_against_its_own_reference(references) -> None:
    assert references["math"].token_logprobs != references["code"].token_logprobs


def test_one_routes_failed_wake_refuses_only_its_samples_and_the_state_keeps_each_ledger(
    checkpoints, references
) -> None:
    """Math's second replica wakes zeroed at every wake: repaired and readmitted within math,
    code untouched. After a verified wake math's first replica goes bad (a bad push): the
    recheck fails that wake, and the gate refuses exactly its math samples while every code
    sample is admitted; the run trains on. A fresh TeacherRoutes loaded from the state judges
    the same receipts the same way, route by route."""
    with (
        reference_replicas(checkpoints["math"], [True, False]) as math,
        reference_replicas(checkpoints["code"], [True]) as code,
    ):

        def routes() -> TeacherRoutes:
            return TeacherRoutes(
                [
                    Route("math", _teacher(math, references["math"])),
                    Route("code", _teacher(code, references["code"]), required=True),
                ]
            )

        mopd = routes()
        mopd.sleep(0)
        woke = mopd.wake(0)
        assert woke.decision.action is Action.ALERT and woke.down == []
        zeroed = woke.routes["math"].replicas[1]
        assert zeroed.moves == [Move.QUARANTINE, Move.REPAIR, Move.READMIT]
        assert all(f.values["route"] == "math" for f in woke.decision.reasons)
        assert [r.moves for r in woke.routes["code"].replicas] == [[]]

        receipts = [mopd.score(route, SEQ)[1] for route in ("math", "code") * 3]
        assert [r.route for r in receipts] == ["math", "code"] * 3
        math[0].corrupt(seed=5)
        late = mopd.recheck(0)
        assert late.decision.action is Action.ALERT and late.down == []
        bad = {i for i, r in enumerate(receipts) if r.receipt.replica == math[0].url}
        g = mopd.gate(receipts)
        assert set(g.refuse) == bad and bad  # math's broken replica's samples, every one
        assert set(g.admit) == set(range(len(receipts))) - bad and g.hold == ()
        assert all(receipts[i].route == "code" for i in (1, 3, 5)) and not bad & {1, 3, 5}

        saved = json.loads(json.dumps(mopd.state_dict()))
        again = routes()
        again.load_state_dict(saved)
        assert again.gate(receipts) == g
        for name in ("math", "code"):
            assert again.teacher(name).ledger.verdicts == mopd.teacher(name).ledger.verdicts
        m = mopd.metrics()
        assert m["guard/route/math/up"] == m["guard/route/code/up"] == 1.0
        assert m["guard/route/math/replicas_healthy"] == 2.0
        assert all(looks_like(k) is None for k in m)


def test_a_swapped_route_is_a_failure_and_downs_only_that_route(checkpoints, references) -> None:
    """Math's replica serves code's checkpoint (the routes swapped at launch): held to math's
    reference it fails, its repair reloads the same wrong weights, so math is down (below its
    bound) and scores nothing; code trains on. Were math required, the run would halt."""
    with (
        reference_replicas(checkpoints["code"], [True]) as swapped,
        reference_replicas(checkpoints["code"], [True]) as code,
    ):
        for required in (False, True):
            mopd = TeacherRoutes(
                [
                    Route("math", _teacher(swapped, references["math"]), required=required),
                    Route("code", _teacher(code, references["code"])),
                ]
            )
            mopd.sleep(0)
            woke = mopd.wake(0)
            assert woke.down == ["math"]
            codes = {f.code for f in woke.decision.reasons if f.values["route"] == "math"}
            assert Code.TEACHER_REPLICAS_BELOW_MIN in codes
            assert not any(f.values["route"] == "code" for f in woke.decision.reasons)
            if required:
                assert woke.decision.action is Action.HALT
                continue
            assert woke.decision.action is Action.ALERT and woke.decision.notify
            with pytest.raises(RouteDownError):
                mopd.score("math", SEQ)
            assert issubclass(RouteDownError, GuardError)
            _, receipt = mopd.score("code", SEQ)
            assert mopd.gate([receipt]).admit == (0,)
            assert mopd.recheck(0).down == ["math"]  # stays down, not rechecked
            assert mopd.metrics()["guard/route/math/up"] == 0.0


def test_a_replica_in_two_routes_is_refused(checkpoints, references) -> None:
    with (
        reference_replicas(checkpoints["math"], [True]) as one,
        pytest.raises(GuardValueError, match="in routes 'math' and 'code'"),
    ):
        TeacherRoutes(
            [
                Route("math", _teacher(one, references["math"])),
                Route("code", _teacher(one, references["code"])),
            ]
        )
