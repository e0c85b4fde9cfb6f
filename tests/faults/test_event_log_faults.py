"""The event log under a full disk, a killed writer and concurrent writers, in real processes."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from distill_guard.events import EventLog, read_events

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX limits and signals")


def _python(code: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_full_disk_keeps_every_complete_event_and_reports_the_loss(tmp_path):
    path = tmp_path / "events.jsonl"
    limit = 10_000  # bytes: RLIMIT_FSIZE stands in for a full disk (EFBIG like ENOSPC)
    writer = _python(
        """
        import resource, signal, sys
        from distill_guard.events import EventLog
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), int(sys.argv[2])))
        log = EventLog(sys.argv[1])
        for step in range(200):
            log.write("finding", step=step, note="x" * 150)
        log.close()
        print(log.lost)
        """,
        str(path),
        str(limit),
    )
    out, err = writer.communicate(timeout=60)
    assert writer.returncode == 0, err  # nothing raised into the "trainer"
    events = read_events(path)  # a torn last line is left out, the rest is read
    assert 0 < len(events) < 200
    assert [e["step"] for e in events] == list(range(len(events)))
    assert len(events) + int(out) == 200  # every event is either on disk or counted as lost
    assert f"{int(out)} event(s) not written" in err
    assert "File too large" in err  # the first write error is named


def test_a_writer_killed_mid_run_leaves_every_complete_event_readable(tmp_path):
    path = tmp_path / "events.jsonl"
    writer = _python(
        """
        import sys
        from distill_guard.events import EventLog
        log = EventLog(sys.argv[1])
        for step in range(10**7):
            log.write("finding", step=step, note="y" * 500)
        """,
        str(path),
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if path.exists() and path.stat().st_size > 200_000:
                break
            time.sleep(0.02)
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=30)
    events = read_events(path)
    assert len(events) > 100
    assert [e["step"] for e in events] == list(range(len(events)))


def test_concurrent_writers_never_interleave_within_a_line(tmp_path):
    path = tmp_path / "events.jsonl"
    code = """
        import sys
        from distill_guard.events import EventLog
        log = EventLog(sys.argv[1])
        for step in range(200):
            log.write("finding", writer=sys.argv[2], step=step, note=sys.argv[2] * 20_000)
        log.close()
        """
    writers = [_python(code, str(path), name) for name in ("a", "b")]
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


def test_the_log_stops_after_a_write_error_so_a_torn_line_stays_last(tmp_path):
    path = tmp_path / "events.jsonl"
    log = EventLog(path)
    log.write("finding", step=0)
    os.close(log._fd)  # the next write fails with EBADF, as a vanished disk would
    log._fd = os.open(os.devnull, os.O_RDONLY)
    log.write("finding", step=1)
    log.write("finding", step=2)
    assert log.lost == 2
    log.close()
    assert [e["step"] for e in read_events(path)] == [0]
