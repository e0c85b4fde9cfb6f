"""Alerts: logged (once per incident), sent to the sinks on rank 0 only, throttled per title,
never fatal. The webhook sink is tested against a real receiver in test_webhook.py."""

from __future__ import annotations

import logging
import time

import pytest

from distill_guard.alerts import MAX_TITLE, Alerter, alert_title
from distill_guard.alerts import wandb as wandb_sink


class FakeRun:
    """Records alerts like a wandb Run; optionally refuses them."""

    def __init__(self, exc: Exception | None = None) -> None:
        self.calls: list[dict] = []
        self.exc = exc

    def alert(self, **kwargs):
        self.calls.append(kwargs)
        if self.exc is not None:
            raise self.exc


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def no_global_wandb(monkeypatch):
    """Fail the test if the alerter looks up a global wandb run."""

    def forbidden():
        raise AssertionError("the alerter looked for a wandb run")

    monkeypatch.setattr(wandb_sink, "_active_run", forbidden)


def test_disabled_wandb_run_is_a_silent_no_op():
    wandb = pytest.importorskip("wandb")

    run = wandb.init(mode="disabled")
    try:
        assert wandb.run is run
        # handed to the no-op run without an exception, through wandb.run and explicitly
        assert Alerter(log_alerts=False).alert("distill_guard: t", "text", "ERROR") is True
        assert Alerter(run=run, log_alerts=False).alert("distill_guard: t2", "text") is True
    finally:
        wandb.finish()


def test_offline_wandb_run_writes_the_alert_into_its_own_file(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = wandb.init(mode="offline", dir=str(tmp_path), project="distill-guard-tests")
    try:
        assert wandb.run is run
        a = Alerter(log_alerts=False)
        assert a.describe() == [{"sink": "wandb", "run": "offline"}]
        assert a.alert("distill_guard: offline", "body-of-the-offline-alert", "WARN") is True
    finally:
        wandb.finish()
    # nothing is sent while the run lasts; the alert is a record of the run's .wandb file
    (record,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    deadline = time.monotonic() + 10  # wandb's service may still be writing after finish()
    while b"body-of-the-offline-alert" not in record.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert b"body-of-the-offline-alert" in record.read_bytes()
    assert b"distill_guard: offline" in record.read_bytes()


def test_no_active_run_sends_nothing(monkeypatch):
    monkeypatch.setattr(wandb_sink, "_active_run", lambda: None)
    assert Alerter(log_alerts=False).alert("t", "x") is False


def test_without_wandb_installed_there_is_no_wandb_sink(monkeypatch):
    monkeypatch.setattr(wandb_sink.importlib.util, "find_spec", lambda name: None)
    assert Alerter().sinks == [] and Alerter(log_alerts=False).alert("t", "x") is False


def test_a_run_handed_in_gets_the_alerts_without_wandb_installed(monkeypatch):
    # seen on a machine without wandb: the run the user passed was dropped with the sink
    monkeypatch.setattr(wandb_sink.importlib.util, "find_spec", lambda name: None)
    calls = []

    class Run:
        def alert(self, **kwargs):
            calls.append(kwargs)

    assert Alerter(run=Run(), log_alerts=False).alert("t", "x", "ERROR") is True
    assert [(c["title"], str(c["level"]).rsplit(".", 1)[-1]) for c in calls] == [("t", "ERROR")]


def test_a_raising_client_is_reported_not_raised():
    errors: list[tuple[str, str, str]] = []
    run = FakeRun(RuntimeError("You must call wandb.init() before wandb.alert()"))
    a = Alerter(run=run, on_error=lambda *e: errors.append(e), log_alerts=False)
    assert a.alert("distill_guard: boom", "text", "ERROR") is False
    assert len(run.calls) == 1
    assert errors == [
        (
            "wandb",
            "distill_guard: boom",
            "RuntimeError: You must call wandb.init() before wandb.alert()",
        )
    ]


def test_a_raising_client_without_on_error_is_still_not_raised(caplog):
    a = Alerter(run=FakeRun(ValueError("bad")), log_alerts=False)
    with caplog.at_level(logging.WARNING, logger="distill_guard"):
        assert a.alert("t", "x") is False
    (record,) = caplog.records
    assert record.getMessage() == "distill_guard: wandb alert 't' not delivered: ValueError: bad"
    assert record.exc_info is None  # one line, not a traceback


def test_throttle_per_title_with_an_injected_clock():
    clock, run = Clock(), FakeRun()
    a = Alerter(run=run, clock=clock, min_interval_s=600, log_alerts=False)
    assert a.alert("A", "1") is True
    clock.now += 10
    assert a.alert("A", "2") is False  # throttled
    assert a.alert("B", "3") is True  # another title is not
    clock.now += 589
    assert a.alert("A", "4") is False  # 599 s after the first
    clock.now += 1
    assert a.alert("A", "5") is True  # 600 s: due again
    assert [c["text"] for c in run.calls] == ["1", "3", "5"]
    assert all(c["wait_duration"] == 600 for c in run.calls)


def test_levels_map_to_wandb_alert_levels():
    wandb = pytest.importorskip("wandb")

    run = FakeRun()
    a = Alerter(run=run, min_interval_s=0, log_alerts=False)
    for level in ("INFO", "WARN", "ERROR"):
        a.alert(f"t-{level}", "x", level)
    assert [c["level"] for c in run.calls] == [
        wandb.AlertLevel.INFO,
        wandb.AlertLevel.WARN,
        wandb.AlertLevel.ERROR,
    ]
    with pytest.raises(ValueError, match="level"):
        a.alert("t", "x", "FATAL")


@pytest.mark.parametrize("rank", [1, 7])
def test_only_rank_zero_talks_to_wandb(rank, no_global_wandb, caplog):
    run = FakeRun()
    a = Alerter(rank=rank, run=run)
    with caplog.at_level(logging.WARNING, logger="distill_guard"):
        assert a.alert("distill_guard: x", "text", "ERROR") is False
    assert run.calls == []
    assert "distill_guard: x" in caplog.text  # still logged locally


def test_use_wandb_false_never_looks_for_a_run(no_global_wandb):
    assert Alerter(use_wandb=False, log_alerts=False).alert("t", "x") is False


def test_every_alert_is_logged_at_its_level(caplog):
    a = Alerter(use_wandb=False)
    with caplog.at_level(logging.INFO, logger="distill_guard"):
        a.alert("t1", "info text", "INFO")
        a.alert("t2", "warn text", "WARN")
        a.alert("t3", "error text", "ERROR")
    levels = {r.getMessage().split(":")[0]: r.levelno for r in caplog.records}
    assert levels == {"t1": logging.INFO, "t2": logging.WARNING, "t3": logging.ERROR}


def test_titles_fit_wandb_and_are_stable():
    long_code = "teacher." + "x" * 200
    t = alert_title(long_code, "rewake")
    assert len(t) <= MAX_TITLE == 63
    assert t == alert_title(long_code, "rewake")  # same fault, same title: throttling works
    assert alert_title("teacher.uniform") == "distill_guard: teacher.uniform"
    assert alert_title("teacher.uniform", "halt") == "distill_guard halt: teacher.uniform"
    run = FakeRun()
    Alerter(run=run, log_alerts=False).alert("y" * 100, "x")
    assert len(run.calls[0]["title"]) <= 63


def test_a_recurring_alert_is_logged_in_full_once_then_counted(caplog):
    clock = Clock()
    a = Alerter(use_wandb=False, clock=clock, min_interval_s=600)
    body = "step 0: alert: teacher.uniform\nmeasured -ln V on 100% of rows; bound 1%; reload it"
    with caplog.at_level(logging.INFO, logger="distill_guard"):
        for step in range(30):
            a.alert("distill_guard: teacher.uniform", body.replace("0", str(step), 1), "ERROR")
            clock.now += 10
        assert [r.getMessage() for r in caplog.records] == [
            f"distill_guard: teacher.uniform: {body}"
        ]
        clock.now += 600  # past the window: one short line with the count
        a.alert("distill_guard: teacher.uniform", "step 90: alert: teacher.uniform\nmore", "ERROR")
        a.alert("distill_guard: teacher.uniform", "step 91: alert: teacher.uniform\nmore", "ERROR")
        a.close()  # the repeat since the short line is counted at the end
    first, again, end = caplog.records
    assert again.levelno == logging.ERROR and again.getMessage() == (
        "distill_guard: teacher.uniform (again; 29 repeat(s) since the last line, all in the "
        "event file): step 90: alert: teacher.uniform"
    )
    assert end.levelno == logging.INFO and "repeated 1 more time(s)" in end.getMessage()


def test_a_title_back_after_a_quiet_window_is_logged_in_full_again(caplog):
    clock = Clock()
    a = Alerter(use_wandb=False, clock=clock, min_interval_s=60)
    with caplog.at_level(logging.WARNING, logger="distill_guard"):
        a.alert("t", "first\ndetail", "WARN")
        clock.now += 3600
        a.alert("t", "second\ndetail", "WARN")
    assert [r.getMessage() for r in caplog.records] == ["t: first\ndetail", "t: second\ndetail"]


def test_a_disabled_run_is_described_as_such():
    wandb = pytest.importorskip("wandb")

    wandb.init(mode="disabled")
    try:
        assert Alerter(log_alerts=False).describe() == [{"sink": "wandb", "run": "disabled"}]
    finally:
        wandb.finish()
    assert Alerter(use_wandb=False).describe() == []
