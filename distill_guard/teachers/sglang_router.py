"""The worker API of ``sglang-router`` (the SGLang Model Gateway, 0.3.2): list, take out, put back.

A teacher behind a router is several replicas; the guard checks each one at its own address and
uses the router only for who gets traffic. Every behaviour relied on here is a row of the router
table (``docs/sglang-contract.md`` §8), read from the router's source at its 0.3.2 release and
shown by a test per row against the real router (``tests/teachers/test_sglang_router.py``):

- ``GET /workers`` lists the workers: id (a UUID), the URL as registered, ``is_healthy``,
  ``disable_health_check``, priority, cost, model (R1).
- ``DELETE /workers/{id}`` answers 202 and queues the removal; once the worker is no longer
  listed, the router sends it no request (R3).
- ``POST /workers {"url": ...}`` answers 202 and queues the registration (one ``GET /health``,
  then its server and model info); the worker comes back under a new id, listed healthy (R4).

Talking to the router needs no ``sglang_router`` package (it is HTTP); running one does
(``pip install 'distill_guard[router]'``, :mod:`distill_guard.testing.router`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from distill_guard.teachers.base import TeacherError
from distill_guard.teachers.sglang_transport import SGLangTransport, answer_json

ROUTER_VERSION = "0.3.2"
"""The ``sglang-router`` release the router table was read from and tested against."""


class RouterError(TeacherError):
    """A router call did not do what the table says (a worker still listed after its removal,
    not back and healthy after its registration, an answer of another shape)."""


def same_url(a: str, b: str) -> bool:
    """Whether two worker addresses name one replica (the router lists a URL as registered)."""
    return a.rstrip("/") == b.rstrip("/")


@dataclass(frozen=True)
class RouterWorker:
    """One worker as ``GET /workers`` lists it (router table R1)."""

    id: str
    """The router's UUID for it; a worker put back after a removal gets a new one (R4)."""
    url: str
    """Its direct address, as registered."""
    healthy: bool
    """``is_healthy``: the router sends it requests (with its circuit breaker closed)."""
    health_check: bool = True
    """The router's health checker would ``GET /health`` it (``disable_health_check`` false):
    on SGLang that runs a forward, which kills a released replica (R5)."""
    model_id: str | None = None
    priority: int | None = None
    cost: float | None = None

    @classmethod
    def from_json(cls, entry: Any) -> RouterWorker:
        if not isinstance(entry, dict) or not entry.get("id") or not entry.get("url"):
            raise RouterError(f"GET /workers: a worker entry without id and url: {entry!r}")
        return cls(
            id=str(entry["id"]),
            url=str(entry["url"]).rstrip("/"),
            healthy=bool(entry.get("is_healthy", False)),
            health_check=not bool(entry.get("disable_health_check", False)),
            model_id=entry.get("model_id"),
            priority=entry.get("priority"),
            cost=entry.get("cost"),
        )

    def registration(self) -> dict[str, Any]:
        """The ``POST /workers`` body that puts it back as it was listed."""
        body: dict[str, Any] = {"url": self.url, "disable_health_check": not self.health_check}
        for key in ("model_id", "priority", "cost"):
            value = getattr(self, key)
            if value is not None:
                body[key] = value
        return body


class SGLangRouter(SGLangTransport):
    """The worker API of one ``sglang-router``, over HTTP.

    Args:
        url: the router's base URL.
        api_key_env: variable holding the router's ``--api-key`` (its worker routes take it
            as ``Authorization: Bearer``, R6); unset means none.
        timeout_s: limit of one call.
        settle_timeout_s: how long a removal or a registration, queued by the router, may take
            to show in ``GET /workers`` (measured: 10 ms and 25 ms on loopback).
    """

    def __init__(
        self,
        url: str,
        *,
        api_key_env: str | None = "SGLANG_ROUTER_API_KEY",
        timeout_s: float = 10.0,
        settle_timeout_s: float = 30.0,
        poll_s: float = 0.02,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(
            url,
            api_key_env=api_key_env,
            admin_api_key_env=None,
            timeout_s=timeout_s,
            admin_timeout_s=timeout_s,
            transport=transport,
        )
        self.settle_timeout_s = settle_timeout_s
        self.poll_s = poll_s

    def workers(self) -> list[RouterWorker]:
        """``GET /workers``: every registered worker (R1)."""
        body = answer_json(self._request("GET", "/workers", idempotent=True), "/workers")
        entries = body.get("workers") if isinstance(body, dict) else None
        if not isinstance(entries, list):
            raise RouterError(f"GET /workers: expected {{'workers': [...]}}, got {body!r:.200}")
        return [RouterWorker.from_json(e) for e in entries]

    def worker(self, url: str) -> RouterWorker | None:
        """The listed worker at ``url``, or None when the router does not list it."""
        return next((w for w in self.workers() if same_url(w.url, url)), None)

    def remove(self, url: str) -> RouterWorker | None:
        """Take the worker at ``url`` out: ``DELETE /workers/{id}``, then wait until it is no
        longer listed, after which the router sends it nothing (R3). Returns its entry as it
        was (to put it back as it was), or None when the router did not list it."""
        listed = self.worker(url)
        if listed is None:
            return None
        self._request("DELETE", f"/workers/{listed.id}", admin=True)
        self._settle(lambda: self.worker(url) is None, f"{url} still listed after its removal")
        return listed

    def add(self, url: str, like: RouterWorker | None = None) -> RouterWorker:
        """Put the worker at ``url`` back: ``POST /workers`` (with ``like``'s priority, cost,
        model and health-check setting), then wait until it is listed healthy (R4). The router
        registers it with one ``GET /health``, a forward on SGLang: only an awake replica."""
        body = like.registration() if like is not None else {"url": url.rstrip("/")}
        self._request("POST", "/workers", json=body, admin=True)
        found: list[RouterWorker] = []

        def back() -> bool:
            w = self.worker(url)
            found[:] = [w] if w is not None and w.healthy else []
            return bool(found)

        self._settle(back, f"{url} not listed healthy after its registration")
        return found[0]

    def _settle(self, done: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + self.settle_timeout_s
        while not done():
            if time.monotonic() >= deadline:
                raise RouterError(f"router {self.url}: {what} ({self.settle_timeout_s:g} s)")
            time.sleep(self.poll_s)
