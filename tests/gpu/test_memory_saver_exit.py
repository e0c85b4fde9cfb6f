"""A process that held a torch_memory_saver region exits with its own status (docs/teachers.md,
"Exiting after torch_memory_saver"): torch_memory_saver 0.0.10 ``exit(1)``s when torch frees the
region's blocks at interpreter shutdown, outside any region."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent(
    """
    import sys, torch
    from distill_guard.testing.tiny import build_tiny_qwen3
    from distill_guard.teachers import TorchTeacher
    path = build_tiny_qwen3(sys.argv[1], vocab_size=1024)
    teacher = TorchTeacher.from_pretrained(path, device="cuda", dtype=torch.bfloat16)
    assert teacher.uses_torch_memory_saver
    if sys.argv[2] == "asleep":
        teacher.release()
    print("done", flush=True)
    sys.exit(int(sys.argv[3]))
    """
)


@pytest.mark.parametrize("state", ["awake", "asleep"])
@pytest.mark.parametrize("status", [0, 3])
def test_the_exit_status_is_the_programs_own(tmp_path, state, status):
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "tiny"), state, str(status)],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.stdout.strip() == "done", proc.stderr[-2000:]
    assert proc.returncode == status, proc.stderr[-2000:]
    assert "only support interesting region" not in proc.stderr
