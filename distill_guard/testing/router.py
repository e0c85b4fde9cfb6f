"""The real ``sglang-router`` on loopback, for tests and demos: started in a child process in
front of reference servers (``pip install 'distill_guard[router]'``), which stand for the
replicas and count what reaches each.

It binds 127.0.0.1 only, its Prometheus exporter too (by default that one listens on
0.0.0.0:29000, which two routers on one machine would share), and logs at ``warn``.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from distill_guard.errors import GuardRuntimeError
from distill_guard.extras import require
from distill_guard.teachers.torch_teacher import TorchTeacher, _EmulatedRegion
from distill_guard.testing.reference_server import ReferenceServer, serve_in_thread
from distill_guard.testing.servers import free_port, stop_process


@contextlib.contextmanager
def sglang_router(
    worker_urls: Sequence[str],
    *,
    policy: str = "round_robin",
    health_check: bool = False,
    extra: Sequence[str] = (),
    log_path: str | Path | None = None,
    timeout_s: float = 30.0,
) -> Iterator[str]:
    """``python -m sglang_router.launch_router`` in front of ``worker_urls``; yields its URL
    once ``GET /workers`` lists every worker healthy.

    ``health_check=False`` starts it with ``--disable-health-check``, as the replica set-up
    does: the router's checker sends ``GET /health`` to every worker at each interval, and on
    SGLang that runs a forward, which kills a released replica (``docs/sglang-contract.md``
    §8, R5). ``extra``: more router flags (``--api-key``, ``--health-check-interval-secs``)."""
    require("the real sglang-router", "router", "sglang_router")
    import httpx

    port, metrics = free_port(), free_port()
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--prometheus-host", "127.0.0.1"]
    cmd += ["--prometheus-port", str(metrics), "--policy", policy, "--log-level", "warn"]
    cmd += ["--shutdown-grace-period-secs", "0"]
    cmd += [] if health_check else ["--disable-health-check"]
    cmd += [*extra, "--worker-urls", *worker_urls]
    log = open(log_path or "/dev/null", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    key = next((extra[i + 1] for i, a in enumerate(extra[:-1]) if a == "--api-key"), None)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    want = {u.rstrip("/") for u in worker_urls}
    try:
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=1.0, headers=headers) as client:
            while True:
                if proc.poll() is not None:
                    raise GuardRuntimeError(f"sglang-router exited {proc.returncode}: {cmd}")
                with contextlib.suppress(httpx.TransportError, ValueError, KeyError):
                    listed = client.get(url + "/workers").json()["workers"]
                    if {w["url"] for w in listed if w["is_healthy"]} >= want:
                        break
                if time.monotonic() >= deadline:
                    raise GuardRuntimeError(f"sglang-router on {url} not ready in {timeout_s} s")
                time.sleep(0.05)
        yield url
    finally:
        stop_process(proc)
        log.close()


@dataclass
class ServedReplica:
    """A reference server standing for one replica, counting what reaches it."""

    url: str
    teacher: TorchTeacher
    server: ReferenceServer
    calls: Counter[str] = field(default_factory=Counter)
    """``generate`` and ``health`` calls served (a canary's scoring counts as a ``generate``)."""

    def count(self) -> None:
        """Wrap the server's ``generate`` and ``health`` to count them (the app looks them up
        at each request)."""
        for name in ("generate", "health"):
            served = getattr(self.server, name)

            def counted(*args: Any, _served: Any = served, _name: str = name) -> Any:
                self.calls[_name] += 1
                return _served(*args)

            setattr(self.server, name, counted)

    def next_wakes(self, *, backup: bool, fault: str = "zeros") -> None:
        """How its following wakes go on the CPU emulation: weights kept (``backup``), or lost
        to ``fault`` (``"zeros"`` or ``"garbage"``), as a replica launched without
        ``--enable-weights-cpu-backup`` wakes."""
        region = self.teacher._region
        if not isinstance(region, _EmulatedRegion):
            raise GuardRuntimeError("next_wakes needs the CPU emulation of the memory saver")
        region._cpu_backup, region._fault = backup, fault  # type: ignore[assignment]

    def corrupt(self, seed: int = 0) -> None:
        """Replace its weights with seeded noise while it serves, awake (a bad weight push
        between two checks): only a canary sent after it sees it."""
        import torch

        gen = torch.Generator().manual_seed(seed)
        with self.teacher._lock, torch.no_grad():
            for p in self.teacher.model.parameters():
                noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
                p.copy_(noise.to(p.dtype))


@contextlib.contextmanager
def reference_replicas(
    model_dir: str | Path,
    backups: Sequence[bool],
    *,
    version: str = "0.5.23",
    fault: str = "zeros",
) -> Iterator[list[ServedReplica]]:
    """One reference server per entry of ``backups`` (its weights CPU backup: False wakes with
    zeroed weights at every release), each in a thread on a free loopback port, counted."""
    with contextlib.ExitStack() as stack:
        out = []
        for backup in backups:
            teacher = TorchTeacher.from_pretrained(
                model_dir, enable_memory_saver=True, enable_cpu_backup=backup, fault=fault
            )
            server = ReferenceServer(teacher, version=version)
            url = stack.enter_context(serve_in_thread(server))
            replica = ServedReplica(url, teacher, server)
            replica.count()
            out.append(replica)
        yield out
