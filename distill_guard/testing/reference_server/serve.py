"""Serving the reference server on loopback: in a background thread (tests) or the foreground."""

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from distill_guard.errors import GuardRuntimeError
from distill_guard.extras import needed
from distill_guard.testing.reference_server.app import create_app
from distill_guard.testing.reference_server.engine import ReferenceServer

if TYPE_CHECKING:
    from fastapi import FastAPI


class ServerThread:
    """A uvicorn server on 127.0.0.1 in a background thread, for tests and benchmarks."""

    def __init__(
        self, app: "FastAPI", *, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"
    ) -> None:
        with needed("the reference teacher server", "server"):
            import uvicorn

        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # accepted sockets inherit TCP_NODELAY: without it every small answer waits ~40 ms for
        # a delayed ACK (Nagle), which would swamp every latency this server is used to measure
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock.bind((host, port))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        config = uvicorn.Config(app, log_level=log_level, lifespan="off", access_log=False)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    def start(self, timeout_s: float = 10.0) -> "ServerThread":
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise GuardRuntimeError(f"reference server did not start on {self.url}")
            time.sleep(0.01)
        return self

    def run_forever(self) -> None:
        """Serve in the calling thread until interrupted."""
        self._server.run(sockets=[self._sock])

    def die(self) -> None:
        """Stop accepting and serving at once, as a process that was killed (the request being
        answered may still get its error)."""
        self._server.should_exit = True
        self._server.force_exit = True

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        with contextlib.suppress(OSError):
            self._sock.close()

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def serve_in_thread(server: ReferenceServer) -> Iterator[str]:
    """Serve ``server`` on a free 127.0.0.1 port for the duration of the block; yields its URL.

    Where SGLang's process would die, the thread stops serving: later connections are refused.
    """
    with ServerThread(create_app(server)) as thread:
        server.on_fatal = thread.die
        yield thread.url


def serve(server: ReferenceServer, *, host: str = "127.0.0.1", port: int = 30000) -> None:
    """Serve in the foreground until interrupted (``distill-guard serve-reference``); the
    process exits with status 1 where SGLang's would die."""
    thread = ServerThread(create_app(server), host=host, port=port, log_level="info")
    server.on_fatal = lambda: threading.Timer(0.05, os._exit, args=(1,)).start()
    thread.run_forever()
