"""All-rank decisions over real 2-process gloo groups on 127.0.0.1."""

from __future__ import annotations

import datetime
import json
import math
import os
import socket
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from distill_guard.alerts import Alerter
from distill_guard.checks import Check, default_checks
from distill_guard.consensus import CONSENSUS_FAILED, DistributedReducer
from distill_guard.findings import Code, Finding, Severity
from distill_guard.guard import DistillGuard
from distill_guard.observations import RunSpec
from distill_guard.policy import Action, Decision, Policy
from distill_guard.teachers.base import TeacherUnreachable

V = 1000
WORLD = 2


class FakeRun:
    def __init__(self):
        self.alerts = []

    def alert(self, title, text, level, wait_duration):
        self.alerts.append({"title": title, "level": getattr(level, "value", str(level))})


class SlowDeadCanary:
    """A canary whose teacher call runs into the client's own timeout after ``delay_s``."""

    def __init__(self, delay_s):
        self.delay_s = delay_s

    def verify(self, teacher, step=None):
        time.sleep(self.delay_s)
        raise TeacherUnreachable(f"POST /generate: no answer within {self.delay_s} s")

    def fingerprint(self, teacher, step=None):
        return None


class PassingCanary:
    def verify(self, teacher, step=None):
        return []

    def fingerprint(self, teacher, step=None):
        return None


class QuietTeacher:
    vocab_size = V
    asleep = False


def _guard(rank, out, *, timeout_s=20.0, policy=None, **kwargs):
    run = FakeRun()
    guard = DistillGuard(
        policy=policy or Policy(critical_action="halt"),
        run=RunSpec(vocab_size=V),
        events=out / f"events{rank}.jsonl",
        alerter=Alerter(rank=rank, run=run, min_interval_s=0.0),
        reducer=DistributedReducer(timeout_s=timeout_s),
        rank=rank,
        **kwargs,
    )
    guard.reducer.setup()
    return guard, run


def _healthy_topk(n=32, k=8):
    g = torch.Generator().manual_seed(0)
    return torch.log_softmax(torch.randn(n, V, generator=g) * 3, -1).topk(k, -1).values


def _uniform_topk(n=32, k=8):
    return torch.full((n, k), -math.log(V))


def _record(d: Decision, t0: float) -> dict:
    return {
        "action": d.action.value,
        "message": d.message,
        "codes": sorted({f.code for f in d.reasons}),
        "repaired": d.repaired,
        "elapsed": time.monotonic() - t0,
    }


def scenario_collapse_on_one_rank(rank, out):
    guard, run = _guard(rank, out)
    res = {}
    t0 = time.monotonic()
    res["healthy"] = _record(guard.on_teacher_scores(0, topk_logprobs=_healthy_topk()), t0)
    loss = 0.9 if rank == 1 else 0.01  # above the JSD ceiling on rank 1 only: a warning
    res["warn"] = _record(guard.on_step_metrics(0, {"loss": loss}), t0)
    topk = _uniform_topk() if rank == 1 else _healthy_topk()
    res["collapse"] = _record(guard.on_teacher_scores(1, topk_logprobs=topk), t0)
    res["after"] = _record(guard.on_step_metrics(1, {"loss": 0.01}), t0)
    res["halted"] = guard.halted
    res["alerts"] = run.alerts
    return res


def scenario_teacher_times_out(rank, out):
    canary = SlowDeadCanary(1.0) if rank == 1 else PassingCanary()
    guard, run = _guard(rank, out, teacher=QuietTeacher(), canary=canary)
    t0 = time.monotonic()
    return {"wake": _record(guard.wake(0), t0), "alerts": run.alerts}


class WeightLosingTeacher:
    """Loses its weights at every wake when ``faulty``; a reload brings them back if ``fixable``."""

    vocab_size = V
    asleep = False

    def __init__(self, faulty, fixable=True):
        self.faulty, self.fixable = faulty, fixable
        self.broken = False
        self.reloads = 0

    def wake(self):
        self.broken = self.faulty

    def mark_resumed(self, tags=None):  # the host (``wake``) resumed it
        pass

    def reload_weights(self, model_path=None):
        self.reloads += 1
        self.broken = self.broken and not self.fixable

    def flush_cache(self):
        pass


class BrokenOrNotCanary:
    reference = None  # no checkpoint reference: a repair is verified as a wake is

    def verify(self, teacher, step=None, *, repair=False):
        if not teacher.broken:
            return []
        return [Finding(Code.TEACHER_UNIFORM, Severity.CRITICAL, "canary: uniform", step)]

    def fingerprint(self, teacher, step=None):
        return None


def _wakes(rank, out, *, fixable, steps):
    teacher = WeightLosingTeacher(faulty=rank == 1, fixable=fixable)
    guard, run = _guard(
        rank,
        out,
        policy=Policy(),  # the default preset: rewake
        teacher=teacher,
        canary=BrokenOrNotCanary(),
        repair_attempts=1,
        repair_backoff_s=0.0,
    )
    t0 = time.monotonic()
    wakes = []
    for step in range(steps):
        wakes.append(_record(guard.wake(step, resume=teacher.wake), t0))
    return {
        "wakes": wakes,
        "reloads": teacher.reloads,
        "repairs": guard.repairs,
        "halted": guard.halted,
        "alerts": run.alerts,
    }


def scenario_one_rank_loses_weights_at_every_wake(rank, out):
    return _wakes(rank, out, fixable=True, steps=3)


def scenario_one_ranks_repair_fails(rank, out):
    return _wakes(rank, out, fixable=False, steps=1)


def scenario_rank_stalls(rank, out):
    guard, _ = _guard(rank, out, timeout_s=1.0)
    t0 = time.monotonic()
    if rank == 1:
        time.sleep(2.5)  # a teacher call that hangs far past the agreement's 1 s timeout
    first = _record(guard.on_teacher_scores(0, topk_logprobs=_healthy_topk()), t0)
    t1 = time.monotonic()
    later = _record(guard.on_step_metrics(0, {"loss": 0.01}), t1)
    return {"first": first, "later": later, "halted": guard.halted}


def scenario_ranks_out_of_step(rank, out):
    guard, _ = _guard(rank, out)
    t0 = time.monotonic()
    return {"d": _record(guard.on_step_metrics(rank, {"loss": 0.01}), t0)}


class ExplodingCheck(Check):
    """A check with a bug: it raises on every batch."""

    name = "exploding"

    def on_teacher_scores(self, scores, run):
        raise IndexError("a bug in a check")


class ExplodingPolicy(Policy):
    """A policy with a bug: deciding raises, before the guard's agreement with the other ranks."""

    def decide(self, step, findings):
        raise KeyError("a bug in the policy")


def scenario_guard_faults_on_one_rank(rank, out):
    checks = [*default_checks(), ExplodingCheck()] if rank == 1 else None
    guard, _ = _guard(rank, out, checks=checks)
    t0 = time.monotonic()
    check = _record(guard.on_teacher_scores(0, topk_logprobs=_healthy_topk()), t0)
    metrics = _record(guard.on_step_metrics(0, {"loss": 0.01}), t0)
    if rank == 1:
        guard.policy = ExplodingPolicy()
    t1 = time.monotonic()
    policy = _record(guard.on_teacher_scores(1, topk_logprobs=_healthy_topk()), t1)
    return {"check": check, "metrics": metrics, "policy": policy, "halted": guard.halted}


def scenario_rank_dies(rank, out):
    guard, _ = _guard(rank, out, timeout_s=3.0)
    if rank == 1:
        os._exit(3)  # the process is gone: no exception, no goodbye
    t0 = time.monotonic()
    first = _record(guard.on_teacher_scores(0, topk_logprobs=_healthy_topk()), t0)
    t1 = time.monotonic()
    later = _record(guard.on_step_metrics(0, {"loss": 0.01}), t1)
    (out / "result0.json").write_text(
        json.dumps({"first": first, "later": later, "halted": guard.halted})
    )
    os._exit(0)  # a process group with a dead peer cannot be torn down politely


def _worker(rank, port, scenario, outdir):
    torch.set_num_threads(1)
    out = Path(outdir)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD,
        timeout=datetime.timedelta(seconds=20),  # a crashed peer fails the test, not hangs it
    )
    try:
        result = globals()[scenario](rank, out)
    finally:
        dist.destroy_process_group()
    (out / f"result{rank}.json").write_text(json.dumps(result))


def _start(ctx, scenario, tmp_path, join):
    """``WORLD`` new rank processes of ``ctx`` (the session's fork server: no torch import each),
    with ``mp.spawn``'s error reporting."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return mp.start_processes(
        _worker,
        args=(port, scenario, str(tmp_path)),
        nprocs=WORLD,
        join=join,
        start_method=ctx.get_start_method(),
    )


def _spawn(ctx, scenario, tmp_path):
    t0 = time.monotonic()
    _start(ctx, scenario, tmp_path, join=True)
    wall = time.monotonic() - t0
    return [json.loads((tmp_path / f"result{r}.json").read_text()) for r in range(WORLD)], wall


def _spawn_with_exits(ctx, scenario, tmp_path, timeout_s=40):
    """Like ``_spawn``, for scenarios where ranks leave by ``os._exit``; returns exit codes."""
    ranks = _start(ctx, scenario, tmp_path, join=False)
    for p in ranks.processes:
        p.join(timeout_s)
    codes = [p.exitcode for p in ranks.processes]
    for p in ranks.processes:
        if p.exitcode is None:
            p.kill()
    return codes


def _events(path):
    return (
        [json.loads(line) for line in Path(path).read_text().splitlines()] if path.exists() else []
    )


@pytest.mark.timeout(30)
def test_collapse_seen_by_one_rank_halts_both_with_its_reason(tmp_path, forkserver):
    (r0, r1), _ = _spawn(forkserver, "scenario_collapse_on_one_rank", tmp_path)
    for r in (r0, r1):
        assert r["healthy"]["action"] == "continue"
        assert r["warn"]["action"] == "alert" and r["warn"]["codes"] == [Code.LOSS_ABOVE_CEILING]
        assert r["collapse"]["action"] == "halt" and r["collapse"]["codes"] == [
            Code.TEACHER_UNIFORM
        ]
        assert r["after"]["action"] == "halt" and r["halted"]
    assert r0["collapse"]["message"].startswith("rank 1: halt")  # the reason, broadcast
    assert not r1["collapse"]["message"].startswith("rank")  # rank 1's own words
    # wandb from rank 0 only: a WARN for the warning, an ERROR for the halt
    assert [(a["level"], a["title"]) for a in r0["alerts"]] == [
        ("WARN", "distill_guard: loss.above_ceiling"),
        ("ERROR", "distill_guard halt: teacher.uniform"),
    ]
    assert r1["alerts"] == []
    for rank in (0, 1):
        halts = [e for e in _events(tmp_path / f"events{rank}.jsonl") if e["kind"] == "halt"]
        assert (
            len(halts) == 1 and halts[0]["step"] == 1 and "teacher.uniform" in halts[0]["message"]
        )


@pytest.mark.timeout(30)
def test_one_ranks_teacher_timing_out_is_a_shared_warning_not_a_hang(tmp_path, forkserver):
    (r0, r1), _ = _spawn(forkserver, "scenario_teacher_times_out", tmp_path)
    for r in (r0, r1):
        assert r["wake"]["action"] == "alert"
        assert r["wake"]["codes"] == [Code.TEACHER_UNREACHABLE]
    assert r0["wake"]["message"].startswith("rank 1:")
    assert 0.9 < r0["wake"]["elapsed"] < 10  # rank 0 waited for rank 1's teacher, no longer
    assert [a["level"] for a in r0["alerts"]] == ["WARN"] and r1["alerts"] == []


@pytest.mark.timeout(30)
def test_only_the_faulty_rank_repairs_and_rank_0_alerts_once_per_incident(tmp_path, forkserver):
    (r0, r1), _ = _spawn(forkserver, "scenario_one_rank_loses_weights_at_every_wake", tmp_path)
    for r in (r0, r1):
        assert [w["action"] for w in r["wakes"]] == ["rewake"] * 3 and not r["halted"]
        assert all(Code.TEACHER_UNIFORM in w["codes"] for w in r["wakes"])
    assert (r0["reloads"], r0["repairs"]) == (0, 0)  # a healthy teacher is left alone
    assert (r1["reloads"], r1["repairs"]) == (3, 3)
    assert all(w["message"].startswith("rank 1: rewake") for w in r0["wakes"])
    # every rank agrees on the action; "repaired" is each rank's own: only rank 1 reloaded
    assert [w["repaired"] for w in r1["wakes"]] == [True] * 3
    assert [w["repaired"] for w in r0["wakes"]] == [False] * 3
    assert all("teacher repaired" in w["message"] for w in r0["wakes"])
    # one incident, one wandb alert from rank 0, carrying rank 1's fix; not one per wake
    assert [(a["level"], a["title"]) for a in r0["alerts"]] == [
        ("ERROR", "distill_guard rewake: teacher.uniform")
    ]
    assert r1["alerts"] == []
    assert not any(e["kind"].startswith("repair") for e in _events(tmp_path / "events0.jsonl"))


@pytest.mark.timeout(30)
def test_a_repair_that_fails_on_one_rank_halts_every_rank_in_the_same_step(tmp_path, forkserver):
    (r0, r1), _ = _spawn(forkserver, "scenario_one_ranks_repair_fails", tmp_path)
    for r in (r0, r1):
        (wake,) = r["wakes"]
        assert wake["action"] == "halt" and Code.TEACHER_REPAIR_FAILED in wake["codes"]
        assert r["halted"]
    assert r0["reloads"] == 0 and r1["reloads"] == 1
    assert r0["wakes"][0]["message"].startswith("rank 1: halt: teacher repair failed")
    assert [a["level"] for a in r0["alerts"]] == ["ERROR"]
    for rank in (0, 1):
        halts = [e for e in _events(tmp_path / f"events{rank}.jsonl") if e["kind"] == "halt"]
        assert len(halts) == 1 and halts[0]["step"] == 0


@pytest.mark.timeout(30)
def test_a_rank_stuck_past_the_timeout_halts_everyone(tmp_path, forkserver):
    (r0, r1), wall = _spawn(forkserver, "scenario_rank_stalls", tmp_path)
    assert r0["first"]["action"] == "halt" and CONSENSUS_FAILED in r0["first"]["codes"]
    assert 0.9 < r0["first"]["elapsed"] < 2.4  # gave up after the 1 s timeout, before rank 1 came
    assert "no answer from the other ranks within 1 s" in r0["first"]["message"]
    # the late rank finds the group closed and halts too, without waiting another timeout
    assert r1["first"]["action"] == "halt" and CONSENSUS_FAILED in r1["first"]["codes"]
    for r in (r0, r1):
        assert r["halted"] and r["later"]["action"] == "halt" and r["later"]["elapsed"] < 0.5
    assert wall < 25


@pytest.mark.timeout(30)
def test_ranks_at_different_steps_halt_instead_of_mismatching(tmp_path, forkserver):
    (r0, r1), _ = _spawn(forkserver, "scenario_ranks_out_of_step", tmp_path)
    for r in (r0, r1):
        assert r["d"]["action"] == "halt" and "different guard steps (0..1)" in r["d"]["message"]


@pytest.mark.timeout(60)
def test_a_rank_that_dies_halts_the_others_within_the_timeout(tmp_path, forkserver):
    codes = _spawn_with_exits(forkserver, "scenario_rank_dies", tmp_path)
    assert codes == [0, 3]  # rank 0 finished its hooks; rank 1 died
    r0 = json.loads((tmp_path / "result0.json").read_text())
    assert r0["first"]["action"] == "halt" and CONSENSUS_FAILED in r0["first"]["codes"]
    assert r0["first"]["elapsed"] < 10  # the 3 s agreement timeout, not a hang
    assert r0["halted"] and r0["later"]["action"] == "halt" and r0["later"]["elapsed"] < 0.5
    halts = [e for e in _events(tmp_path / "events0.jsonl") if e["kind"] == "halt"]
    assert len(halts) == 1 and "could not agree" in halts[0]["message"]


@pytest.mark.timeout(30)
def test_guard_faults_on_one_rank_are_shared_safe_decisions_and_the_ranks_stay_in_step(
    tmp_path, forkserver
):
    (r0, r1), _ = _spawn(forkserver, "scenario_guard_faults_on_one_rank", tmp_path)
    for r in (r0, r1):
        # a check that raises: skipped this step, a warning every rank shares
        assert r["check"]["action"] == "alert"
        assert r["check"]["codes"] == [Code.GUARD_INTERNAL_ERROR]
        assert r["metrics"]["action"] == "continue"
        # a fault before the agreement (the policy): the safe decision still reaches it
        assert r["policy"]["action"] == "skip_batch", r["policy"]
        assert r["policy"]["codes"] == [Code.GUARD_INTERNAL_ERROR] and not r["halted"]
        assert r["policy"]["elapsed"] < 10  # not the 20 s agreement timeout
    assert r0["check"]["message"].startswith("rank 1:")
    assert r0["policy"]["message"].startswith("rank 1: skip_batch: guard fault")


def test_single_process_is_a_pass_through():
    reducer = DistributedReducer()
    d = Decision(3, Action.SKIP_BATCH, message="x")
    assert reducer(d) is d and reducer.broken is None


def test_gloo_is_available():
    assert dist.is_available() and dist.is_gloo_available()
    assert os.name == "posix"
