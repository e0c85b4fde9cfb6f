"""Progress on stderr: to a terminal only, never under --json, one throttled count line."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

from distill_guard.cli.progress import Progress

REPO = Path(__file__).resolve().parents[1]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_for_a_terminal_off_under_json_or_for_a_pipe() -> None:
    assert Progress.for_command(False, Terminal()).enabled
    assert not Progress.for_command(True, Terminal()).enabled
    assert not Progress.for_command(False, io.StringIO()).enabled
    assert not Progress.for_command(False, object()).enabled  # no isatty at all


def test_a_disabled_progress_writes_nothing() -> None:
    out = Terminal()
    p = Progress(False, out)
    p.say("x")
    p.count(1, 2, "steps")
    p.close()
    assert out.getvalue() == ""


def test_count_is_throttled_but_always_shows_the_last_item_and_say_ends_its_line() -> None:
    out = Terminal()
    p = Progress(True, out, interval_s=3600)
    for i in range(1, 101):
        p.count(i, 100, "replay")
    p.say("done")
    assert out.getvalue() == "\rreplay: 1 of 100\rreplay: 100 of 100\ndone\n"


def test_count_stays_silent_for_work_shorter_than_its_delay() -> None:
    out = Terminal()
    p = Progress(True, out, delay_s=3600)
    for i in range(1, 11):
        p.count(i, 10, "replay")
    p.close()
    assert out.getvalue() == ""


def _soak(stderr: int) -> subprocess.Popen:
    cmd = [sys.executable, str(REPO / "benchmarks" / "soak.py"), "--steps", "200", "--every", "100"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr, cwd=REPO)


def test_a_benchmark_shows_progress_on_a_terminal_and_none_to_a_pipe() -> None:
    """Issue 28: the benchmarks' long loops (here benchmarks/soak.py) show progress on a
    terminal (a pseudo-terminal here) and write none to a pipe or a file. The two runs go side
    by side (each is mostly its interpreter importing torch)."""
    leader, follower = os.openpty()
    try:
        piped = _soak(subprocess.PIPE)
        tty = _soak(follower)
        os.close(follower)
        seen = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the other end closed
                break
            if not chunk:
                break
            seen += chunk
        tty_out, _ = tty.communicate(timeout=120)
        _, piped_err = piped.communicate(timeout=120)
    finally:
        os.close(leader)
    assert piped.returncode == 0 and b"soak: step" not in piped_err
    assert tty.returncode == 0 and b"soak: step: 200 of 200" in seen
    assert b"soak: step" not in tty_out  # the results stay clean
