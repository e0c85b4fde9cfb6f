"""The verdict channel on the engine Relax already runs on: a named Ray actor of the run.

The rollout side creates ``distill_guard.verdicts.<run>`` in the ``distill_guard`` namespace
(no CPU reserved, so it fits beside Relax's placement groups) and posts each step there; every
trainer rank, on any node, finds it by name and waits on it. No file system is shared. The actor
is owned by the rollout process: it ends with the cluster session or with that process, so an
earlier run's verdicts cannot be read, and a restarted rollout process makes a new one (a new
attempt). The run's name is the Ray session and job unless ``DISTILL_GUARD_RUN_ID`` sets it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from distill_guard.extras import needed
from distill_guard.integrations.relax.errors import GuardSetupError
from distill_guard.integrations.relax.verdicts import (
    Announcement,
    Reading,
    StepVerdict,
    VerdictPostFailed,
    VerdictUnreadable,
)

NAMESPACE = "distill_guard"


class VerdictStore:
    """The actor's state: the announcement and each step's latest verdict, with waiters woken
    when a step is posted. Runs as a Ray async actor (its methods share one event loop)."""

    def __init__(self) -> None:
        self.announced: dict[str, Any] | None = None
        self.verdicts: dict[int, dict[str, Any]] = {}
        self._posted: asyncio.Condition | None = None

    def _cond(self) -> asyncio.Condition:
        if self._posted is None:
            self._posted = asyncio.Condition()
        return self._posted

    async def announce(self, data: dict[str, Any]) -> dict[str, Any] | None:
        """Record the announcement; returns the one it replaced."""
        before, self.announced = self.announced, data
        return before

    async def announcement(self) -> dict[str, Any] | None:
        return self.announced

    async def post(self, data: dict[str, Any]) -> None:
        async with self._cond():
            self.verdicts[int(data["rollout_id"])] = data
            self._cond().notify_all()

    async def wait(self, rollout_id: int, timeout_s: float) -> dict[str, Any] | None:
        """The step's verdict once complete, else the latest at ``timeout_s`` (or None)."""

        def ready() -> bool:
            seen = self.verdicts.get(rollout_id)
            return seen is not None and bool(seen.get("complete"))

        async with self._cond():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._cond().wait_for(ready), timeout=max(timeout_s, 0))
            return self.verdicts.get(rollout_id)


class RayBoard:
    """One run's verdicts in its named actor."""

    def __init__(self, run: str, *, find_timeout_s: float = 60.0) -> None:
        self.run = run
        self.name = f"distill_guard.verdicts.{run}"
        self.where = f"Ray actor {self.name!r} (namespace {NAMESPACE!r})"
        self.find_timeout_s = find_timeout_s
        """How long a trainer rank looks for the actor before it reports none."""
        self.attempt: str | None = None
        self._actor: Any = None

    # ---------------------------------------------------------------- rollout side

    def announce(self, announcement: Announcement) -> None:
        ray = _ray()
        try:
            self._actor = (
                ray.remote(num_cpus=0)(VerdictStore)
                .options(name=self.name, namespace=NAMESPACE, get_if_exists=True)
                .remote()
            )
            before = ray.get(self._actor.announce.remote(announcement.to_dict()), timeout=60)
        except Exception as exc:  # noqa: BLE001 - said as the reason the run is refused
            raise GuardSetupError(
                f"cannot create the verdict channel, {self.where}: {type(exc).__name__}: {exc}. "
                "The trainer ranks would find no verdict and halt; set "
                "DISTILL_GUARD_VERDICT_CHANNEL=file to use a shared directory instead"
            ) from None
        if before is not None and before.get("pid") != announcement.pid:
            self._actor.announce.remote(before)  # put the other run's back before refusing
            raise GuardSetupError(
                f"another rollout process (pid {before.get('pid')} on {before.get('host')}) "
                f"already posts verdicts on {self.where}: give each run its own "
                "DISTILL_GUARD_RUN_ID"
            )
        self.attempt = announcement.attempt

    def post(self, verdict: StepVerdict) -> None:
        if self._actor is None:
            raise VerdictPostFailed(f"{self.where}: the rollout side never announced itself on it")
        posted = self._actor.post.remote(verdict.to_dict())  # posts arrive in order
        if verdict.complete:  # the one the trainer waits for: make sure it landed
            try:
                _ray().get(posted, timeout=60)
            except Exception as exc:  # noqa: BLE001 - reported by the gate as a failed post
                raise VerdictPostFailed(f"{self.where}: {type(exc).__name__}: {exc}") from None

    # ---------------------------------------------------------------- trainer side

    def _find(self) -> tuple[Any, str]:
        ray = _ray()
        deadline = time.monotonic() + self.find_timeout_s
        while True:
            try:
                return ray.get_actor(self.name, namespace=NAMESPACE), ""
            except ValueError:
                if time.monotonic() >= deadline:
                    return None, ""
                time.sleep(0.2)
            except Exception as exc:  # noqa: BLE001 - Ray itself failed: say so
                return None, f"Ray could not look it up: {type(exc).__name__}: {exc}"

    def announcement(self) -> Reading:
        if self._actor is None:
            self._actor, problem = self._find()
            if self._actor is None:
                return Reading(problem=problem, where=self.where)
        try:
            found = Announcement.from_dict(
                _ray().get(self._actor.announcement.remote(), timeout=60)
            )
        except VerdictUnreadable as exc:
            return Reading(problem=f"unreadable: {exc}", where=self.where)
        except Exception as exc:  # noqa: BLE001 - the actor died or Ray failed
            self._actor = None
            return Reading(problem=f"{type(exc).__name__}: {exc}", where=self.where)
        self.attempt = found.attempt
        return Reading(found, where=self.where)

    def wait(self, rollout_id: int, timeout_s: float) -> Reading:
        if self._actor is None:
            got = self.announcement()
            if got.value is None:
                return got
        ray = _ray()
        try:
            data = ray.get(self._actor.wait.remote(rollout_id, timeout_s), timeout=timeout_s + 60)
        except Exception as exc:  # noqa: BLE001 - the actor died (its rollout process did)
            self._actor = None
            return Reading(
                problem=f"the channel failed ({type(exc).__name__}: {exc}); the rollout process "
                "that owns it may have died",
                where=self.where,
            )
        if data is None:
            return Reading(where=self.where)
        try:
            verdict = StepVerdict.from_dict(data)
        except VerdictUnreadable as exc:
            return Reading(problem=f"unreadable: {exc}", where=self.where)
        if verdict.attempt != self.attempt:
            self.announcement()  # a restarted rollout process announced a new attempt
        if verdict.run != self.run or verdict.attempt != self.attempt:
            return Reading(
                problem=(
                    f"another run's: run {verdict.run!r} attempt {verdict.attempt!r}, this is "
                    f"run {self.run!r} attempt {self.attempt!r}"
                ),
                where=self.where,
            )
        return Reading(verdict, where=self.where)


def _ray() -> Any:
    with needed("the Ray verdict channel of the Relax integration", "ray"):
        import ray
    return ray
