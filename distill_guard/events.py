"""Append-only JSONL event log: one line per finding, decision, repair and alert, framed by an
``attached`` record (the guard's configuration) and a ``closed`` record (the run's summary)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distill_guard.errors import GuardValueError
from distill_guard.findings import _jsonable
from distill_guard.redaction import redact

if TYPE_CHECKING:
    pass

log = logging.getLogger("distill_guard")


class EventLog:
    """Writes each event as one JSON line, in one ``write`` to a file opened for appending, so a
    crash loses nothing and several writers never interleave within a line.

    Never raises into the trainer. An event that cannot be encoded is left out. After a write
    error (a full disk, a file-size limit) each later event is tried again; the first one that
    goes through is preceded by an ``events_lost`` record (how many were lost, the error, and
    whether a torn line was left, which the record's own line break ends, so
    :func:`read_events` reads on past it). ``lost`` counts what was not written and ``close``
    reports it. Thread-safe: an alert sink reports its failures from its own thread. Every line
    is redacted of the secrets the guard knows (:mod:`distill_guard.redaction`).
    """

    def __init__(self, path: str | os.PathLike[str] | None, *, rank: int = 0) -> None:
        self.path = Path(path) if path is not None else None
        self.rank = rank
        self.lost = 0
        self._fd: int | None = None
        self._error: str | None = None
        """The write error of the episode now on (None: the last write went through)."""
        self._first_error: str | None = None
        self._lost_now = 0
        self._torn = False
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        """A copy sent to another process (Lightning's ``ddp_spawn`` pickles its callbacks)
        opens the file anew on its first write; the descriptor and the lock stay here."""
        return {k: v for k, v in self.__dict__.items() if k not in ("_fd", "_lock")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _fd=None, _lock=threading.Lock())

    def set_rank(self, rank: int) -> None:
        """Tag events with ``rank``. Ranks above 0 write next to rank 0's file, as
        ``<stem>.rank<r><suffix>``; a file already open stays where it is."""
        self.rank = rank
        if rank > 0 and self.path is not None and self._fd is None:
            self.path = self.path.with_name(f"{self.path.stem}.rank{rank}{self.path.suffix}")

    def write(self, kind: str, **payload: Any) -> None:
        if self.path is None:
            return
        with self._lock:
            self._write(kind, payload)

    def _write(self, kind: str, payload: dict[str, Any]) -> None:
        record = {"time": round(time.time(), 3), "rank": self.rank, "kind": kind, **payload}
        try:
            line = self._line(record)
        except (TypeError, ValueError) as exc:
            self.lost += 1
            log.error("distill_guard: event %r not written to %s: %s", kind, self.path, exc)
            return
        if self._error is not None:  # after a failed write: say what was lost, then this one
            lost = {"time": record["time"], "rank": self.rank, "kind": "events_lost"}
            lost |= {"count": self._lost_now, "error": self._error, "torn": self._torn}
            line = (b"\n" if self._torn else b"") + self._line(lost) + line
        written = 0
        try:
            if self._fd is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            view = memoryview(line)
            while view:
                n = os.write(self._fd, view)
                written += n
                view = view[n:]
        except OSError as exc:
            self.lost += 1
            self._lost_now += 1
            self._torn = self._torn or written > 0
            if self._error is None:
                log.error(
                    "distill_guard: event log %s: write error (%s); events are counted as lost "
                    "and each later one is tried again",
                    self.path,
                    exc,
                )
            self._error = str(exc)
            self._first_error = self._first_error or self._error
            return
        if self._error is not None:
            log.warning(
                "distill_guard: event log %s writes again; %d event(s) lost meanwhile (%s)",
                self.path,
                self._lost_now,
                self._error,
            )
            self._error, self._lost_now, self._torn = None, 0, False

    @staticmethod
    def _line(record: dict[str, Any]) -> bytes:
        return (redact(json.dumps(_jsonable(record), allow_nan=False)) + "\n").encode()

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None
        if self.lost:
            log.error(
                "distill_guard: %d event(s) not written to %s%s",
                self.lost,
                self.path,
                f" (first write error: {self._first_error})" if self._first_error else "",
            )


def attach_record(
    *,
    preset: str | None,
    checks: Sequence[Any],
    policy: Any,
    run: Any,
    canary: Any,
    sinks: Sequence[Mapping[str, Any]],
    rank: int,
    teacher: str | None,
    teacher_reference: str | None = None,
) -> dict[str, Any]:
    """The payload of the ``attached`` event: enough to tell, from the file alone, that a guard
    watched this run and with which bounds. ``sinks`` are the alert sinks as they describe
    themselves (never a secret). ``teacher_reference``: where the teacher's reference from outside
    the run came from (None: the canary trusts the teacher's first fingerprint)."""
    from distill_guard._version import __version__

    return {
        "version": __version__,
        "preset": preset,
        "rank": rank,
        "teacher": teacher,
        "teacher_reference": teacher_reference,
        "run": _config(run),
        "policy": _config(policy),
        "checks": {getattr(c, "name", type(c).__name__): _config(c) for c in checks},
        "canary": _config(canary),
        "alert_sinks": list(sinks),
    }


def _config(obj: Any) -> Any:
    """A dataclass's configuration (its ``init`` fields), JSON-ready."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _config(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}
    if isinstance(obj, Enum):
        return obj.value
    if isinstance(obj, (list, tuple)):
        return [_config(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): _config(v) for k, v in obj.items()}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    return repr(obj)


def read_events(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All events of a log file, in order. A torn last line (the writer was killed, or the disk
    filled, mid-write) is left out with a warning; every complete event is still read. So is a
    torn line that the writer's ``events_lost`` record ends. Any other bad line is an error
    naming the file and line."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        lines = [(i, line) for i, line in enumerate(fh, start=1) if line.strip()]
    events = []
    for n, (i, line) in enumerate(lines):
        try:
            events.append(json.loads(line))
        except ValueError as exc:
            if n == len(lines) - 1:
                log.warning("distill_guard: %s:%d: torn last event left out (%s)", path, i, exc)
                break
            if _ends_a_tear(lines[n + 1][1]):
                log.warning("distill_guard: %s:%d: torn event left out (%s)", path, i, exc)
                continue
            raise GuardValueError(f"{path}:{i}: not a JSON event ({exc})") from None
    return events


def _ends_a_tear(line: str) -> bool:
    """The writer's record after a torn line: a write error left it, and the log went on."""
    try:
        record = json.loads(line)
    except ValueError:
        return False
    return isinstance(record, dict) and record.get("kind") == "events_lost" and record.get("torn")
