"""DistillGuard: runs the checks per stage, asks the policy, logs, alerts, and never raises."""

from __future__ import annotations

import copy
import json
import logging
import math
import tracemalloc
from dataclasses import dataclass

import pytest
import torch

from distill_guard.alerts import Alerter
from distill_guard.checks import Check, JSDCeilingCheck, TruncationCheck
from distill_guard.events import read_events
from distill_guard.findings import Code, Finding, Severity
from distill_guard.guard import DistillGuard, default_checks
from distill_guard.observations import LossKind, RunSpec
from distill_guard.policy import Action, Decision, Policy
from tests.conftest import LN_QWEN3_V, QWEN3_V

RUN = RunSpec(vocab_size=QWEN3_V)
HEALTHY = {"loss": 0.02, "student_entropy": 0.41, "truncated_ratio": 0.04, "teacher_logprob": -0.35}
COLLAPSED = {**HEALTHY, "loss": 0.688}


def strict_loads(line: str):
    def reject(token):
        raise AssertionError(f"non-standard JSON token {token} in event line")

    return json.loads(line, parse_constant=reject)


@dataclass
class Boom(Check):
    """A check with a bug in it."""

    enabled: bool = True
    """Switch."""

    name = "boom"

    def on_step_metrics(self, metrics, run):
        raise RuntimeError("kaboom 42")

    def on_teacher_scores(self, scores, run):
        raise IndexError("index 7 is out of bounds")


# ---------------------------------------------------------------- the guard never raises


def test_a_raising_check_becomes_an_internal_error_finding(make_guard, caplog):
    seen: list[Finding] = []
    guard = make_guard([Boom(), JSDCeilingCheck()], run=RUN, on_finding=seen.append)
    with caplog.at_level(logging.ERROR, logger="distill_guard"):
        d = guard.on_step_metrics(0, COLLAPSED)
    codes = sorted(f.code for f in seen)
    assert codes == [Code.GUARD_INTERNAL_ERROR, Code.LOSS_JSD_CEILING]  # the other check ran
    err = next(f for f in seen if f.code == Code.GUARD_INTERNAL_ERROR)
    assert err.severity is Severity.WARN and err.step == 0
    assert err.values["who"] == "boom" and "kaboom 42" in err.values["error"]
    # the ceiling finding still drives the decision: a rewake, which without a teacher to
    # reload and after the update is only an alert
    assert d.action is Action.ALERT and d.intended is Action.REWAKE
    assert "kaboom" in caplog.text  # the traceback reaches the log
    d = guard.on_teacher_scores(1, topk_logprobs=torch.zeros(3, 2))
    assert d.action is Action.ALERT and "IndexError" in d.reasons[0].message


def test_a_raising_reducer_halts_rather_than_diverging(make_guard):
    def reducer(decision):
        raise TimeoutError("allreduce timed out")

    guard = make_guard(run=RUN, reducer=reducer)
    d = guard.on_step_metrics(0, HEALTHY)
    assert d.action is Action.HALT and "could not agree" in d.message
    assert guard.halted


def test_the_reducer_sees_and_can_replace_every_decision(make_guard):
    seen: list[Decision] = []

    def reducer(decision):
        seen.append(decision)
        # another rank saw a dead teacher: everyone skips
        return Decision(decision.step, Action.SKIP_BATCH, message="rank 3 says skip")

    guard = make_guard(run=RUN, reducer=reducer)
    d = guard.on_step_metrics(0, HEALTHY, before_update=True)
    assert [s.action for s in seen] == [Action.CONTINUE]
    assert d.action is Action.SKIP_BATCH and d.message == "rank 3 says skip"
    d = guard.on_step_metrics(1, HEALTHY)  # after the update: the skip cannot happen any more
    assert d.action is Action.ALERT and d.intended is Action.SKIP_BATCH
    assert (
        d.message == "rank 3 says skip; the update of this step was already taken: nothing skipped"
    )


# ---------------------------------------------------------------- decisions by stage


def test_uniform_teacher_scores_skip_the_update_when_no_teacher_can_be_rewoken(make_guard):
    guard = make_guard(run=RUN)
    d = guard.on_teacher_scores(3, topk_logprobs=torch.full((16, 8), -LN_QWEN3_V))
    assert d.action is Action.SKIP_BATCH and d.acts and d.intended is Action.REWAKE
    assert "no live teacher to reload: this update is skipped instead" in d.message
    assert [f.code for f in d.reasons] == [Code.TEACHER_UNIFORM]
    assert guard.summary.first == {Code.TEACHER_UNIFORM: 3}


def test_healthy_steps_continue_and_leave_no_trace(make_guard, tmp_path):
    guard = make_guard(run=RUN)
    for step in range(50):
        assert (
            guard.on_teacher_scores(step, token_logprobs=-torch.rand(64)).action is Action.CONTINUE
        )
        assert guard.on_step_metrics(step, HEALTHY).action is Action.CONTINUE
    guard.close()
    assert guard.summary.count == {}
    kinds = [e["kind"] for e in read_events(tmp_path / "events.jsonl")]
    assert kinds == ["attached", "closed"]  # watched, and nothing to report


def test_none_metrics_are_ignored(make_guard):
    guard = make_guard(run=RUN)
    assert (
        guard.on_step_metrics(0, {"loss": None, "student_entropy": None}).action is Action.CONTINUE
    )


def test_halt_is_sticky(make_guard, tmp_path):
    guard = make_guard(run=RUN, policy=Policy(halt_after_critical_steps=2))
    assert guard.on_step_metrics(0, COLLAPSED).intended is Action.REWAKE
    d = guard.on_step_metrics(1, COLLAPSED)
    assert d.action is Action.HALT and guard.halted
    assert guard.halt.step == 1 and guard.halt.codes == (Code.LOSS_JSD_CEILING,)
    assert guard.halt.stage == "step_metrics"
    for step in range(2, 5):  # healthy from now on: still halted, at every stage
        assert guard.on_step_metrics(step, HEALTHY).action is Action.HALT
        assert guard.on_teacher_scores(step, token_logprobs=-torch.rand(8)).action is Action.HALT
        assert guard.wake(step).action is Action.HALT
    halts = [e for e in read_events(tmp_path / "events.jsonl") if e["kind"] == "halt"]
    assert len(halts) == 1 and halts[0]["step"] == 1


def test_stop_on_halt_false_keeps_observing(make_guard):
    seen: list[Finding] = []
    guard = make_guard(
        run=RUN,
        policy=Policy(halt_after_critical_steps=1),
        stop_on_halt=False,
        on_finding=seen.append,
    )
    assert guard.on_step_metrics(0, COLLAPSED).action is Action.HALT
    assert guard.on_step_metrics(1, HEALTHY).action is Action.CONTINUE
    guard.on_step_metrics(2, {"loss": math.nan})
    assert [f.step for f in seen] == [0, 2]
    assert guard.halt.step == 0  # the first halt is the one recorded


def test_wake_and_sleep_without_a_teacher_only_run_the_hosts_calls(make_guard):
    guard = make_guard(run=RUN)
    calls = []
    assert guard.wake(0, resume=lambda: calls.append("resume")).action is Action.CONTINUE
    assert guard.sleep(0, release=lambda: calls.append("release")).action is Action.CONTINUE
    assert calls == ["resume", "release"]
    assert guard.wake(1).action is Action.CONTINUE and guard.sleep(1).action is Action.CONTINUE


# ---------------------------------------------------------------- callback and events


def test_on_finding_sees_every_finding_including_info(make_guard):
    seen: list[Finding] = []
    guard = make_guard(
        [TruncationCheck(window=1, min_rise_abs=0.0), JSDCeilingCheck()],
        run=RUN,
        on_finding=seen.append,
    )
    guard.on_step_metrics(0, {"loss": 0.688, "truncated_ratio": 0.9})
    guard.on_step_metrics(1, {"loss": 0.01})

    @dataclass
    class Info(Check):
        """Says something harmless."""

        enabled: bool = True
        """Switch."""

        def on_step_metrics(self, metrics, run):
            return [
                Finding("student.entropy_drop", Severity.INFO, "entropy fell by 1", metrics.step)
            ]

    guard.checks.append(Info())
    d = guard.on_step_metrics(2, {"loss": 0.01})
    assert d.action is Action.CONTINUE
    assert [(f.step, f.code) for f in seen] == [
        (0, Code.STUDENT_TRUNCATION),
        (0, Code.LOSS_JSD_CEILING),
        (2, Code.STUDENT_ENTROPY_DROP),
    ]


def test_events_one_line_per_finding_and_per_acting_decision_flushed(make_guard, tmp_path):
    path = tmp_path / "events.jsonl"
    seen: list[Finding] = []
    decisions: list[Decision] = []
    guard = make_guard(run=RUN, policy=Policy(halt_after_critical_steps=5), on_finding=seen.append)
    streams = [
        HEALTHY,
        COLLAPSED,
        HEALTHY,
        {**HEALTHY, "loss": math.nan, "truncated_ratio": math.inf},
    ]
    for step, metrics in enumerate(streams * 3):  # before the update: a NaN loss skips it
        decisions.append(guard.on_step_metrics(step, metrics, before_update=True))
    decisions.append(guard.on_teacher_scores(12, topk_logprobs=torch.full((4, 4), -LN_QWEN3_V)))
    # read while the guard is still open: every line must already be on disk
    lines = path.read_text().splitlines()
    events = [strict_loads(line) for line in lines]
    by_kind: dict[str, list[dict]] = {}
    for e in events:
        by_kind.setdefault(e["kind"], []).append(e)
    assert len(by_kind["finding"]) == len(seen) > 0
    acting = [d for d in decisions if d.action is not Action.CONTINUE]
    assert len(by_kind["decision"]) == len(acting) > 0
    assert [e["step"] for e in by_kind["decision"]] == [d.step for d in acting]
    assert [e["action"] for e in by_kind["decision"]] == [d.action.value for d in acting]
    assert [(e["step"], e["code"]) for e in by_kind["finding"]] == [(f.step, f.code) for f in seen]
    assert all(e["rank"] == 0 and isinstance(e["time"], float) for e in events)
    stages = {e["stage"] for e in by_kind["finding"]}
    assert stages == {"step_metrics_before_update", "teacher_scores"}
    # a NaN value in a finding is carried as a string, never as a bare NaN token
    nan_event = next(e for e in by_kind["finding"] if e["code"] == Code.METRIC_NONFINITE)
    assert nan_event["values"]["value"] in ("nan", "inf")


def test_events_are_tagged_with_the_rank(tmp_path, quiet_alerter):
    guard = DistillGuard(run=RUN, events=tmp_path / "r3.jsonl", alerter=quiet_alerter, rank=3)
    guard.on_step_metrics(0, COLLAPSED)
    guard.close()
    assert {e["rank"] for e in read_events(tmp_path / "r3.jsonl")} == {3}


def test_a_failing_alert_channel_is_an_event_not_an_exception(tmp_path):
    class Refusing:
        def alert(self, **kwargs):
            raise ConnectionError("wandb said no")

    guard = DistillGuard(
        run=RUN,
        events=tmp_path / "ev.jsonl",
        alerter=Alerter(run=Refusing(), log_alerts=False),
    )
    d = guard.on_step_metrics(0, COLLAPSED)
    assert d.action is Action.ALERT and d.intended is Action.REWAKE
    kinds = [e["kind"] for e in read_events(tmp_path / "ev.jsonl")]
    assert kinds == ["attached", "finding", "incident_open", "decision", "alert", "alert_failed"]
    failed = read_events(tmp_path / "ev.jsonl")[-1]
    assert "wandb said no" in failed["error"] and failed["title"].startswith("distill_guard")
    assert failed["sink"] == "wandb"


def test_alerts_name_the_code_and_the_level_follows_the_action(tmp_path):
    calls = []

    class Run:
        def alert(self, **kwargs):
            calls.append(kwargs)

    guard = DistillGuard(
        [TruncationCheck(window=1, min_rise_abs=0.0), JSDCeilingCheck()],
        run=RUN,
        alerter=Alerter(run=Run(), log_alerts=False, min_interval_s=0),
    )
    guard.on_step_metrics(0, {"truncated_ratio": 0.9})
    guard.on_step_metrics(1, {"loss": 0.688}, before_update=True)
    assert [c["title"] for c in calls] == [
        "distill_guard: student.truncation",
        "distill_guard skip_batch: loss.jsd_ceiling",  # what was done, not the rewake it wanted
    ]
    assert [str(c["level"]).rsplit(".", 1)[-1] for c in calls] == ["WARN", "ERROR"]
    assert "step 1" in calls[1]["text"] and "0.688" in calls[1]["text"]


# ---------------------------------------------------------------- state


def drive(guard: DistillGuard, steps: range) -> list[tuple[str, list[str]]]:
    """A stream with a warm-up, an entropy rise, truncation and two dead-teacher steps."""
    out = []
    for s in steps:
        m = {
            "loss": 0.688 if s in (70, 71) else 0.02,
            "student_entropy": 1.0 + 0.05 * ((s * 7) % 5 - 2) + (1.5 if s >= 60 else 0.0),
            "truncated_ratio": 0.9 if 40 <= s < 50 else 0.05,
        }
        d = guard.on_step_metrics(s, m)
        out.append((d.action.value, sorted(f.code for f in d.reasons)))
    return out


def test_state_dict_round_trip_continues_identically(make_guard, quiet_alerter):
    a = make_guard(run=RunSpec(vocab_size=QWEN3_V, beta=0.3, loss_scale=2.0), events=None)
    drive(a, range(0, 69))
    state = json.loads(json.dumps(a.state_dict(), allow_nan=False))  # a checkpoint holds JSON
    b = DistillGuard(alerter=quiet_alerter)  # built without the run spec: the state carries it
    b.load_state_dict(state)
    assert b.run == a.run
    assert b.state_dict() == a.state_dict()
    assert drive(a, range(69, 90)) == drive(b, range(69, 90))
    assert a.summary.state_dict() == b.summary.state_dict()
    assert a.halted == b.halted


def test_a_resumed_guard_remembers_an_incident_in_progress(make_guard):
    """Two critical steps before the checkpoint, one after: the resumed guard halts."""
    a = make_guard(run=RUN, events=None)  # halt after 3 consecutive critical steps
    assert [a.on_step_metrics(s, COLLAPSED).intended for s in (0, 1)] == [Action.REWAKE] * 2
    b = make_guard(run=RUN, events=None)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert b.on_step_metrics(2, COLLAPSED).action is Action.HALT
    fresh = make_guard(run=RUN, events=None)
    assert fresh.on_step_metrics(2, COLLAPSED).intended is Action.REWAKE


def test_loaded_halt_stays_halted(make_guard):
    a = make_guard(run=RUN, policy=Policy(halt_after_critical_steps=1), events=None)
    a.on_step_metrics(0, COLLAPSED)
    b = make_guard(run=RUN, events=None)
    b.load_state_dict(a.state_dict())
    assert b.halted and b.on_step_metrics(1, HEALTHY).action is Action.HALT


def test_a_halt_lifted_on_load_resumes_with_the_counts_and_says_so(make_guard, tmp_path):
    """The resume after a fixed cause (docs/integrations.md, "Checkpoints after a halt")."""
    a = make_guard(run=RUN, policy=Policy(halt_after_critical_steps=1), events=None)
    a.on_step_metrics(0, COLLAPSED)
    state = a.state_dict()
    b = make_guard(run=RUN, events=tmp_path / "resumed.jsonl")
    b.load_state_dict(state, keep_halt=False)
    assert not b.halted and b.on_step_metrics(1, HEALTHY).action is Action.CONTINUE
    assert b.summary.count == a.summary.count  # what the halted run found is kept
    b.close()
    (lifted,) = [e for e in read_events(tmp_path / "resumed.jsonl") if e["kind"] == "halt_lifted"]
    assert lifted["step"] == 0 and lifted["halt"]["step"] == 0
    assert state["summary"]["halt"] is not None, "loading must not change the caller's state"


def test_state_dict_is_a_snapshot(make_guard):
    """A saved state must not change as the run goes on, nor tie two guards together."""
    a = make_guard(run=RUN, events=None)
    drive(a, range(0, 45))
    state = a.state_dict()
    frozen = copy.deepcopy(state)
    drive(a, range(45, 80))
    assert state == frozen, "the state returned earlier changed with later steps"
    b = make_guard(run=RUN, events=None)
    b.load_state_dict(state)
    drive(b, range(45, 80))
    assert state == frozen, "loading a state and running on mutated the caller's dict"
    c = make_guard(run=RUN, events=None)
    c.load_state_dict(state)
    assert c.summary.state_dict() == frozen["summary"]


def test_unknown_checks_in_a_state_are_ignored(make_guard):
    a = make_guard(run=RUN, events=None)
    drive(a, range(30))
    state = a.state_dict()
    state["checks"]["a_check_from_the_future"] = {"x": 1}
    b = make_guard([TruncationCheck()], run=RUN, events=None)
    b.load_state_dict(state)
    assert b.checks[0].state_dict() == state["checks"]["truncation"]


def test_run_spec_round_trip_keeps_the_loss_kind(make_guard):
    a = make_guard(run=RunSpec(vocab_size=32000, loss=LossKind.REVERSE_KL, beta=0.0), events=None)
    b = make_guard(events=None)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert b.run.loss is LossKind.REVERSE_KL and b.run.vocab_size == 32000


@pytest.mark.slow  # benchmarks/soak.py holds the same bound over 100k steps
def test_memory_is_bounded_over_20k_steps(quiet_alerter):
    guard = DistillGuard(run=RUN, events=None, alerter=quiet_alerter)

    def step(s: int) -> None:
        m = {
            "loss": math.nan if s % 97 == 0 else 0.02,
            "student_entropy": 0.41 + 0.01 * ((s * 7) % 5 - 2),
            "truncated_ratio": 0.9 if (s // 50) % 2 else 0.04,  # warns half the time
        }
        guard.on_step_metrics(s, m, before_update=True)  # a NaN loss skips, never halts

    for s in range(2_000):
        step(s)
    size_2k = len(json.dumps(guard.state_dict()))
    tracemalloc.start()
    for s in range(2_000, 11_000):
        step(s)
    base, _ = tracemalloc.get_traced_memory()
    for s in range(11_000, 20_000):
        step(s)
    grown, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    size_20k = len(json.dumps(guard.state_dict()))
    assert guard.summary.count[Code.STUDENT_TRUNCATION] > 5_000  # it did see findings
    assert size_20k <= size_2k + 64  # only counters' digits may grow
    assert grown - base < 64 * 1024, f"{grown - base} bytes retained over 9k steps"


def test_default_checks_are_fresh_instances():
    a, b = default_checks(), default_checks()
    assert [type(c) for c in a] == [type(c) for c in b]
    assert all(x is not y for x, y in zip(a, b))


@pytest.mark.parametrize("bad", [{"loss": "abc"}])
def test_a_non_numeric_metric_is_an_internal_error_not_a_crash(make_guard, bad):
    seen: list[Finding] = []
    guard = make_guard(run=RUN, on_finding=seen.append, events=None)
    guard.on_step_metrics(0, bad)
    assert {f.code for f in seen} == {Code.GUARD_INTERNAL_ERROR}


# ---------------------------------------------------------------- decisions mean what they say


def test_a_skip_after_the_update_is_recorded_as_not_done(make_guard, tmp_path):
    guard = make_guard(run=RUN)
    d = guard.on_step_metrics(0, {**HEALTHY, "loss": math.nan}, before_update=True)
    assert d.action is Action.SKIP_BATCH and d.intended is None
    guard.close()
    logged = [e for e in read_events(tmp_path / "events.jsonl") if e["kind"] == "decision"]
    assert [(e["action"], e["intended"]) for e in logged] == [("skip_batch", None)]


def test_a_nan_loss_after_the_update_halts_since_the_weights_took_it(make_guard, tmp_path):
    """Before the optimizer a NaN loss skips its update; after it, that update has reached the
    weights (a NaN gradient through AdamW makes every weight NaN), so the guard fails closed:
    a halt that says the skip could not be done and which checkpoint to resume from. It used
    to alert only, and the run trained on."""
    guard = make_guard(run=RUN)
    d = guard.on_step_metrics(0, {**HEALTHY, "loss": math.nan})
    assert d.action is Action.HALT and d.intended is Action.SKIP_BATCH
    assert "already taken" in d.message and "checkpoint before this step" in d.message
    guard.close()
    logged = [e for e in read_events(tmp_path / "events.jsonl") if e["kind"] == "decision"]
    assert [(e["action"], e["intended"]) for e in logged] == [("halt", "skip_batch")]
    warmup = make_guard(run=RUN)  # a NaN entropy is a warning, not the loss: it only alerts
    d = warmup.on_step_metrics(0, {**HEALTHY, "student_entropy": math.nan})
    assert d.action is Action.ALERT


def test_a_rewake_without_a_teacher_is_never_recorded_as_one(make_guard, tmp_path):
    guard = make_guard(run=RUN)
    uniform = torch.full((16, 8), -LN_QWEN3_V)
    for step in range(3):
        guard.on_teacher_scores(step, topk_logprobs=uniform)
    guard.close()
    logged = [e for e in read_events(tmp_path / "events.jsonl") if e["kind"] == "decision"]
    assert [e["action"] for e in logged] == ["skip_batch", "skip_batch", "halt"]
    assert all(e["intended"] in ("rewake", None) for e in logged)
    assert guard.repairs == 0


def test_a_loss_at_the_ceiling_with_a_healthy_teacher_blames_the_student(make_guard):
    """A learning rate far too high: the teacher's scores of each step are checked and healthy,
    the loss sits at ln 2. Not the teacher's fault, and no skipping forever."""
    seen: list[Finding] = []
    guard = make_guard(run=RUN, on_finding=seen.append)
    healthy_scores = torch.log_softmax(3 * torch.randn(32, 100), dim=-1).topk(8).values
    actions = []
    for step in range(6):
        guard.on_teacher_scores(step, topk_logprobs=healthy_scores)
        actions.append(guard.on_step_metrics(step, COLLAPSED, before_update=True).action)
    assert actions[:3] == [Action.SKIP_BATCH, Action.SKIP_BATCH, Action.HALT]
    assert set(guard.summary.count) == {Code.STUDENT_DIVERGED}
    assert guard.halt.codes == (Code.STUDENT_DIVERGED,)
    assert "learning rate" in seen[0].message and "uniform" not in seen[0].message


def test_a_loss_at_the_ceiling_with_a_uniform_teacher_blames_the_teacher(make_guard):
    guard = make_guard(run=RUN)
    seen: list[Finding] = []
    guard.on_finding = seen.append
    guard.on_teacher_scores(0, topk_logprobs=torch.full((16, 8), -LN_QWEN3_V))
    guard.on_step_metrics(0, COLLAPSED, before_update=True)
    ceiling = next(f for f in seen if f.code == Code.LOSS_JSD_CEILING)
    assert "flagged too: it is the teacher" in ceiling.message
    assert ceiling.values["teacher_healthy"] is False


def test_an_unconfirmed_open_incident_closes_after_its_horizon(make_guard):
    """A JSD at its ceiling once, nothing to act on: the incident is open, and a student whose
    entropy drifts up long after it (a healthy drift) is not read as its confirmation."""
    from distill_guard.findings import Code
    from distill_guard.policy import Policy

    guard = make_guard(policy=Policy(open_incident_steps=20))
    guard.on_step_metrics(0, {"loss": 0.69, "student_entropy": 0.40})
    assert guard.open_incident == 0
    for step in range(1, 22):
        guard.on_step_metrics(step, {"loss": 0.02, "student_entropy": 0.40})
    assert guard.open_incident is None
    for step in range(22, 30):  # +25 %: would confirm an open incident (follow-up bound 10 %)
        d = guard.on_step_metrics(step, {"loss": 0.02, "student_entropy": 0.50})
    assert Code.STUDENT_FOLLOWS_DEAD_TEACHER not in guard.summary.count and not guard.halted, d
    kinds = [e["kind"] for e in read_events(guard.events.path)]
    assert "incident_open" in kinds and "incident_closed" in kinds


def test_a_teacher_flagged_from_the_step_metrics_is_the_evidence_of_the_checks_after_it():
    """Issue 28: the teacher logprob column at −ln V fires teacher.uniform; the ceiling finding
    of the same step must not say the guard saw no teacher evidence."""
    found: list[Finding] = []
    guard = DistillGuard(run=RUN, on_finding=found.append, stop_on_halt=False)
    guard.on_step_metrics(0, {**COLLAPSED, "teacher_logprob": -LN_QWEN3_V})
    by_code = {f.code: f for f in found}
    assert Code.TEACHER_UNIFORM in by_code and Code.LOSS_JSD_CEILING in by_code
    ceiling = by_code[Code.LOSS_JSD_CEILING]
    assert "saw no teacher scores" not in ceiling.message
    assert "flagged too: it is the teacher" in ceiling.message
    assert ceiling.values["teacher_healthy"] is False


def test_step_metrics_without_teacher_evidence_still_say_so():
    found: list[Finding] = []
    guard = DistillGuard(run=RUN, on_finding=found.append, stop_on_halt=False)
    guard.on_step_metrics(0, {k: v for k, v in COLLAPSED.items() if k != "teacher_logprob"})
    (ceiling,) = [f for f in found if f.code == Code.LOSS_JSD_CEILING]
    assert "saw no teacher scores" in ceiling.message and ceiling.values["teacher_healthy"] is None
