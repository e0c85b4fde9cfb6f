"""EventLog: one JSON line per event, flushed at once, never raising into the trainer."""

from __future__ import annotations

import json
import logging
import math

import numpy as np
import torch

from distill_guard.events import EventLog, read_events
from distill_guard.findings import Code, Finding, Severity, _jsonable


def test_each_event_is_one_flushed_json_line(tmp_path):
    path = tmp_path / "sub" / "dir" / "events.jsonl"  # parents are created
    log = EventLog(path, rank=2)
    log.write("finding", step=1, code="x", values={"a": 1.5})
    assert path.read_text().count("\n") == 1  # on disk before close
    log.write("decision", step=1, action="halt")
    lines = path.read_text().splitlines()
    assert [json.loads(line)["kind"] for line in lines] == ["finding", "decision"]
    assert all(json.loads(line)["rank"] == 2 for line in lines)
    log.close()
    log.close()  # idempotent
    assert read_events(path) == [json.loads(line) for line in lines]


def test_write_after_close_appends(tmp_path):
    path = tmp_path / "e.jsonl"
    log = EventLog(path)
    log.write("a")
    log.close()
    log.write("b")
    log.close()
    assert [e["kind"] for e in read_events(path)] == ["a", "b"]


def test_nonfinite_and_tensor_values_become_valid_json(tmp_path):
    path = tmp_path / "e.jsonl"
    log = EventLog(path)
    log.write(
        "finding",
        values={
            "nan": math.nan,
            "inf": math.inf,
            "tensor": torch.tensor(2.5),
            "np": np.float32(0.25),
            "nested": [math.nan, {"k": -math.inf}],
        },
    )
    log.close()
    line = path.read_text().strip()
    event = json.loads(line, parse_constant=lambda t: (_ for _ in ()).throw(AssertionError(t)))
    v = event["values"]
    assert v["nan"] == "nan" and v["inf"] == "inf" and v["nested"] == ["nan", {"k": "-inf"}]
    assert v["tensor"] == 2.5 and v["np"] == 0.25


def test_no_path_is_a_no_op(tmp_path):
    log = EventLog(None)
    log.write("finding", step=0)
    log.close()
    assert list(tmp_path.iterdir()) == []


def test_unwritable_path_disables_the_log_without_raising(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    log = EventLog(blocker / "events.jsonl")
    with caplog.at_level(logging.ERROR, logger="distill_guard"):
        log.write("finding", step=0)
        log.write("finding", step=1)
    assert caplog.text.count("event log") == 1  # said once
    log.close()


def test_finding_dict_round_trip():
    f = Finding(Code.TEACHER_UNIFORM, Severity.CRITICAL, "uniform at 11.93", 4, {"x": 1.0})
    d = json.loads(json.dumps(f.to_dict()))
    assert d == {
        "step": 4,
        "code": "teacher.uniform",
        "severity": "critical",
        "message": "uniform at 11.93",
        "values": {"x": 1.0},
    }
    assert Finding.from_dict(d) == f
    assert _jsonable((1, math.nan)) == [1, "nan"]


HEALTHY = {"loss": 0.02, "student_entropy": 0.41, "truncated_ratio": 0.04, "teacher_logprob": -0.35}


def _short_healthy_run(guard, steps=5):
    for step in range(steps):
        guard.on_teacher_scores(step, token_logprobs=-torch.rand(64))
        guard.on_step_metrics(step, HEALTHY)
    guard.close()


def test_a_clean_run_leaves_the_attach_record_and_the_closing_summary(tmp_path):
    from distill_guard import __version__
    from distill_guard.config import build_guard

    path = tmp_path / "events.jsonl"
    guard = build_guard(
        "strict",
        [
            f"events_path={path}",
            "run.vocab_size=1000",
            "checks.jsd_ceiling.fraction_of_ceiling=0.9",
            "alerts.use_wandb=false",
        ],
    )
    _short_healthy_run(guard)
    guard.close()  # a second close writes nothing more
    attached, closed = read_events(path)  # attached, nothing found, closed: no other event
    assert attached["kind"] == "attached" and closed["kind"] == "closed"
    assert attached["version"] == __version__ and attached["preset"] == "strict"
    assert attached["rank"] == 0 and attached["teacher"] is None
    assert attached["teacher_reference"] is None  # no reference from outside the run
    assert attached["run"]["vocab_size"] == 1000 and attached["run"]["loss"] == "jsd"
    assert attached["checks"]["jsd_ceiling"]["fraction_of_ceiling"] == 0.9  # the bounds in force
    assert set(attached["checks"]) == {c.name for c in guard.checks}
    assert attached["policy"] == {
        "monitor_only": False,
        "critical_action": guard.policy.critical_action.value,
        "halt_after_critical_steps": guard.policy.halt_after_critical_steps,
        "warn_patience": guard.policy.warn_patience,
        "warn_escalation": guard.policy.warn_escalation.value,
        "open_incident_steps": guard.policy.open_incident_steps,
    }
    assert attached["canary"]["length"] == guard.canary_spec.length
    assert attached["alert_sinks"] == []  # no wandb, no webhook variable: only the logger
    assert closed["summary"] == guard.summary.state_dict()
    assert closed["summary"]["count"] == {} and closed["summary"]["halt"] is None
    assert closed["repairs"] == 0


def test_each_rank_records_its_own_attachment(tmp_path, quiet_alerter):
    from distill_guard import DistillGuard

    guard = DistillGuard(events=tmp_path / "events.jsonl", alerter=quiet_alerter)
    guard.set_rank(3)  # as an integration does once the process group is up
    _short_healthy_run(guard, steps=1)
    (attached, closed) = read_events(tmp_path / "events.rank3.jsonl")
    assert (attached["kind"], attached["rank"], attached["preset"]) == ("attached", 3, None)
    assert closed["kind"] == "closed"


def test_a_halted_run_closes_with_the_halt_in_its_summary(tmp_path, quiet_alerter):
    from distill_guard import DistillGuard, RunSpec
    from distill_guard.policy import Action, Policy

    path = tmp_path / "events.jsonl"
    guard = DistillGuard(
        policy=Policy(critical_action=Action.HALT),
        run=RunSpec(vocab_size=1000),
        events=path,
        alerter=quiet_alerter,
    )
    guard.on_teacher_scores(0, topk_logprobs=torch.full((4, 4), -math.log(1000)))
    assert guard.halted
    guard.close()
    kinds = [e["kind"] for e in read_events(path)]
    assert kinds[0] == "attached" and kinds[-2:] == ["halt", "closed"]
    assert read_events(path)[-1]["summary"]["halt"]["codes"] == ["teacher.uniform"]


def test_a_pickled_event_log_writes_to_the_same_file(tmp_path):
    """Lightning's ddp_spawn pickles its callbacks, the guard's event log with them."""
    import pickle

    path = tmp_path / "events.jsonl"
    log = EventLog(path)
    log.write("first")
    copy = pickle.loads(pickle.dumps(log))
    copy.write("second")
    log.write("third")
    copy.close()
    log.close()
    assert [e["kind"] for e in read_events(path)] == ["first", "second", "third"]
