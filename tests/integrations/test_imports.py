"""``import distill_guard`` and the framework-free integrations pull in neither transformers nor Lightning."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_core_and_plain_integrations_do_not_import_frameworks():
    code = (
        "import sys\n"
        "import distill_guard, distill_guard.guard, distill_guard.config, distill_guard.consensus\n"
        "import distill_guard.integrations, distill_guard.integrations.plain\n"
        "import distill_guard.integrations.relax, distill_guard.integrations.hydra\n"
        "from distill_guard.integrations.relax import GuardedGoldenAnswerSDPOFeedback\n"
        "bad = [m for m in ('transformers', 'lightning', 'pytorch_lightning') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def _imports(code: str) -> list[str]:
    """Run ``code`` in a fresh interpreter; the heavy modules it left imported."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    probe = code + "\nimport sys\nprint(' '.join(m for m in HEAVY if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", f"HEAVY = {HEAVY!r}\n{probe}"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


HEAVY = ("httpx", "fastapi", "uvicorn", "hydra", "transformers", "lightning", "wandb", "sglang")


def test_checks_are_pure_and_import_no_client():
    assert _imports("import distill_guard.checks") == []


def test_the_package_and_its_teachers_need_only_torch_until_used():
    assert (
        _imports("import distill_guard, distill_guard.teachers, distill_guard.live.colocate") == []
    )
    assert _imports("from distill_guard.teachers import SGLangHTTPTeacher") == ["httpx"]
    assert "hydra" in _imports("from distill_guard import build_guard")
