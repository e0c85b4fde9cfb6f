"""The demo tests' one expensive piece, the teacher and student warm-up (~55 s of CPU on one
thread), trained ahead by a background process that starts as soon as the session knows it will
run them.

This conftest is loaded by the process that runs the session: pytest's own, or pytest-xdist's
controller, which runs no test and learns from the first worker's collection whether the demo
tests are selected. The warm-up runs at a lower priority while the workers run the other tests,
on the CPU time their waits leave (servers starting, timeouts, child processes); by the time the
demo tests run, ``app.run`` finds the models in its cache (``pretrain/``, keyed by the hash of the
config, the vocabulary and the items) instead of training them. The models are the ones
``make demo``'s config trains (``app.pretrain_config``). The ``demo_pretrain`` fixture
(``sdpo_sciknoweval/tests/conftest.py``) waits for them, or trains them itself where nothing
started them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WARM_FILES = (
    "examples/sdpo_sciknoweval/tests/test_app.py",
    "examples/sdpo_sciknoweval/tests/test_app_variants.py",
)
"""The test files whose tests run on the warm-up's models (``demo_pretrain``)."""
AHEAD = "demo_pretrain"
"""The folder, under the session's base temporary directory, that the warm-up is trained into."""
NICE = 10
"""The warm-up yields to the tests it runs alongside (timing-sensitive ones among them); a test
that waits for it raises it back to normal priority, where allowed."""
_STARTED = pytest.StashKey[subprocess.Popen]()


def ahead_folder(basetemp: Path) -> Path:
    """Where a session whose base temporary directory is ``basetemp`` trains the warm-up."""
    return basetemp / AHEAD


def _is_warm(nodeid: str) -> bool:
    return nodeid.split("::", 1)[0] in WARM_FILES


def _start(config: pytest.Config) -> None:
    if config.stash.get(_STARTED, None) is not None:
        return
    out = ahead_folder(config._tmp_path_factory.getbasetemp())  # noqa: SLF001 - xdist's own use
    out.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    code = (
        "import os, sys, traceback\n"
        f"os.nice({NICE})\n"
        "out = sys.argv[1]\n"
        "open(os.path.join(out, 'pid'), 'w').write(str(os.getpid()))\n"
        "rc = 1\n"
        "try:\n"
        "    from examples.sdpo_sciknoweval.tests.test_app import pretrain_ahead\n"
        "    pretrain_ahead(os.path.join(out, 'pretrain'))\n"
        "    rc = 0\n"
        "except BaseException:\n"
        "    traceback.print_exc()\n"
        "finally:\n"
        "    open(os.path.join(out, 'rc.tmp'), 'w').write(str(rc))\n"
        "    os.replace(os.path.join(out, 'rc.tmp'), os.path.join(out, 'rc'))\n"
    )
    with (out / "pretrain.log").open("w") as log:
        config.stash[_STARTED] = subprocess.Popen(
            [sys.executable, "-c", code, str(out)],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def pytest_collection_finish(session: pytest.Session) -> None:
    """Without pytest-xdist: start the warm-up once the selected tests are known."""
    config = session.config
    if config.option.collectonly or hasattr(config, "workerinput"):
        return  # a worker: the controller starts it (pytest_xdist_node_collection_finished)
    if any(_is_warm(item.nodeid) for item in session.items):
        _start(config)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids) -> None:
    """pytest-xdist's controller: start the warm-up when a worker's collection has demo tests
    (every worker collects every test; the first to finish decides)."""
    if not node.config.option.collectonly and any(_is_warm(i) for i in ids):
        _start(node.config)


def pytest_unconfigure(config: pytest.Config) -> None:
    proc = config.stash.get(_STARTED, None)
    if proc is None:
        return
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    shutil.rmtree(ahead_folder(config._tmp_path_factory.getbasetemp()), ignore_errors=True)  # noqa: SLF001
