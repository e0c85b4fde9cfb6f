"""Append-only JSONL event log: one line per finding, decision, repair and alert."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any, TextIO

from distill_guard.findings import _jsonable

log = logging.getLogger("distill_guard")


class EventLog:
    """Writes each event as one JSON line and flushes it at once, so a crash loses nothing.

    Never raises into the trainer: if the file cannot be written the log says so once and the
    guard carries on (its findings still reach the Python logger).
    """

    def __init__(self, path: str | os.PathLike[str] | None, *, rank: int = 0) -> None:
        self.path = Path(path) if path is not None else None
        self.rank = rank
        self._fh: TextIO | None = None
        self._broken = False

    def set_rank(self, rank: int) -> None:
        """Tag events with ``rank``. Ranks above 0 write next to rank 0's file, as
        ``<stem>.rank<r><suffix>`` (concurrent appends from several processes may interleave);
        a file already open stays where it is."""
        self.rank = rank
        if rank > 0 and self.path is not None and self._fh is None:
            self.path = self.path.with_name(f"{self.path.stem}.rank{rank}{self.path.suffix}")

    def write(self, kind: str, **payload: Any) -> None:
        if self.path is None or self._broken:
            return
        record = {"time": round(time.time(), 3), "rank": self.rank, "kind": kind, **payload}
        try:
            if self._fh is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fh = self.path.open("a", encoding="utf-8")
            self._fh.write(json.dumps(_jsonable(record), allow_nan=False) + "\n")
            self._fh.flush()
        except (OSError, TypeError, ValueError) as exc:
            self._broken = True
            log.error(
                "distill_guard: event log %s disabled after a write error: %s", self.path, exc
            )

    def close(self) -> None:
        if self._fh is not None:
            try:
                self._fh.flush()
                os.fsync(self._fh.fileno())
                self._fh.close()
            except OSError:
                pass
            self._fh = None


def read_events(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All events of a log file, in order. A torn last line (the writer was killed, or the disk
    filled, mid-write) is left out with a warning; every complete event is still read. A bad
    line before the last is an error naming the file and line."""
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
            raise ValueError(f"{path}:{i}: not a JSON event ({exc})") from None
    return events
