"""Progress of long work (``probe`` cycles, long replays, ``benchmarks/``) on stderr: only to a
terminal and never under ``--json``, so a pipe, a log file or a JSON reader sees none of it."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


class Progress:
    """Lines of progress on ``stream`` (default: stderr), when ``enabled``.

    :meth:`for_command` enables it only for a terminal and without ``--json``. :meth:`say`
    writes a line; :meth:`count` rewrites one ``\\r`` line at most every ``interval_s`` (and at
    the last item), after ``delay_s`` (short work shows none), and :meth:`close` ends it.
    Disabled, every call does nothing."""

    def __init__(
        self,
        enabled: bool,
        stream: TextIO | None = None,
        interval_s: float = 0.5,
        delay_s: float = 0.0,
    ):
        self.enabled = enabled
        self._stream = stream
        self.interval_s = interval_s
        self.delay_s = delay_s
        """:meth:`count` stays silent for work shorter than this."""
        self._last = -float("inf")
        self._first: float | None = None
        self._open = False

    @classmethod
    def for_command(
        cls, json_output: bool = False, stream: Any = None, delay_s: float = 0.0
    ) -> Progress:
        """On for a terminal ``stream`` (default: stderr), off under ``--json``."""
        stream = stream if stream is not None else sys.stderr
        isatty = getattr(stream, "isatty", None)
        tty = bool(isatty()) if callable(isatty) else False
        return cls(enabled=tty and not json_output, stream=stream, delay_s=delay_s)

    @property
    def stream(self) -> TextIO:
        return self._stream if self._stream is not None else sys.stderr

    def say(self, text: str) -> None:
        if not self.enabled:
            return
        self._end_line()
        self.stream.write(text + "\n")
        self.stream.flush()

    def count(self, done: int, total: int | None, what: str) -> None:
        """``what: done of total`` (or ``what: done``), throttled to one write per interval."""
        if not self.enabled:
            return
        now = time.monotonic()
        if self._first is None:
            self._first = now
        if now - self._first < self.delay_s and not self._open:
            return  # short work: no progress at all
        if now - self._last < self.interval_s and done != total:
            return
        self._last = now
        text = f"{what}: {done} of {total}" if total else f"{what}: {done}"
        self.stream.write(f"\r{text}")
        self.stream.flush()
        self._open = True

    def close(self) -> None:
        """End an open :meth:`count` line."""
        if self.enabled:
            self._end_line()

    def _end_line(self) -> None:
        if self._open:
            self.stream.write("\n")
            self.stream.flush()
            self._open = False
