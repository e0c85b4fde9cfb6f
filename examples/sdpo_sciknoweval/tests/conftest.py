"""The demo tests' warm-up models: trained ahead in the background (``examples/conftest.py``
starts it), waited for here; trained here where nothing started it."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import pytest

from examples.conftest import ahead_folder

WAIT_S = 300
"""How long the first demo test waits for the warm-up (~55 s of CPU alone, longer on a loaded
box where it only had the CPU the other tests left)."""


def _session_basetemp(config: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The base temporary directory of the process that runs the session (the warm-up's): this
    one's, or under pytest-xdist the controller's, of which each worker's is a subfolder."""
    basetemp = tmp_path_factory.getbasetemp()
    return basetemp.parent if hasattr(config, "workerinput") else basetemp


@pytest.fixture(scope="session")
def demo_pretrain(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``make demo``'s pretrained teacher and student, a ``pretrain/`` folder for ``app.run``'s
    cache; shared read-only (a run with the same config only reads it)."""
    ahead = ahead_folder(_session_basetemp(request.config, tmp_path_factory))
    if not (ahead / "pretrain.log").exists():  # not started (a run without examples/conftest.py)
        from examples.sdpo_sciknoweval.tests.test_app import pretrain_ahead

        folder = tmp_path_factory.mktemp("demo_pretrain") / "pretrain"
        pretrain_ahead(folder)
        return folder
    deadline = time.monotonic() + WAIT_S
    raised = False
    while not (ahead / "rc").exists():
        if not raised and (ahead / "pid").exists():
            with contextlib.suppress(
                OSError, ValueError
            ):  # lowering a niceness may need privileges
                os.setpriority(os.PRIO_PROCESS, int((ahead / "pid").read_text()), 0)
            raised = True
        assert time.monotonic() < deadline, (
            f"the warm-up did not finish in {WAIT_S} s: "
            + (ahead / "pretrain.log").read_text()[-4000:]
        )
        time.sleep(0.2)
    assert (ahead / "rc").read_text() == "0", (ahead / "pretrain.log").read_text()[-4000:]
    return ahead / "pretrain"
