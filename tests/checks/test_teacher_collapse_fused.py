"""The teacher-collapse check's tests again, with every float32 view through its Triton kernel
(:mod:`distill_guard.kernels.teacher_stats`, the CUDA hot path) in Triton's interpreter: the
same findings, values and host reads as the PyTorch path."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests._triton import CHECKOUT

pytest.importorskip("triton")


def test_the_check_s_tests_pass_on_the_fused_path():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.checks._fused_stats",
         "-p", "no:cacheprovider", "tests/checks/test_teacher_collapse.py"],
        env=env, cwd=CHECKOUT, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    fused = re.search(r"fused views: (\d+)", proc.stdout)
    assert fused and int(fused.group(1)) > 50, proc.stdout[-1000:]
