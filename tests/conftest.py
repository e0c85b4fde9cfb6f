"""Shared fixtures: deterministic generators, quiet guards, history files and a CLI runner."""

from __future__ import annotations

import csv
import json
import math
import multiprocessing
import multiprocessing.forkserver
from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, settings

from distill_guard.alerts import Alerter
from distill_guard.guard import DistillGuard

settings.register_profile(
    "distill_guard",
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
    derandomize=True,
)
settings.load_profile("distill_guard")

# Tiny tensors only: on a 2-core box intra-op threads cost more than they save (a reduction over
# 64 floats took 4 ms with two threads, 0.1 ms with one).
torch.set_num_threads(1)

QWEN3_V = 151936
"""Qwen3's vocabulary: the V of the failed run (docs/invariants.md §1)."""
LN_QWEN3_V = math.log(QWEN3_V)


FORKSERVER_PRELOAD = (
    "torch",
    "torch.distributed",
    "torch._dynamo",  # a process's first torch.optim optimizer imports it (~1.3 s)
    "hydra.utils",
    "hydra.core.config_store",
    "httpx",
    "transformers",
    "transformers.models.qwen3.modeling_qwen3",
    "ray",  # the Relax gate's first hook looks for a Ray session (~0.3 s a trainer rank)
    "distill_guard",
    "tests._forkserver_warm",
)
"""What the fork server imports once, so its children need not (torch alone is ~2 s of CPU; with
these a child imports the rest of what it runs in ~0.1 s). Third-party modules and the package's
root only, by name: the server skips a module that raises ImportError but dies on any other
error, and a module mid-refactor must not take every forking test down with it. The package's
and the tests' modules that the children run come through ``tests/_forkserver_warm.py``, which
lets any error pass (the child then imports that module itself, and fails where it would have)."""


def _forkserver_context() -> multiprocessing.context.BaseContext:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(FORKSERVER_PRELOAD))
    return ctx


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the fork server once the session knows a selected test needs it: its imports (~5 s
    of CPU) run on the other core while the first tests run, not in the first test that forks."""
    if session.config.option.collectonly:
        return
    if any("forkserver" in getattr(item, "fixturenames", ()) for item in session.items):
        _forkserver_context()
        multiprocessing.forkserver.ensure_running()


@pytest.fixture(scope="session")
def forkserver() -> multiprocessing.context.BaseContext:
    """A multiprocessing context for tests that run real processes (gloo ranks): each child is a
    new process, forked from one server that imported :data:`FORKSERVER_PRELOAD` once, instead of
    a spawned interpreter that imports torch and the package again (2–4 s a child on this 2-core
    box, where the tests' scenarios take well under a second). A child starts from the server's
    state: nothing of the test process, and the environment the server started with, so a test
    whose children read variables passes them explicitly."""
    return _forkserver_context()


@pytest.fixture(autouse=True)
def _fresh_secrets():
    """Each test starts with no secret registered (one test's short key must not redact the
    letters of the next one's output)."""
    from distill_guard import redaction

    yield
    redaction.forget_all()


@pytest.fixture(autouse=True)
def _no_wandb_leaks(tmp_path, monkeypatch):
    """wandb never reaches the network, writes under tmp_path, and no run outlives a test."""
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_MODE", "disabled")  # tests that want another mode say so
    yield
    import sys

    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.finish()
    setup = sys.modules.get("wandb.sdk.wandb_setup")
    if setup is not None and getattr(setup, "_singleton", None) is not None:
        # wandb's process-wide settings are read once, when they are first made (by an init,
        # or by anything that touches wandb.run): torn down, the next test's environment
        # (WANDB_MODE=disabled) is read again instead of an earlier test's, which could
        # leave a later Trainer's wandb.init asking for a login
        wandb.teardown()


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(1234)


@pytest.fixture
def quiet_alerter() -> Alerter:
    """An alerter that neither logs nor talks to wandb."""
    return Alerter(use_wandb=False, log_alerts=False)


@pytest.fixture
def make_guard(tmp_path, quiet_alerter):
    """DistillGuard factory with a quiet alerter and, unless told otherwise, an event file."""

    def factory(*args, events: object = "default", **kwargs) -> DistillGuard:
        if events == "default":
            events = tmp_path / "events.jsonl"
        kwargs.setdefault("alerter", quiet_alerter)
        return DistillGuard(*args, events=events, **kwargs)

    return factory


def write_jsonl(rows: Iterable[dict], path: Path) -> Path:
    with path.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    return path


def write_csv(rows: Sequence[dict], path: Path, columns: Sequence[str] | None = None) -> Path:
    """A wandb-export-shaped CSV: one header, empty cells where a row lacks a key."""
    if columns is None:
        columns = sorted({k for r in rows for k in r})
    with path.open("w", encoding="utf-8", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(columns), restval="")
        w.writeheader()
        for r in rows:
            w.writerow({k: r[k] for k in columns if k in r})
    return path


@pytest.fixture
def run_cli(capsys):
    """Run ``distill_guard.cli.main`` in-process: (exit code, stdout, stderr)."""
    from distill_guard.cli import main

    def runner(*argv: str) -> tuple[int, str, str]:
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exc:  # argparse usage errors
            code = exc.code
        out, err = capsys.readouterr()
        return code, out, err

    return runner
