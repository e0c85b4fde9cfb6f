"""Relax's verdict channel without Ray: the file board, against the files a shared directory
really ends up holding (torn writes, an earlier run's verdicts, another live run, a path that is
not a directory). Every fault is a finding naming the file and the reason; the trainer follows
only its own run's verdict, and halts without one; nothing raises into it but :class:`GuardHalt`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from argparse import Namespace

import pytest

from distill_guard.events import EventLog
from distill_guard.integrations import relax
from distill_guard.integrations.relax.file_board import HOST, FileBoard, board_for
from distill_guard.integrations.relax.trainer import TrainerGate
from distill_guard.integrations.relax.verdicts import Announcement, StepVerdict, Verdict

from . import relax_harness as harness

HOOKS = harness.HOOKS


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.delenv("DISTILL_GUARD_RUN_ID", raising=False)
    monkeypatch.delenv("DISTILL_GUARD_VERDICT_CHANNEL", raising=False)
    relax.reset()
    yield
    relax.reset()


class Optimizer:
    def zero_grad(self):
        pass

    def step(self):
        return True, 1.0, 0


def args():
    return Namespace(
        opd_kl_type="jsd",
        opd_jsd_alpha=0.5,
        opd_token_selection="student_sampled",
        opd_log_prob_top_k=0,
        dynamic_sampling_filter_path=f"{HOOKS}.dynamic_sampling_filter",
        custom_rollout_log_function_path=f"{HOOKS}.rollout_log_function",
        custom_megatron_before_train_step_hook_path=f"{HOOKS}.before_train_step_hook",
    )


def rollout_side(events, **kw):
    """The rollout process's setup: it announces a new attempt on the board."""
    overrides = [
        f"run.vocab_size={harness.VOCAB}",
        f"events_path={events}",
        "alerts.use_wandb=false",
    ]
    return relax.use(relax.configure("default", overrides=overrides, args=args(), **kw))


def trainer(events, *, started_at=None, wait_s=1.0, saved=None, run=""):
    """A trainer rank reading the board of ``events`` (its process started at ``started_at``)."""
    board = board_for(events, run=run)
    if started_at is not None:
        board.started_at = started_at
    log = EventLog(events.with_name(f"trainer-{time.monotonic_ns()}.jsonl"))
    save = (lambda *a: saved.append(a[1])) if saved is not None else (lambda *a: None)
    return TrainerGate(board, log, save=save, wait_s=wait_s)


def findings(gate):
    rows = [json.loads(line) for line in gate.events.path.read_text().splitlines()]
    return [r for r in rows if r["kind"] == "finding"]


def post(gate, rollout_id, verdict=Verdict.TRAIN):
    """The rollout side completes a step with ``verdict``."""
    tally = gate.tally(rollout_id)
    tally.samples = 4
    if verdict is not Verdict.TRAIN:
        tally.raise_to(verdict, "test")
    gate.complete_step(rollout_id)


def test_a_torn_verdict_is_a_finding_and_the_step_waits_for_the_whole_one(tmp_path):
    events = tmp_path / "events.jsonl"
    side = rollout_side(events)
    path = side.board.path(0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"rollout_id": 0, "verdict": "tr')  # a write cut short
    t = trainer(events, wait_s=0.3, saved=[])
    with pytest.raises(relax.GuardHalt, match="not complete JSON") as halt:
        t.before_step(None, 0, None, Optimizer(), None)
    assert str(path) in str(halt.value)
    (f,) = findings(t)
    assert f["code"] == "relax.verdict_unusable" and f["values"]["where"] == str(path)
    # the whole verdict lands while the trainer waits: it trains on it
    path.write_text('{"rollout_id": 1, "verdict": "tr')
    later = threading.Timer(0.3, post, (side, 1))
    later.start()
    assert trainer(events, wait_s=5).before_step(None, 1, None, Optimizer(), None) is Verdict.TRAIN
    later.join()


def test_an_earlier_runs_verdicts_in_the_same_directory_are_never_followed(tmp_path):
    """The fault-injection run: rollout 1 trained on the old run's ``train``, rollout 2 halted
    on its ``halt``. Here the old files are there, and this run's own verdicts win."""
    events = tmp_path / "events.jsonl"
    old = board_for(events)
    old.announce(
        Announcement("", "old", ["filter"], "halt", True, time.time() - 3600, "old-node", 7)
    )
    for rollout_id, verdict in ((1, Verdict.TRAIN), (2, Verdict.HALT)):
        old.post(StepVerdict(rollout_id, verdict, samples=4, complete=True, attempt="old"))
    started = time.time()
    # this run's filter never loaded: the old announcement is stale, so the trainer halts
    t = trainer(events, started_at=started, wait_s=0.2, saved=[])
    with pytest.raises(relax.GuardHalt, match="stale"):
        t.before_step(None, 1, None, Optimizer(), None)
    assert findings(t)[0]["code"] == "relax.verdict_unusable"
    # this run's rollout side sets up, and posts skip for 1 and train for 2, a while later
    side = rollout_side(events)
    t = trainer(events, started_at=started, wait_s=5)
    later = threading.Timer(0.4, lambda: (post(side, 1, Verdict.SKIP), post(side, 2)))
    later.start()
    assert t.before_step(None, 1, None, Optimizer(), None) is Verdict.SKIP
    assert t.before_step(None, 2, None, Optimizer(), None) is Verdict.TRAIN
    later.join()
    assert findings(t) == []  # the setup cleared the earlier attempt's files: nothing to pass over
    # a verdict of another attempt that turns up in this run's directory is passed over
    path = side.board.path(3)
    path.write_text(json.dumps(StepVerdict(3, Verdict.TRAIN, complete=True, attempt="x").to_dict()))
    later = threading.Timer(0.4, post, (side, 3, Verdict.HALT))
    later.start()
    with pytest.raises(relax.GuardHalt, match="before training rollout 3"):
        t.before_step(None, 3, None, Optimizer(), None)
    later.join()
    (f,) = findings(t)
    assert f["severity"] == "warn" and "another run's" in f["message"] and str(path) in f["message"]


def test_a_second_live_run_on_the_same_board_is_refused_and_named_runs_do_not_meet(tmp_path):
    events = tmp_path / "events.jsonl"
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        board_for(events).announce(
            Announcement("", "theirs", ["filter"], "halt", True, time.time(), HOST, other.pid)
        )
        with pytest.raises(relax.GuardSetupError, match=f"another run \\(pid {other.pid}"):
            rollout_side(events)
    finally:
        other.kill()
        other.wait()
    rollout_side(events)  # its process is gone: the board is free again
    relax.reset()
    # two runs with their own names share the events path and never see each other
    os.environ["DISTILL_GUARD_RUN_ID"] = "a"
    a = rollout_side(events)
    os.environ["DISTILL_GUARD_RUN_ID"] = "b"
    b = rollout_side(events)
    post(a, 0, Verdict.HALT)
    post(b, 0)
    assert trainer(events, run="b").before_step(None, 0, None, Optimizer(), None) is Verdict.TRAIN
    with pytest.raises(relax.GuardHalt):
        trainer(events, run="a").before_step(None, 0, None, Optimizer(), None)


def test_a_board_path_that_is_not_a_directory_is_a_clear_refusal_and_a_clear_halt(tmp_path):
    events = tmp_path / "events.jsonl"
    (tmp_path / "events.verdicts").write_text("not a directory")
    with pytest.raises(relax.GuardSetupError, match="cannot write the verdict board"):
        rollout_side(events)
    t = trainer(events, wait_s=30, saved=[])
    begun = time.monotonic()
    with pytest.raises(relax.GuardHalt, match="no rollout-side gate"):
        t.before_step(None, 0, None, Optimizer(), None)
    assert time.monotonic() - begun < 5  # it will not become a directory: no long wait


def test_a_verdict_that_is_not_ours_is_named_for_what_is_wrong(tmp_path):
    board = FileBoard(tmp_path / "v")
    board.announce(Announcement("", "a1", ["filter"], "halt", True, time.time(), HOST, os.getpid()))
    path = board.path(3)
    for text, why in (
        ("[1, 2]", "a verdict is a JSON object"),
        (json.dumps({"rollout_id": 3, "verdict": "maybe"}), "field 'samples' is missing"),
        (
            json.dumps(StepVerdict(3, attempt="a1").to_dict() | {"verdict": "maybe"}),
            "field 'verdict' should be one of",
        ),
        (json.dumps(StepVerdict(4, attempt="a1").to_dict()), "verdict of rollout 4"),
    ):
        path.write_text(text)
        got = board.read(3)
        assert got.value is None and why in got.problem and got.where == str(path)
