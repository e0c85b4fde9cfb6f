"""The reference server's refusals, each answered by :mod:`.app` with SGLang's status and shape."""

from __future__ import annotations

from distill_guard.errors import GuardError

__all__ = ["BodyInvalid", "Busy", "ContractError", "SchedulerDead", "SchedulerKilled", "Unhealthy"]


class ContractError(GuardError):
    """A request that breaks the API contract: 400 ``{"error": "<msg>"}`` as SGLang sends it."""


class BodyInvalid(GuardError):
    """A body or query parameter FastAPI's validation refuses (a missing required body on
    0.5.6+'s ``/pause_generation``, a bad ``mode``, a negative ``?timeout=``): SGLang turns the
    422 into 400 ``{"object": "error", "message", "type": "Bad Request", "param", "code": 400}``
    (0.5.6 ``http_server.py:354-386``)."""


class SchedulerDead(GuardError):
    """The emulated scheduler is dead: 503 to everything."""


class SchedulerKilled(SchedulerDead):
    """This request killed the scheduler: the server process goes down (see ``on_fatal``)."""


class Busy(GuardError):
    """``/flush_cache`` refused (requests run or wait, or ``?timeout=`` ran out): 400 plain text,
    the message being the body SGLang sends."""


class Unhealthy(GuardError):
    """``/health`` got nothing from the scheduler within SGLang's 20 s: 503, no body."""
