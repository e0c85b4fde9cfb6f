"""The reference server's refusals, each answered by :mod:`.app` with SGLang's status and shape."""

from __future__ import annotations

from distill_guard.errors import GuardError

__all__ = ["Busy", "ContractError", "SchedulerDead", "SchedulerKilled"]


class ContractError(GuardError):
    """A request that breaks the API contract: 400 ``{"error": "<msg>"}`` as SGLang sends it."""


class SchedulerDead(GuardError):
    """The emulated scheduler is dead: 503 to everything."""


class SchedulerKilled(SchedulerDead):
    """This request killed the scheduler: the server process goes down (see ``on_fatal``)."""


class Busy(GuardError):
    """``/flush_cache`` while requests run: 400 plain text, as SGLang answers."""
