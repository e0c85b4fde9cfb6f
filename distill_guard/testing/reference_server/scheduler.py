"""The reference server's request lifecycle: SGLang's tokenizer-manager gate and its scheduler's
queues, as one small model (``docs/sglang-contract.md`` §7.2).

A ``/generate`` is HELD while a pause is on (the tokenizer manager's ``is_pause_cond``) or while
a reload waits for the requests in flight (its writer lock), then WAITING in the scheduler's
queue until a slot is free, then RUNNING for ``latency_s``, then does its one forward and is
answered. SGLang's scheduler is one thread: a control request (release, flush, reload, pause) is
handled between two forwards, never during one. Here that thread is :attr:`Scheduler.loop`,
one condition variable that every forward and every control action holds.
"""

from __future__ import annotations

import contextlib
import enum
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from distill_guard.teachers.sglang_versions import IdleCheck
from distill_guard.testing.reference_server.errors import SchedulerDead

UNLIMITED = 1 << 30


class Phase(enum.Enum):
    """Where a ``/generate`` is."""

    HELD = "held in the tokenizer manager: invisible to every idle check"
    WAITING = "in the scheduler's waiting queue"
    RUNNING = "in the running batch"
    DONE = "answered, or aborted"


class Ending(enum.Enum):
    """How a ``/generate`` ended (``docs/sglang-contract.md`` §7.2, the wheels' Q3)."""

    FINISHED = "finished"
    ABORTED_RUNNING = "aborted while running: one more forward, then FINISH_ABORT"
    ABORTED_WAITING = "aborted in the waiting queue: no forward"


class PauseMode(enum.Enum):
    """``/pause_generation``'s ``mode`` (SGLang 0.5.6+ ``PauseGenerationReqInput``)."""

    ABORT = "abort"
    IN_PLACE = "in_place"
    RETRACT = "retract"


@dataclass(eq=False)
class Request:
    """One ``/generate`` in the model."""

    phase: Phase = Phase.HELD
    ending: Ending = Ending.FINISHED
    left_s: float = 0.0
    """Running time still to do."""
    since: float | None = None
    """When it last started to make progress; None while frozen (or not running)."""
    mark: Any = None
    """What the caller tells of the request (the engine: what its prefill asks)."""


class Scheduler:
    """The queues and flags of SGLang's tokenizer manager and scheduler, under one lock."""

    def __init__(self, *, latency_s: float = 0.0, max_running_requests: int = UNLIMITED) -> None:
        self.loop = threading.Condition(threading.RLock())
        """SGLang's scheduler thread: held by every forward and every control action."""
        self.latency_s = latency_s
        self.max_running_requests = max_running_requests
        self.requests: list[Request] = []
        """Unanswered requests, in queue order (a retracted request goes to the back)."""
        self.hold = False
        """The tokenizer manager's ``is_pause``: new requests are held until continue."""
        self.engine_paused = False
        """The scheduler's ``_engine_paused`` (an ``in_place`` or ``retract`` pause)."""
        self.writers = 0
        """Reloads waiting for the requests in flight; new ones are held behind them."""
        self.dead: str | None = None
        self.batch: list[Any] = []
        """While a forward runs: the marks of the other requests running with it (its batch)."""
        self.stalled = False
        """Tests only (no SGLang state): running requests make no progress until
        :meth:`let_run`, so a control call is certain to find them running however slowly the
        machine answers it."""

    # -- counts, under the lock ---------------------------------------------------------------

    def count(self, phase: Phase) -> int:
        return sum(r.phase is phase for r in self.requests)

    def in_flight(self) -> int:
        """Requests the scheduler has (running or waiting); held ones are not counted."""
        return self.count(Phase.RUNNING) + self.count(Phase.WAITING)

    def refusal(self, check: IdleCheck) -> str | None:
        """Why ``check`` fails now, or None if it passes (the table's IdleCheck values)."""
        running, waiting = self.count(Phase.RUNNING), self.count(Phase.WAITING)
        if check is IdleCheck.NOTHING:
            return None
        if running:
            return f"{running} request(s) running"
        if waiting and _counts_waiting(check, paused=self.engine_paused):
            return f"{waiting} request(s) waiting"
        return None

    def wait_idle(self, timeout_s: float | None) -> bool:
        """Wait (lock held or not) until nothing runs or waits; False at the deadline."""
        with self.loop:
            ok = self.loop.wait_for(
                lambda: self.dead is not None or self.in_flight() == 0, timeout=timeout_s
            )
            self.check_alive()
            return ok

    def set_max_running(self, n: int) -> None:
        """Change how many requests may run at once (tests: 0 keeps every request waiting)."""
        with self.loop:
            self.max_running_requests = n
            self.loop.notify_all()

    def stall(self) -> None:
        """Tests only: stop the running requests' clocks until :meth:`let_run` (requests that
        start running meanwhile start stopped)."""
        with self.loop:
            self.stalled = True
            self._stop_clocks()

    def let_run(self) -> None:
        """Tests only: end :meth:`stall`; each running request goes on with the latency it had
        left (an ``in_place`` pause still freezes them until continue)."""
        with self.loop:
            self.stalled = False
            if not self.engine_paused:
                self._start_clocks()
            self.loop.notify_all()

    def check_alive(self) -> None:
        if self.dead is not None:
            raise SchedulerDead(self.dead)

    def kill(self, reason: str) -> None:
        """The scheduler thread died: everything waiting on it gets :class:`SchedulerDead`."""
        with self.loop:
            self.dead = reason
            self.loop.notify_all()

    # -- a /generate ----------------------------------------------------------------------------

    def run(self, forward: Callable[[], Any], mark: Any = None) -> tuple[Ending, Any]:
        """Take one request through HELD, WAITING and RUNNING, then call ``forward`` (under the
        lock, as the scheduler's one thread) unless it was aborted in the waiting queue. While
        ``forward`` runs, :attr:`batch` holds the marks of the requests running beside it: the
        ones SGLang would have put in the same batch."""
        req = Request(mark=mark)
        with self.loop:
            self.check_alive()
            self.requests.append(req)
            try:
                while not self._advance(req):
                    if req.ending is Ending.ABORTED_WAITING:
                        return req.ending, None
                    self.loop.wait(self._wait_s(req))
                self.batch = [
                    r.mark for r in self.requests if r is not req and r.phase is Phase.RUNNING
                ]
                return req.ending, forward()
            finally:
                req.phase = Phase.DONE
                self.requests.remove(req)
                self.loop.notify_all()

    def _advance(self, req: Request) -> bool:
        """Move ``req`` on as far as it can go now; True once its forward is due."""
        self.check_alive()
        if req.phase is Phase.HELD and not (self.hold or self.writers):
            req.phase = Phase.WAITING
        if req.phase is Phase.WAITING and self._may_start(req):
            req.phase, req.left_s = Phase.RUNNING, self.latency_s
            req.since = None if self.stalled else time.monotonic()
        return req.phase is Phase.RUNNING and self._wait_s(req) == 0.0

    def _may_start(self, req: Request) -> bool:
        """A waiting request starts when the engine is not paused and a slot is free for it."""
        if self.engine_paused:
            return False
        free = self.max_running_requests - self.count(Phase.RUNNING)
        waiting = [r for r in self.requests if r.phase is Phase.WAITING]
        return waiting.index(req) < free

    @staticmethod
    def _wait_s(req: Request) -> float | None:
        if req.phase is not Phase.RUNNING or req.since is None:
            return None
        return max(0.0, req.left_s - (time.monotonic() - req.since))

    # -- pause and continue ---------------------------------------------------------------------

    def pause(self, mode: PauseMode) -> None:
        """Hold new requests and apply ``mode`` to those the scheduler has, at once."""
        with self.loop:
            self.check_alive()
            self.hold = True
            {
                PauseMode.ABORT: self._abort_all,
                PauseMode.IN_PLACE: self._freeze,
                PauseMode.RETRACT: self._retract,
            }[mode]()
            self.loop.notify_all()

    def _abort_all(self) -> None:
        """``abort_request(abort_all=True)``: waiting requests are answered at once; running
        ones get ``to_finish``: they finish their latency and run one more forward."""
        for r in self.requests:
            if r.phase is Phase.WAITING:
                r.phase, r.ending = Phase.DONE, Ending.ABORTED_WAITING
            elif r.phase is Phase.RUNNING:
                r.ending = Ending.ABORTED_RUNNING

    def _freeze(self) -> None:
        """``in_place``: running requests keep their place and make no progress."""
        self.engine_paused = True
        self._stop_clocks()

    def _stop_clocks(self) -> None:
        now = time.monotonic()
        for r in self.requests:
            if r.phase is Phase.RUNNING and r.since is not None:
                r.left_s, r.since = max(0.0, r.left_s - (now - r.since)), None

    def _start_clocks(self) -> None:
        now = time.monotonic()
        for r in self.requests:
            if r.phase is Phase.RUNNING and r.since is None:
                r.since = now

    def _retract(self) -> None:
        """``retract_all``: running requests go back to the end of the waiting queue; they
        start again from scratch after continue."""
        self.engine_paused = True
        retracted = [r for r in self.requests if r.phase is Phase.RUNNING]
        for r in retracted:
            r.phase, r.since = Phase.WAITING, None
            self.requests.remove(r)
            self.requests.append(r)

    def resume_generation(self) -> None:
        """``/continue_generation``: held, frozen and retracted requests go on (a no-op when
        nothing is paused)."""
        with self.loop:
            self.check_alive()
            self.hold = self.engine_paused = False
            if not self.stalled:
                self._start_clocks()
            self.loop.notify_all()

    # -- reload -----------------------------------------------------------------------------------

    @contextlib.contextmanager
    def writer(self) -> Iterator[None]:
        """The tokenizer manager's ``model_update_lock.writer_lock``: new requests are held,
        the block runs once the ones in flight are answered."""
        with self.loop:
            self.writers += 1
            try:
                self.wait_idle(None)
                yield
            finally:
                self.writers -= 1
                self.loop.notify_all()


def _counts_waiting(check: IdleCheck, *, paused: bool) -> bool:
    """Whether ``check`` fails on waiting requests (``FULLY_IDLE_UNLESS_PAUSED``: only while
    the engine is not paused, 0.5.21+ ``ignore_waiting=_engine_paused``)."""
    if check is IdleCheck.FULLY_IDLE_UNLESS_PAUSED:
        return not paused
    return check in (IdleCheck.NO_REQUEST_WITH_WAITING, IdleCheck.FULLY_IDLE_WITH_WAITING)
