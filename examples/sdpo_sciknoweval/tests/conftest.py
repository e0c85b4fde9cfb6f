"""The demo tests' one expensive piece, the teacher and student warm-up (~40 s of CPU on one
thread), trained ahead by a background process that starts as soon as the session knows it will
run them.

The rest of the session keeps one core busy on this 2-core box; the warm-up takes the other
meanwhile (one torch thread, at a lower priority), so by the time the demo tests run,
``app.run`` finds the models in its cache (``pretrain/``, keyed by the hash of the config, the
vocabulary and the items) instead of training them. The models are the ones ``make demo``'s
config trains (``app.pretrain_config``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
AHEAD = pytest.StashKey[tuple[Path, subprocess.Popen]]()
NICE = 10
"""The warm-up yields to the tests it runs alongside (timing-sensitive ones among them); the first
test that needs it raises it back to normal priority while it waits, where allowed."""
WAIT_S = 240
"""How long the first demo test waits for the warm-up (~40 s alone, longer on a loaded box)."""


def _needs_the_warm_up(item: pytest.Item) -> bool:
    return "demo_pretrain" in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests on the warm-up models run last (in their order), the rest first: the warm-up
    trains meanwhile. Under pytest-xdist they go first instead: one worker takes them (and the
    warm-up) at once while the other workers run the rest."""
    warm = [i for i in items if _needs_the_warm_up(i)]
    rest = [i for i in items if not _needs_the_warm_up(i)]
    items[:] = warm + rest if hasattr(config, "workerinput") else rest + warm


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly or not any(map(_needs_the_warm_up, session.items)):
        return
    if hasattr(session.config, "workerinput"):
        # under pytest-xdist every worker collects every test: the worker that runs the demo
        # tests trains the warm-up itself (demo_pretrain), while the others run the rest
        return
    out = Path(tempfile.mkdtemp(prefix="demo_pretrain_"))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    code = (
        "import os, sys\n"
        f"os.nice({NICE})\n"
        "from examples.sdpo_sciknoweval.tests.test_app import pretrain_ahead\n"
        "pretrain_ahead(sys.argv[1])\n"
    )
    with (out / "pretrain.log").open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", code, str(out / "pretrain")],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    session.config.stash[AHEAD] = (out, proc)


def pytest_unconfigure(config: pytest.Config) -> None:
    ahead = config.stash.get(AHEAD, None)
    if ahead is None:
        return
    out, proc = ahead
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    shutil.rmtree(out, ignore_errors=True)


@pytest.fixture(scope="session")
def demo_pretrain(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``make demo``'s pretrained teacher and student, a ``pretrain/`` folder for ``app.run``'s
    cache; shared read-only (a run with the same config only reads it)."""
    ahead = request.config.stash.get(AHEAD, None)
    if ahead is None:  # not started at collection: train here
        from examples.sdpo_sciknoweval.tests.test_app import pretrain_ahead

        folder = tmp_path_factory.mktemp("demo_pretrain") / "pretrain"
        pretrain_ahead(folder)
        return folder
    out, proc = ahead
    with contextlib.suppress(OSError):  # lowering a niceness may need privileges
        os.setpriority(os.PRIO_PROCESS, proc.pid, 0)
    rc = proc.wait(timeout=WAIT_S)
    assert rc == 0, (out / "pretrain.log").read_text()[-4000:]
    return out / "pretrain"
