"""The rollout side's word on each step, for the trainer ranks that train it.

Relax's before-train-step hook gets no batch (``docs/relax.md`` §3): the trainer cannot see what
it is about to train on. The rollout side's gate judges every committed group before the step's
verdict is complete and posts it for ``rollout_id`` on a *verdict channel*; every trainer rank
reads it before its first update of that step. Two channels (:func:`verdict_channel` picks):

- :class:`~.ray_board.RayBoard`: a named Ray actor of the run, where the process runs under Ray
  (Relax always does): it reaches every node, shared file system or not;
- :class:`~.file_board.FileBoard`: one JSON file per step on a file system every rank shares,
  for a setup without Ray.

Each run is named (:func:`run_name`) and each rollout-side setup is an *attempt* of it (a new id
at every :func:`~.setup.configure`); every verdict carries both. A verdict that cannot be read,
that belongs to another run or attempt, or that never comes is a :class:`Reading` with the
problem stated: never an exception into the trainer, never another run's word.
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, Protocol

from distill_guard.errors import GuardError, GuardValueError
from distill_guard.integrations.relax.errors import GuardSetupError

CHANNELS = ("auto", "ray", "file")
"""``DISTILL_GUARD_VERDICT_CHANNEL``: ``auto`` (Ray where the process runs under Ray, else the
file board), ``ray`` or ``file``."""


class Verdict(str, Enum):
    """What the trainer does with a step. Ordered: train < skip < halt."""

    TRAIN = "train"
    """Every sample the trainer will read has verified teacher values (dead ones were masked)."""
    SKIP = "skip"
    """No sample of the step has usable teacher values: take no optimizer step on it."""
    HALT = "halt"
    """The guard stops the run before this step: checkpoint on every rank, then stop."""

    @property
    def rank(self) -> int:
        return list(Verdict).index(self)


class VerdictUnreadable(GuardValueError):
    """What was read is not a verdict of this package (the message says what is wrong)."""


class VerdictPostFailed(GuardError, OSError):
    """The rollout side could not post a verdict (reported by the gate, never raised into Relax;
    the trainer ranks then find none and halt)."""


@dataclass
class StepVerdict:
    """The rollout side's tally of one step, from the groups Relax committed to it."""

    rollout_id: int
    verdict: Verdict = Verdict.TRAIN
    samples: int = 0
    """Committed samples the gate judged."""
    dead: int = 0
    """Samples whose teacher values were dead (uniform, non-finite, or scored by a teacher that
    failed the step's canary) as scored."""
    masked: int = 0
    """Samples the gate kept out of every loss term."""
    rescored: int = 0
    """Dead samples re-scored by a repaired teacher and verified."""
    complete: bool = False
    """The rollout log hook ran: every committed group of the step has been judged."""
    reasons: list[str] = field(default_factory=list)
    """What the guard said (one line per decision that acted)."""
    run: str = ""
    """The run's name (:func:`run_name`); empty for an unnamed run on a file board."""
    attempt: str = ""
    """The rollout-side setup that posted it (a new id at every setup of the run)."""

    def raise_to(self, verdict: Verdict, reason: str) -> None:
        if verdict.rank > self.verdict.rank:
            self.verdict = verdict
        if reason and reason not in self.reasons:
            self.reasons.append(reason)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "verdict": self.verdict.value}

    @classmethod
    def from_dict(cls, data: Any) -> StepVerdict:
        """A verdict as posted; :class:`VerdictUnreadable` naming the field that is wrong."""
        if not isinstance(data, dict):
            raise VerdictUnreadable(f"a verdict is a JSON object, got {type(data).__name__}")
        kinds = {
            "rollout_id": int,
            "samples": int,
            "dead": int,
            "masked": int,
            "rescored": int,
            "complete": bool,
            "reasons": list,
            "run": str,
            "attempt": str,
        }
        for name, kind in kinds.items():
            value = data.get(name)
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise VerdictUnreadable(
                    f"field {name!r} should be {kind.__name__}, got {value!r}"
                    if name in data
                    else f"field {name!r} is missing"
                )
        try:
            verdict = Verdict(data.get("verdict"))
        except ValueError:
            raise VerdictUnreadable(
                f"field 'verdict' should be one of {[v.value for v in Verdict]}, "
                f"got {data.get('verdict')!r}"
            ) from None
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(
            **{k: v for k, v in data.items() if k in known and k != "verdict"}, verdict=verdict
        )


@dataclass(frozen=True)
class Reading:
    """What a trainer rank read from the channel: a verdict (or announcement), or why none."""

    value: Any = None
    """The :class:`StepVerdict` (or the announcement ``dict``); None when nothing usable came."""
    problem: str = ""
    """Why what was there could not be used (torn, another run's, unreadable); empty if fine."""
    where: str = ""
    """The file or channel it was read from."""
    passed_over: tuple[str, ...] = ()
    """Problems with what was there earlier, while waiting (each passed over, not followed)."""


@dataclass(frozen=True)
class Announcement:
    """What the rollout side says once at setup: which gates run, for which run and attempt."""

    run: str
    attempt: str
    gates: list[str]
    on_dead_teacher: str
    teacher: bool
    time: float
    host: str
    pid: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> Announcement:
        if not isinstance(data, dict):
            raise VerdictUnreadable(f"an announcement is a JSON object, got {type(data).__name__}")
        names = [f.name for f in dataclasses.fields(cls)]
        missing = [n for n in names if n not in data]
        if missing:
            raise VerdictUnreadable(f"the announcement lacks {', '.join(missing)}")
        try:
            return cls(
                run=str(data["run"]),
                attempt=str(data["attempt"]),
                gates=[str(g) for g in data["gates"]],
                on_dead_teacher=str(data["on_dead_teacher"]),
                teacher=bool(data["teacher"]),
                time=float(data["time"]),
                host=str(data["host"]),
                pid=int(data["pid"]),
            )
        except (TypeError, ValueError) as exc:
            raise VerdictUnreadable(f"the announcement is malformed: {exc}") from None


class VerdictChannel(Protocol):
    """Where the rollout side posts each step's verdict and the trainer ranks read it."""

    where: str
    """Said in every message about it (a directory, a Ray actor's name)."""

    def announce(self, announcement: Announcement) -> None:
        """Rollout side, once at setup. Raises :class:`~.setup.GuardSetupError` when another
        live run holds the channel."""

    def post(self, verdict: StepVerdict) -> None:
        """Rollout side: the step's tally, as it is now (``complete`` once the step is judged)."""

    def announcement(self) -> Reading:
        """Trainer side: this run's announcement (an :class:`Announcement`), or why none."""

    def wait(self, rollout_id: int, timeout_s: float) -> Reading:
        """Trainer side: the step's verdict once complete, else what was there at ``timeout_s``
        (an incomplete verdict, or None) with the problem."""


def run_name() -> str:
    """The run's name, the same in the rollout process and on every trainer rank:
    ``DISTILL_GUARD_RUN_ID`` where the launcher set it, else the Ray session and job where the
    process runs under Ray (every actor a driver starts shares them), else ``""``."""
    explicit = os.environ.get("DISTILL_GUARD_RUN_ID", "").strip()
    if explicit:
        return explicit
    ray = _ray_if_running()
    if ray is None:
        return ""
    ctx = ray.get_runtime_context()
    session = ctx.get_session_name() if hasattr(ctx, "get_session_name") else ""
    return f"{session}.{ctx.get_job_id()}" if session else f"job-{ctx.get_job_id()}"


def new_attempt() -> str:
    return uuid.uuid4().hex[:16]


def _ray_if_running() -> Any:
    """Ray, where it is installed and this process is connected to a cluster; else None."""
    try:
        import ray
    except ImportError:
        return None
    return ray if ray.is_initialized() else None


def verdict_channel(events_path: str | os.PathLike[str] | None, *, run: str | None = None) -> Any:
    """The channel both sides of one run agree on (``DISTILL_GUARD_VERDICT_CHANNEL``): the Ray
    board where the process runs under Ray, else the file board next to ``events_path``
    (``<stem>.verdicts/``). None when neither can be had (no Ray and no event file)."""
    choice = os.environ.get("DISTILL_GUARD_VERDICT_CHANNEL", "auto").strip().lower() or "auto"
    if choice not in CHANNELS:
        raise GuardSetupError(
            f"DISTILL_GUARD_VERDICT_CHANNEL must be one of {', '.join(CHANNELS)}, got {choice!r}"
        )
    name = run_name() if run is None else run
    if choice == "ray" or (choice == "auto" and _ray_if_running() is not None):
        from distill_guard.integrations.relax.ray_board import RayBoard

        return RayBoard(name)
    if events_path is None:
        return None
    from distill_guard.integrations.relax.file_board import board_for

    return board_for(events_path, run=name)
