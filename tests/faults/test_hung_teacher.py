"""A teacher that accepts connections and never answers: the guard's repair waits once, not once
per attempt, and says the teacher did not answer (a real listening socket on 127.0.0.1)."""

from __future__ import annotations

import socket
import time

import pytest

from distill_guard.checks import CanaryCheck
from distill_guard.findings import Code
from distill_guard.live.canary import Canary
from distill_guard.live.repair import repair_teacher
from distill_guard.teachers import SGLangHTTPTeacher


@pytest.fixture
def silent_url():
    """The kernel completes the handshake from the backlog; nothing ever reads or answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.mark.parametrize("asleep", [True, False], ids=["tracked_asleep", "tracked_awake"])
def test_a_hung_teacher_ends_the_repair_after_one_wait(silent_url, asleep):
    teacher = SGLangHTTPTeacher(silent_url, timeout_s=0.4, admin_timeout_s=0.4, max_retries=0)
    if asleep:
        teacher.sleep_state.mark_released(None)
    events: list[str] = []
    t0 = time.monotonic()
    outcome = repair_teacher(
        teacher,
        Canary(CanaryCheck()),
        max_attempts=3,
        backoff_s=0.5,
        on_event=lambda kind, payload: events.append(kind),
    )
    elapsed = time.monotonic() - t0
    assert not outcome.ok
    assert outcome.attempts == 1
    assert events.count("repair.attempt") == 1
    failed = outcome.findings[0]
    assert failed.code == Code.TEACHER_REPAIR_FAILED
    assert "did not answer" in failed.message
    assert elapsed < 3.0  # one timeout (a 3-attempt repair would also sleep 0.5 + 1.0 s)
    teacher.close()
