"""The webhook sink against a real receiver on loopback: Slack's payload, one throttle with the
other sinks, rank 0 only, and never fatal (receiver down, answering 500, hanging); one total
deadline per request, also for a receiver that drips its answer (``tests/_drip.py``)."""

from __future__ import annotations

import json
import logging
import math
import pickle
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from distill_guard.alerts import WEBHOOK_ENV, Alerter, WebhookSink
from distill_guard.config import build_guard
from distill_guard.events import read_events
from distill_guard.policy import Action
from tests._drip import DripServer

V = 1000
SECRET = "/services/T000/B000/s3cr3t-t0k3n"


class Receiver:
    """A Slack-style incoming webhook: records each JSON body; ``mode`` is ok, error or hang."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.paths: list[str] = []
        self.mode = "ok"
        self.delay_s = 0.0
        """How long each answer takes (a slow but healthy receiver)."""
        self.release = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                receiver.bodies.append(body)
                receiver.paths.append(self.path)
                if receiver.mode == "hang":
                    receiver.release.wait(30)
                    return
                if receiver.delay_s:
                    receiver.release.wait(receiver.delay_s)
                status = 200 if receiver.mode == "ok" else 500
                self.send_response(status)
                self.end_headers()
                self.wfile.write(b"ok" if status == 200 else b"internal_error")

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{SECRET}"
        # polled every 50 ms, not serve_forever's 0.5 s: stop() (shutdown) waits for one poll
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver(monkeypatch):
    r = Receiver()
    monkeypatch.setenv(WEBHOOK_ENV, r.url)
    yield r
    r.stop()


def guard(tmp_path, rank=0, *overrides):
    return build_guard(
        "default",
        [
            f"run.vocab_size={V}",
            f"events_path={tmp_path / 'events.jsonl'}",
            "alerts.use_wandb=false",
            "alerts.webhook_timeout_s=0.5",
            *overrides,
        ],
        rank=rank,
    )


def uniform():
    return torch.full((8, 4), -math.log(V))


def test_the_alert_arrives_as_slack_json_with_title_level_and_text(receiver, caplog):
    caplog.set_level(logging.DEBUG)  # httpx and httpcore too: none of them may log the secret
    a = Alerter(use_wandb=False, log_alerts=False, webhook_env=WEBHOOK_ENV)
    assert a.alert("distill_guard halt: teacher.uniform", "step 3: halt\nrow max < 1e-3 & more")
    a.close()
    assert "s3cr3t" not in caplog.text
    (body,) = receiver.bodies
    assert receiver.paths == [SECRET]
    # plain text for generic receivers and Slack's notification; blocks for Slack's view
    assert (
        body["text"]
        == "[WARN] distill_guard halt: teacher.uniform\nstep 3: halt\nrow max < 1e-3 & more"
    )
    header, section, context = body["blocks"]
    assert header["text"] == {"type": "plain_text", "text": "distill_guard halt: teacher.uniform"}
    assert section["text"]["text"] == "step 3: halt\nrow max &lt; 1e-3 &amp; more"
    assert "WARN" in context["elements"][0]["text"]


def test_a_guard_alerts_the_webhook_once_per_title_and_records_the_sink(tmp_path, receiver):
    g = guard(
        tmp_path, 0, "policy.critical_action=SKIP_BATCH", "policy.halt_after_critical_steps=99"
    )
    for step in range(5):  # the same fault at every step: one POST for the throttle window
        assert g.on_teacher_scores(step, topk_logprobs=uniform()).acts
    g.on_step_metrics(5, {"loss": 0.9})  # another title: its own POST
    g.close()
    assert [b["text"].splitlines()[0] for b in receiver.bodies] == [
        "[ERROR] distill_guard skip_batch: teacher.uniform",
        "[WARN] distill_guard: loss.above_ceiling",
    ]
    assert "step 0: skip_batch" in receiver.bodies[0]["text"]
    text = (tmp_path / "events.jsonl").read_text()
    assert "s3cr3t" not in text  # the attach record names the variable and host, not the URL
    (attached,) = [e for e in read_events(tmp_path / "events.jsonl") if e["kind"] == "attached"]
    assert attached["alert_sinks"] == [{"sink": "webhook", "env": WEBHOOK_ENV, "host": "127.0.0.1"}]
    kinds = [e["kind"] for e in read_events(tmp_path / "events.jsonl")]
    assert kinds.count("alert") == 6 and "alert_failed" not in kinds


def test_ranks_above_zero_send_nothing(tmp_path, receiver):
    g = guard(tmp_path, 1)
    g.on_teacher_scores(0, topk_logprobs=uniform())
    g.close()
    (sink,) = g.alerter.sinks
    assert receiver.bodies == [] and sink._thread is None  # not even a thread


@pytest.mark.parametrize("mode", ["down", "error", "hang"])
def test_a_broken_receiver_never_stalls_or_fails_the_run(
    tmp_path, receiver, mode, caplog, monkeypatch
):
    if mode == "down":
        with socket.socket() as s:  # a port nobody listens on
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        monkeypatch.setenv(WEBHOOK_ENV, f"http://127.0.0.1:{port}{SECRET}")
    receiver.mode = mode
    g = guard(tmp_path)
    caplog.set_level(logging.WARNING, logger="distill_guard")
    t0 = time.monotonic()
    for step in range(10):
        d = g.on_teacher_scores(step, topk_logprobs=uniform())
        g.on_step_metrics(step, {"loss": 0.9})
        assert d.action is Action.SKIP_BATCH or d.action is Action.HALT
    assert time.monotonic() - t0 < 5  # the hooks never waited on the receiver
    assert g.halted  # the run's own fate is the guard's, not the receiver's
    deadline = time.monotonic() + 5
    path = tmp_path / "events.jsonl"
    while time.monotonic() < deadline and "alert_failed" not in path.read_text():
        time.sleep(0.05)
    t0 = time.monotonic()
    g.close()
    assert time.monotonic() - t0 < 5
    failed = [e for e in read_events(path) if e["kind"] == "alert_failed"]
    assert failed and {e["sink"] for e in failed} == {"webhook"}
    expected = {"down": "ConnectError", "error": "HTTP 500", "hang": "did not answer within 0.5 s"}
    assert expected[mode] in failed[0]["error"]
    lines = [r for r in caplog.records if "not delivered" in r.getMessage()]
    assert len(lines) == len(failed) and all(r.exc_info is None for r in lines)
    assert "s3cr3t" not in caplog.text + path.read_text()


def test_without_the_variable_there_is_no_webhook_and_no_warning(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv(WEBHOOK_ENV, raising=False)
    caplog.set_level(logging.WARNING, logger="distill_guard")
    g = guard(tmp_path)
    assert g.alerter.sinks == []
    g.on_step_metrics(0, {"loss": 0.5})
    g.close()
    assert caplog.records == []


def test_a_url_that_is_not_http_is_refused_naming_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv(WEBHOOK_ENV, "hooks.slack.com/services/x")
    with pytest.raises(ValueError, match=rf"\${WEBHOOK_ENV} is not an http\(s\) URL"):
        guard(tmp_path)


def test_an_alerter_with_a_webhook_survives_pickling_to_another_process(receiver):
    """Lightning's ddp_spawn pickles the callbacks, the guard's alerter and sinks with them."""
    a = Alerter(use_wandb=False, log_alerts=False, webhook_env=WEBHOOK_ENV)
    a.alert("distill_guard: before", "sent from this process")  # its thread is running
    copy = pickle.loads(pickle.dumps(a))
    (sink,) = copy.sinks
    assert sink._thread is None and sink.host == "127.0.0.1"
    assert copy.alert("distill_guard: after", "sent from the copy")
    copy.close()
    a.close()
    assert sorted(b["text"].splitlines()[0] for b in receiver.bodies) == [
        "[WARN] distill_guard: after",
        "[WARN] distill_guard: before",
    ]


class Failures:
    """A ``failed`` callback that records each report with its time since ``t0``."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.reports: list[tuple[float, str]] = []
        self.first = threading.Event()

    def __call__(self, error: str) -> None:
        self.reports.append((time.monotonic() - self.t0, error))
        self.first.set()


@pytest.mark.parametrize("mode", ["body", "headers", "silent"])
def test_a_dripping_or_silent_receiver_is_reported_within_the_total_deadline(mode):
    """Fault injection: headers then a byte a second of body held ``timeout_s=2`` for 18 s before
    (httpx's timeout is per read); so did headers dripped a byte a second. Here a byte every
    0.5 s against ``timeout_s=1``: each read is inside the per-read limit, only a total deadline
    cuts it. ``silent`` accepts and never sends a header."""
    with DripServer(mode, every_s=0.5) as server:
        sink = WebhookSink(server.url + SECRET + "?token=q5ery", timeout_s=1)
        failed = Failures()
        sink.send("distill_guard: drip", "the receiver drips", "WARN", failed)
        assert failed.first.wait(1 + 1.5), f"no failure report within 2.5 s ({mode})"
        (elapsed, error), *_ = failed.reports
        assert 0.9 < elapsed < 1 + 1.5
        assert error == "127.0.0.1 did not answer within 1 s"
        assert "s3cr3t" not in error and "services" not in error and "q5ery" not in error
        t0 = time.monotonic()
        sink.close(2.0)
        assert time.monotonic() - t0 < 0.5  # the queue is empty: nothing to wait for
        assert len(server.requests) == 1


def test_close_returns_by_its_deadline_while_a_post_drips(caplog):
    """``close(1)`` with one POST in flight to a dripping receiver and two more queued: it
    returns at its deadline naming what was not delivered; the sender then sends and reports
    nothing more and ends once the request in flight reaches its own deadline."""
    caplog.set_level(logging.WARNING, logger="distill_guard")
    with DripServer("body", every_s=0.5) as server:
        sink = WebhookSink(server.url + SECRET, timeout_s=2)
        failed = Failures()
        for i in range(3):
            sink.send(f"distill_guard: drip {i}", "x", "ERROR", failed)
        thread = sink._thread
        time.sleep(0.2)  # the first POST is in flight
        t0 = time.monotonic()
        sink.close(1.0)
        assert time.monotonic() - t0 < 1.0 + 0.3
        (line,) = [r.getMessage() for r in caplog.records if "not all delivered" in r.getMessage()]
        assert "127.0.0.1" in line and "within 1.0 s" in line and "s3cr3t" not in line
        thread.join(2 + 1.0)
        assert not thread.is_alive()
        assert failed.reports == []  # after close's deadline its log line is the one report
        assert len(server.requests) == 1


def test_a_healthy_receiver_still_gets_every_alert_in_order(receiver):
    sink = WebhookSink(receiver.url, timeout_s=2)
    failed = Failures()
    for i in range(20):
        sink.send(f"distill_guard: alert {i}", f"body {i}", "INFO", failed)
    t0 = time.monotonic()
    sink.close(5.0)
    assert time.monotonic() - t0 < 5.0
    assert [b["text"].splitlines()[0] for b in receiver.bodies] == [
        f"[INFO] distill_guard: alert {i}" for i in range(20)
    ]
    assert failed.reports == []


def test_alerts_pending_at_close_are_delivered_to_a_slow_healthy_receiver(receiver, caplog):
    caplog.set_level(logging.WARNING, logger="distill_guard")
    receiver.delay_s = 0.2  # each answer takes 0.2 s: at close four of five still wait
    sink = WebhookSink(receiver.url, timeout_s=2)
    failed = Failures()
    for i in range(5):
        sink.send(f"distill_guard: pending {i}", "x", "WARN", failed)
    t0 = time.monotonic()
    sink.close(5.0)
    assert 0.8 < time.monotonic() - t0 < 5.0
    assert len(receiver.bodies) == 5 and failed.reports == []
    assert not [r for r in caplog.records if "not all delivered" in r.getMessage()]
    assert sink._thread is None


def test_a_healthy_raw_receiver_takes_each_alert():
    """The drip server's ``ok`` mode, so that the faulty modes above differ from a receiver the
    sink gets along with only in their timing."""
    with DripServer("ok") as server:
        sink = WebhookSink(server.url + SECRET, timeout_s=2)
        failed = Failures()
        sink.send("distill_guard: one", "x", "WARN", failed)
        sink.send("distill_guard: two", "x", "WARN", failed)
        sink.close(3.0)
        assert failed.reports == [] and len(server.requests) == 2
        assert all(r.startswith(f"POST {SECRET} ".encode()) for r in server.requests)
