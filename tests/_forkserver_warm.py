"""Imported by the session's fork server (``tests/conftest.py``, ``FORKSERVER_PRELOAD``): the
package's and the tests' modules that its children run, so that each child does not import them
again (~0.1-0.2 s of CPU a child: the Relax harness alone starts two trainer ranks a run). An
error here is let pass, never raised: the fork server would die of it, and every forking test
with it; the child imports the module itself and fails as it would have."""

from __future__ import annotations

import contextlib
import importlib

CHILDREN_RUN = (
    "distill_guard.guard",
    "distill_guard.integrations.relax",
    "tests.integrations.relax_harness",  # the Relax trainer ranks (test_relax.py, conformance)
    "tests.test_consensus",  # its gloo scenarios
    "examples.multigpu_colocate.run",  # the example's ranks (tests/examples)
)

for _name in CHILDREN_RUN:
    with contextlib.suppress(Exception):
        importlib.import_module(_name)
