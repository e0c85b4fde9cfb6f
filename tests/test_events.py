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
