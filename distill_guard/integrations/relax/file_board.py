"""The verdict channel for a setup without Ray: JSON files on a file system every rank shares.

Layout, next to the event file ``<stem>.jsonl``::

    <stem>.verdicts/<run>/announce.json       the rollout side's setup (gates, attempt, time, pid)
    <stem>.verdicts/<run>/rollout_<id>.json   one verdict per step

``<run>`` is the run's name (:func:`~.verdicts.run_name`), ``unnamed`` without one. Files are
written whole (a temporary file, then a rename). A trainer rank uses only an announcement made
after its own process started (an older one is an earlier run's) and only verdicts of the
announced attempt; anything else it finds is a problem it reports, never a verdict it follows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from distill_guard.integrations.relax.errors import GuardSetupError
from distill_guard.integrations.relax.verdicts import (
    Announcement,
    Reading,
    StepVerdict,
    VerdictUnreadable,
)

CLOCK_SLACK_S = 2.0
"""An announcement up to this long before the trainer process started still counts as this
run's (file times are rounded; the rollout side may set up while the trainer starts)."""


def board_for(events_path: str | os.PathLike[str], *, run: str = "") -> FileBoard:
    """The file board that belongs to an event file: ``<stem>.verdicts/<run>/`` beside it."""
    p = Path(events_path)
    return FileBoard(p.with_name(f"{p.stem}.verdicts"), run=run)


class FileBoard:
    """One run's verdicts in ``<directory>/<run>/``."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        run: str = "",
        started_at: float | None = None,
    ) -> None:
        self.root = Path(directory)
        self.run = run
        self.dir = self.root / (_safe(run) or "unnamed")
        self.where = str(self.dir)
        self.started_at = process_started_at() if started_at is None else started_at
        """When this process started: an announcement older than that is an earlier run's."""
        self.attempt: str | None = None
        """The attempt this side belongs to (the rollout side's own; the trainer's, once read)."""

    def path(self, rollout_id: int) -> Path:
        return self.dir / f"rollout_{int(rollout_id)}.json"

    # ---------------------------------------------------------------- rollout side

    def announce(self, announcement: Announcement) -> None:
        try:
            other = Announcement.from_dict(_read_json(self.dir / "announce.json"))
        except (OSError, ValueError):  # none, or unreadable: nothing to respect
            other = None
        if (
            other is not None
            and other.attempt != announcement.attempt
            and other.host == announcement.host
            and other.pid != announcement.pid
            and _alive(other.pid)
        ):
            raise GuardSetupError(
                f"another run (pid {other.pid}, set up at {_when(other.time)}) posts its verdicts "
                f"in {self.dir}: two runs on one board would follow each other's verdicts. Give "
                "each run its own DISTILL_GUARD_EVENTS, or its own DISTILL_GUARD_RUN_ID"
            )
        for old in self.dir.glob("rollout_*.json"):  # no live run owns them: an earlier attempt's
            with contextlib.suppress(OSError):
                old.unlink()
        try:
            _write_json(self.dir / "announce.json", announcement.to_dict())
        except OSError as exc:
            raise GuardSetupError(
                f"cannot write the verdict board {self.dir}: {exc}. The trainer ranks would find "
                "no verdict and halt; point DISTILL_GUARD_EVENTS at a writable directory that "
                "every rank shares"
            ) from None
        self.attempt = announcement.attempt

    def post(self, verdict: StepVerdict) -> None:
        _write_json(self.path(verdict.rollout_id), verdict.to_dict())

    # ---------------------------------------------------------------- trainer side

    def announcement(self) -> Reading:
        path = self.dir / "announce.json"
        found, failed = _load(path, Announcement.from_dict)
        if failed is not None:
            return failed
        if found.time < self.started_at - CLOCK_SLACK_S:
            return Reading(
                problem=(
                    f"stale: made at {_when(found.time)} by pid {found.pid}, before this trainer "
                    f"started ({_when(self.started_at)}): an earlier run's, not this one's"
                ),
                where=str(path),
            )
        if found.run != self.run:
            return Reading(
                problem=f"another run's: run {found.run!r}, this is run {self.run!r}",
                where=str(path),
            )
        self.attempt = found.attempt
        return Reading(found, where=str(path))

    def read(self, rollout_id: int) -> Reading:
        """The step's verdict as it is on disk now."""
        path = self.path(rollout_id)
        verdict, failed = _load(path, StepVerdict.from_dict)
        if failed is not None:
            return failed
        if verdict.rollout_id != rollout_id:
            return Reading(
                problem=f"it is the verdict of rollout {verdict.rollout_id}", where=str(path)
            )
        if verdict.run == self.run and verdict.attempt != self.attempt:
            self.announcement()  # the rollout side may have set up again (a restarted actor)
        if verdict.run != self.run or verdict.attempt != self.attempt:
            return Reading(
                problem=(
                    f"another run's: run {verdict.run or 'unnamed'!r} attempt "
                    f"{verdict.attempt!r}, this is run {self.run or 'unnamed'!r} attempt "
                    f"{self.attempt!r}"
                ),
                where=str(path),
            )
        return Reading(verdict, where=str(path))

    def wait(self, rollout_id: int, timeout_s: float, poll_s: float = 0.2) -> Reading:
        deadline = time.monotonic() + timeout_s
        problems: list[str] = []
        while True:
            seen = self.read(rollout_id)
            if seen.problem and seen.problem not in problems:
                problems.append(seen.problem)
            complete = seen.value is not None and seen.value.complete
            gone = seen.problem and self.root.exists() and not self.dir.is_dir()
            if complete or gone or time.monotonic() >= deadline:  # gone: a file, not a directory
                earlier = tuple(p for p in problems if p != seen.problem)
                return dataclasses.replace(seen, passed_over=earlier)
            time.sleep(poll_s)


def process_started_at() -> float:
    """This process's start, as a wall-clock time (Linux ``/proc``; elsewhere the time this
    module was imported, which is no later)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rpartition(")")[2].split()[19])
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return _IMPORTED_AT


_IMPORTED_AT = time.time()


def _safe(run: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", run)[:200]


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def _load(path: Path, parse: Callable[[Any], Any]) -> tuple[Any, Reading | None]:
    """``parse`` of the JSON at ``path``, or the :class:`Reading` that says why there is none
    (absent: no problem; torn, foreign or unreadable: the problem)."""
    try:
        return parse(_read_json(path)), None
    except FileNotFoundError:
        return None, Reading(where=str(path))
    except (OSError, ValueError) as exc:
        return None, Reading(problem=f"unreadable: {_why(exc)}", where=str(path))


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _why(exc: BaseException) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"not complete JSON ({exc.msg} at character {exc.pos}): a torn or foreign write"
    if isinstance(exc, VerdictUnreadable):
        return f"not a verdict of this package ({exc})"
    return f"{type(exc).__name__}: {exc}"


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


HOST = socket.gethostname()
