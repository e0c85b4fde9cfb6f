"""``import distill_guard`` and the framework-free integrations pull in neither transformers nor Lightning.

Every probe runs in a fresh process: one interpreter imports torch (which every probe needs and
which imports none of the watched modules, checked below), then forks one child per probe, so
each probe starts from the same clean state without paying for a new interpreter and torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

HEAVY = (
    "httpx",
    "fastapi",
    "uvicorn",
    "hydra",
    "transformers",
    "lightning",
    "wandb",
    "sglang",
    "ray",
)
FRAMEWORKS = ("transformers", "lightning", "pytorch_lightning")

PROBES = {
    "core_and_plain": (
        "import distill_guard, distill_guard.guard, distill_guard.config, distill_guard.consensus\n"
        "import distill_guard.integrations, distill_guard.integrations.plain\n"
        "import distill_guard.integrations.relax, distill_guard.integrations.hydra\n"
        "from distill_guard.integrations.relax import GuardedGoldenAnswerSDPOFeedback\n"
    ),
    "checks": "import distill_guard.checks",
    "package_and_teachers": (
        "import distill_guard, distill_guard.teachers, distill_guard.live.colocate"
    ),
    "http_teacher": "from distill_guard.teachers import SGLangHTTPTeacher",
    "build_guard": "from distill_guard import build_guard",
}

FORKS = r"""
import json, os, sys, traceback

import torch  # noqa: F401  every probe needs it: imported once, before the forks

def loaded():
    return [m for m in WATCHED if m in sys.modules]

results = {"torch": {"loaded": loaded(), "error": None}}
children = {}
for name, code in PROBES.items():
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the probe, in a process of its own
        os.close(r)
        try:
            exec(code, {"__name__": "__probe__"})
            out = {"loaded": loaded(), "error": None}
        except BaseException:
            out = {"loaded": loaded(), "error": traceback.format_exc()}
        with os.fdopen(w, "w") as f:
            f.write(json.dumps(out))
        os._exit(0)
    os.close(w)
    children[name] = (pid, r)
for name, (pid, r) in children.items():
    with os.fdopen(r) as f:
        results[name] = json.loads(f.read() or '{"loaded": [], "error": "no answer"}')
    _, status = os.waitpid(pid, 0)
    if status and results[name]["error"] is None:
        results[name]["error"] = f"exit status {status}"
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def probes() -> dict[str, dict]:
    """Per probe: the watched modules it left imported, and its error if it raised."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    watched = tuple(dict.fromkeys(HEAVY + FRAMEWORKS))
    code = f"WATCHED = {watched!r}\nPROBES = {PROBES!r}\n{FORKS}"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    results = json.loads(out.stdout.splitlines()[-1])
    assert results["torch"]["loaded"] == []  # the shared start imports nothing watched
    return results


def _imports(probes: dict[str, dict], name: str, among: tuple[str, ...] = HEAVY) -> list[str]:
    """The modules of ``among`` the probe ``name`` left imported (it must have run cleanly)."""
    result = probes[name]
    assert result["error"] is None, result["error"]
    return [m for m in result["loaded"] if m in among]


def test_core_and_plain_integrations_do_not_import_frameworks(probes):
    assert _imports(probes, "core_and_plain", FRAMEWORKS) == []


def test_checks_are_pure_and_import_no_client(probes):
    assert _imports(probes, "checks") == []


def test_the_package_and_its_teachers_need_only_torch_until_used(probes):
    assert _imports(probes, "package_and_teachers") == []
    assert _imports(probes, "http_teacher") == ["httpx"]
    assert "hydra" in _imports(probes, "build_guard")
