"""Serving the reference server on loopback: in a background thread (tests) or the foreground."""

import asyncio
import contextlib
import functools
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from distill_guard.errors import GuardRuntimeError
from distill_guard.extras import needed
from distill_guard.testing.reference_server.app import create_app
from distill_guard.testing.reference_server.engine import ReferenceServer

if TYPE_CHECKING:
    from fastapi import FastAPI


POLL_S = 0.01
"""How often the server looks for a stop, and for its connections closing as it stops."""


_UVICORN_HOOKS = ("on_tick", "main_loop", "shutdown", "run")
"""What :func:`_prompt_server` relies on in ``uvicorn.Server`` (read in uvicorn 0.55; ``make
test`` also passes on 0.29, the ``server`` extra's floor, which has all four)."""


@functools.cache
def _prompt_server() -> type:
    """``uvicorn.Server`` that stops within :data:`POLL_S`: uvicorn's own looks for
    ``should_exit`` every 0.1 s, then pauses 0.1 s after asking its connections to close and
    checks every 0.1 s that they did, so each stop took ~0.15 s (a test session starts hundreds
    of these servers). The same steps, polled every :data:`POLL_S`, each wait ending once
    what it waits for is done."""
    import uvicorn

    if not all(hasattr(uvicorn.Server, name) for name in _UVICORN_HOOKS):
        return uvicorn.Server  # another uvicorn's internals: its own stop, slower but sure

    class PromptServer(uvicorn.Server):
        async def main_loop(self) -> None:
            counter = 0
            should_exit = await self.on_tick(counter)
            while not should_exit:
                counter = (counter + 1) % 8_640_000
                await asyncio.sleep(POLL_S)
                should_exit = await self.on_tick(counter)

        async def shutdown(self, sockets: Any = None) -> None:
            for server in self.servers:  # stop accepting
                server.close()
            for sock in sockets or []:
                sock.close()
            for connection in list(self.server_state.connections):
                connection.shutdown()  # each closes once its answer is sent
            # a stop waits for every connection to close; a death (force_exit, die()) for as
            # long as uvicorn's own pause, so that the request being answered gets its error
            loop = asyncio.get_running_loop()
            grace = loop.time() + 0.1
            state = self.server_state
            while state.connections or state.tasks:
                if self.force_exit and loop.time() >= grace:
                    break
                await asyncio.sleep(POLL_S)
            for server in self.servers:
                await server.wait_closed()
            if not self.force_exit:
                await self.lifespan.shutdown()

    return PromptServer


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
        self._server = _prompt_server()(config)
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
