"""One total deadline for an httpx request: the name lookup, the connect, the TLS handshake, the
sending and every read of the answer, its headers included.

httpx's ``timeout=`` bounds each socket operation, not the request: a server that sends a byte a
second, of its headers or of its body, holds a request made with ``timeout=2`` for as long as it
likes. :func:`bound` puts a network backend under a client's connection pools (its transport's
and its proxies') that gives each socket operation at most the time left before the deadline of
the enclosing :func:`deadline_at` block, and refuses one once the deadline has passed; httpx then
raises its own ``ConnectTimeout``, ``ReadTimeout`` or ``WriteTimeout``. Outside such a block the
client behaves as httpx's own.

A name is looked up in a daemon thread, so that a resolver that hangs costs the request no more
than its deadline; each of a name's addresses is tried with the time then left.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import threading
import time
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import httpcore

_DEADLINE: ContextVar[float | None] = ContextVar("distill_guard_http_deadline", default=None)
WRITE_PIECE = 64 * 1024
"""Bytes handed to one socket write: a receiver that drains its side slowly gets each piece with
the time left then, not the whole body with the time left at its start."""


@contextlib.contextmanager
def deadline_at(deadline: float) -> Iterator[float]:
    """Every request a :func:`bound` client makes in this block (in this thread) ends by
    ``deadline``, a ``time.monotonic()`` value; an enclosing block's earlier deadline holds."""
    outer = _DEADLINE.get()
    token = _DEADLINE.set(deadline if outer is None else min(outer, deadline))
    try:
        yield deadline
    finally:
        _DEADLINE.reset(token)


def bound(client: Any) -> Any:
    """``client`` (an ``httpx.Client``) with the deadline backend under each of its connection
    pools; a transport without one (``httpx.MockTransport``) is left as it is."""
    for transport in (client._transport, *client._mounts.values()):
        pool = getattr(transport, "_pool", None)
        backend = getattr(pool, "_network_backend", None)
        if backend is not None and not isinstance(backend, DeadlineBackend):
            pool._network_backend = DeadlineBackend(backend)
    return client


def is_bounded(client: Any) -> bool:
    """Whether every connection pool of ``client`` has the deadline backend."""
    pools = [getattr(t, "_pool", None) for t in (client._transport, *client._mounts.values())]
    backends = [getattr(p, "_network_backend", None) for p in pools if p is not None]
    return bool(backends) and all(isinstance(b, DeadlineBackend) for b in backends)


def _left(timeout: float | None, error: type[Exception]) -> float | None:
    """``timeout`` capped by the time left before the deadline; past it, ``error``."""
    deadline = _DEADLINE.get()
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise error("the request's total deadline passed")
    return left if timeout is None else min(timeout, left)


class _Stream:
    """A connection whose every operation ends by the deadline."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        view = memoryview(buffer)
        for start in range(0, len(view), WRITE_PIECE):
            piece = bytes(view[start : start + WRITE_PIECE])
            self._inner.write(piece, _left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> _Stream:
        left = _left(timeout, httpcore.ConnectTimeout)
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, left))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class DeadlineBackend:
    """httpcore's network backend (``inner``) with the deadline of :func:`deadline_at`."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> _Stream:
        if _DEADLINE.get() is None:
            return _Stream(
                self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
            )
        last: Exception | None = None
        for address in _resolve(host, port, _left(timeout, httpcore.ConnectTimeout)):
            left = _left(timeout, httpcore.ConnectTimeout)
            try:
                stream = self._inner.connect_tcp(address, port, left, local_address, socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                last = exc  # the next address, as socket.create_connection does
                continue
            return _Stream(stream)
        raise last or httpcore.ConnectError(f"{host} has no address")

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> _Stream:
        left = _left(timeout, httpcore.ConnectTimeout)
        return _Stream(self._inner.connect_unix_socket(path, left, socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def _resolve(host: str, port: int, wait: float | None) -> list[str]:
    """The addresses of ``host`` (itself if it is one), looked up within ``wait`` seconds."""
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(host.split("%", 1)[0])
        return [host]
    found: list[Any] = []

    def look_up() -> None:
        try:
            found.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except OSError as exc:
            found.append(exc)

    thread = threading.Thread(target=look_up, name="distill_guard-resolve", daemon=True)
    thread.start()
    thread.join(wait)
    if not found:
        raise httpcore.ConnectTimeout(f"{host} was not resolved within the deadline")
    if isinstance(found[0], Exception):
        raise httpcore.ConnectError(f"{host}: {found[0]}")
    return list(dict.fromkeys(info[4][0] for info in found[0]))
