"""The event log under a full disk, a killed writer and concurrent writers, in real processes."""

from __future__ import annotations

import logging
import os
import signal
import sys
import time

import pytest

from distill_guard.events import EventLog, read_events

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX limits and signals")


class Writer:
    """``target(*args)`` in a process of its own, forked from the session's fork server (which
    imported the package: no 2 s import per writer), stdout and stderr to files."""

    def __init__(self, forkserver, tmp_path, name, target, *args):
        self.out, self.err = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
        self.proc = forkserver.Process(
            target=_redirected, args=(str(self.out), str(self.err), target, args)
        )
        self.proc.start()

    def communicate(self, timeout):
        """Wait for the exit; ``(stdout, stderr)``."""
        self.proc.join(timeout)
        if self.proc.exitcode is None:
            self.proc.kill()
            self.proc.join()
            raise TimeoutError(f"writer still running after {timeout} s")
        return self.out.read_text(), self.err.read_text()

    @property
    def returncode(self):
        return self.proc.exitcode


def _redirected(out: str, err: str, target, args) -> None:
    for path, fd in ((out, 1), (err, 2)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    try:
        target(*args)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def _fill_a_small_disk(path: str, limit: int) -> None:
    import resource

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    log = EventLog(path)
    for step in range(200):
        log.write("finding", step=step, note="x" * 150)
    log.close()
    print(log.lost)


def _write_until_killed(path: str) -> None:
    log = EventLog(path)
    for step in range(10**7):
        log.write("finding", step=step, note="y" * 500)


def _write_alongside(path: str, name: str) -> None:
    log = EventLog(path)
    for step in range(200):
        log.write("finding", writer=name, step=step, note=name * 20_000)
    log.close()


def test_a_full_disk_keeps_every_complete_event_and_reports_the_loss(tmp_path, forkserver):
    path = tmp_path / "events.jsonl"
    limit = 10_000  # bytes: RLIMIT_FSIZE stands in for a full disk (EFBIG like ENOSPC)
    writer = Writer(forkserver, tmp_path, "writer", _fill_a_small_disk, str(path), limit)
    out, err = writer.communicate(timeout=60)
    assert writer.returncode == 0, err  # nothing raised into the "trainer"
    events = read_events(path)  # a torn last line is left out, the rest is read
    assert 0 < len(events) < 200
    assert [e["step"] for e in events] == list(range(len(events)))
    assert len(events) + int(out) == 200  # every event is either on disk or counted as lost
    assert f"{int(out)} event(s) not written" in err
    assert "File too large" in err  # the first write error is named


def test_a_writer_killed_mid_run_leaves_every_complete_event_readable(tmp_path, forkserver):
    path = tmp_path / "events.jsonl"
    writer = Writer(forkserver, tmp_path, "writer", _write_until_killed, str(path))
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if path.exists() and path.stat().st_size > 200_000:
                break
            time.sleep(0.02)
    finally:
        writer.proc.kill()  # SIGKILL
        writer.proc.join(timeout=30)
    assert writer.returncode == -signal.SIGKILL
    events = read_events(path)
    assert len(events) > 100
    assert [e["step"] for e in events] == list(range(len(events)))


def test_concurrent_writers_never_interleave_within_a_line(tmp_path, forkserver):
    path = tmp_path / "events.jsonl"
    writers = [
        Writer(forkserver, tmp_path, name, _write_alongside, str(path), name) for name in "ab"
    ]
    for w in writers:
        _, err = w.communicate(timeout=120)
        assert w.returncode == 0, err
    events = read_events(path)  # raises on any line two writers mixed
    seen = sorted((e["writer"], e["step"]) for e in events)
    assert seen == sorted((name, s) for name in ("a", "b") for s in range(200))
    assert all(e["note"] == e["writer"] * 20_000 for e in events)


def test_an_event_that_cannot_be_encoded_is_counted_and_the_log_goes_on(tmp_path, caplog):
    path = tmp_path / "events.jsonl"
    log = EventLog(path)
    with caplog.at_level(logging.ERROR, logger="distill_guard"):
        log.write("finding", step=0)
        log.write("finding", step=1, payload={1, 2})  # a set: not JSON
        log.write("finding", step=2)
        log.close()
    assert [e["step"] for e in read_events(path)] == [0, 2]
    assert log.lost == 1
    assert "event 'finding' not written" in caplog.text
    assert "1 event(s) not written" in caplog.text


def test_after_a_write_error_the_log_goes_on_and_records_what_it_lost(tmp_path):
    """A disk that fills, then frees (the chaos soak's full disk): the events in between are
    counted, and the first event that goes through is preceded by an ``events_lost`` record."""
    path = tmp_path / "events.jsonl"
    log = EventLog(path)
    log.write("finding", step=0)
    good = log._fd
    log._fd = os.open(os.devnull, os.O_RDONLY)  # the next writes fail with EBADF
    log.write("finding", step=1)
    log.write("finding", step=2)
    assert log.lost == 2
    os.close(log._fd)
    log._fd = good
    log.write("finding", step=3)
    log.close()
    events = read_events(path)
    assert [e["kind"] for e in events] == ["finding", "events_lost", "finding"]
    assert [e.get("step") for e in events] == [0, None, 3]
    assert events[1]["count"] == 2 and events[1]["torn"] is False and events[1]["error"]


def test_a_torn_line_left_by_a_write_error_is_ended_and_read_past(tmp_path, caplog):
    """A write that fails half-way leaves a torn line; the recovery record's line break ends it,
    and the reader leaves the torn event out with a warning and reads on."""
    path = tmp_path / "events.jsonl"
    log = EventLog(path)
    log.write("finding", step=0)
    with open(path, "ab") as f:
        f.write(b'{"time": 1, "kind": "fin')  # as a half-written event leaves it
    log._error, log._lost_now, log._torn = "File too large", 1, True
    log.write("finding", step=2)
    log.close()
    events = read_events(path)
    assert [e["kind"] for e in events] == ["finding", "events_lost", "finding"]
    assert "torn event left out" in caplog.text
