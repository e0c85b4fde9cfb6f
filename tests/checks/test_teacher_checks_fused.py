"""The teacher checks' tests again, with every float32 tensor through the Triton kernels of
:mod:`distill_guard.kernels.teacher_stats` (the CUDA hot path): compiled on a CUDA machine, else
in Triton's interpreter. The same findings, values and host reads as the PyTorch path."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

from tests._triton import CHECKOUT

pytest.importorskip("triton")

LEAST = {"triton_view_parts": 50, "triton_row_max": 40, "triton_gap_parts": 4}
"""Launches each kernel must take in the rerun: a patch that stopped reaching one fails here."""


def test_the_teacher_checks_tests_pass_on_the_fused_path():
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.checks._fused_stats",
         "-p", "no:cacheprovider", "tests/checks/test_teacher_collapse.py",
         "tests/checks/test_pairing.py"],
        env=env, cwd=CHECKOUT, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    line = re.search(r"fused launches: (.*)", proc.stdout)
    assert line, proc.stdout[-1000:]
    launches = {n: int(c) for n, c in re.findall(r"(\w+) (\d+)", line.group(1))}
    assert all(launches.get(n, 0) >= least for n, least in LEAST.items()), line.group(0)
