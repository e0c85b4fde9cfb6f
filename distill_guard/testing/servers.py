"""Helpers for tests and demos: reference servers in a thread or a child process, on loopback."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from distill_guard.errors import GuardRuntimeError
from distill_guard.teachers.torch_teacher import TorchTeacher
from distill_guard.testing.reference_server import ReferenceServer, serve_in_thread

_PACKAGE_ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def reference_teacher(
    model_dir: str | Path,
    *,
    version: str = "0.5.23",
    api_key: str | None = None,
    latency_s: float = 0.0,
    max_running_requests: int | None = None,
    **kw: Any,
) -> Iterator[tuple[str, TorchTeacher]]:
    """A :class:`TorchTeacher` (``**kw``) served in a background thread; yields (url, teacher).
    ``max_running_requests``: how many requests run at once (the rest wait; None: no limit)."""
    teacher = TorchTeacher.from_pretrained(model_dir, **kw)
    limits = {} if max_running_requests is None else {"max_running_requests": max_running_requests}
    server = ReferenceServer(
        teacher, version=version, api_key=api_key, latency_s=latency_s, **limits
    )
    with serve_in_thread(server) as url:
        yield url, teacher


def child_env() -> dict[str, str]:
    """This environment, with this checkout importable in a child process."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(_PACKAGE_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def wait_healthy(proc: Any, url: str, *, timeout_s: float = 60.0) -> None:
    """Return once ``url``'s ``/health`` answers 200; ``proc`` (a ``Popen``) exiting first, or
    no such answer within ``timeout_s`` in all: :class:`GuardRuntimeError`. Each probe ends
    within 1 s in total (a server that drips its answer is cut), and none outlives the wait."""
    import httpx

    from distill_guard.http_deadline import bound, deadline_at

    deadline = time.monotonic() + timeout_s
    with bound(httpx.Client(timeout=1.0)) as client:
        while True:
            if proc.poll() is not None:
                out = proc.stdout.read().decode() if proc.stdout else ""
                raise GuardRuntimeError(f"serve-reference exited {proc.returncode}: {out[-2000:]}")
            probe_by = min(time.monotonic() + 1.0, deadline)
            with contextlib.suppress(httpx.TransportError), deadline_at(probe_by):
                if client.get(url + "/health").status_code == 200:
                    return
            if time.monotonic() >= deadline:
                raise GuardRuntimeError(f"serve-reference did not answer on {url} in {timeout_s} s")
            time.sleep(0.1)


@contextlib.contextmanager
def reference_subprocess(
    model_dir: str | Path, *extra: str, timeout_s: float = 60.0
) -> Iterator[str]:
    """``serve-reference`` in a child process; yields its URL once ``/health`` answers."""
    port = free_port()
    cmd = [sys.executable, "-m", "distill_guard.cli", "serve-reference"]
    cmd += ["--model", str(model_dir), "--port", str(port), *extra]
    proc = subprocess.Popen(cmd, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url, timeout_s=timeout_s)
        yield url
    finally:
        stop_process(proc)


def stop_process(proc: subprocess.Popen) -> None:
    """Terminate a child server; kill it if it has not exited within 10 s."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
