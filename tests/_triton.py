"""Run a Triton test script in a fresh interpreter from the checkout: compiled on a CUDA machine,
else through Triton's interpreter (chosen when a kernel is defined, hence the fresh process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

CHECKOUT = Path(__file__).resolve().parents[1]  # where ``tests._reference`` imports from


def run_triton_script(script: str, *, timeout: float) -> None:
    """Run ``script``; it must exit 0 and print ``ok`` last (its stderr is the failure)."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"
    proc = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        cwd=CHECKOUT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok"), proc.stdout[-1000:]
