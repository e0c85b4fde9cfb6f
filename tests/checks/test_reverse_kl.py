"""ReverseKLSignatureCheck: KL(s‖u) + H(s) = ln V betrays a uniform teacher under reverse KL."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from distill_guard.checks import ReverseKLSignatureCheck
from distill_guard.findings import Code, Severity
from distill_guard.observations import LossKind, RunSpec, StepMetrics
from tests._reference import log_softmax64
from tests.conftest import QWEN3_V

RKL = RunSpec(vocab_size=QWEN3_V, loss=LossKind.REVERSE_KL)


def student_vs_uniform(seed: int, scale: float) -> tuple[float, float]:
    """(KL(s‖uniform), H(s)) of a random student over the Qwen3 vocabulary, in float64."""
    g = torch.Generator().manual_seed(seed)
    ls = log_softmax64(torch.randn(QWEN3_V, generator=g, dtype=torch.float64) * scale)
    p = np.exp(ls)
    kl = float(np.sum(p * (ls + np.log(QWEN3_V))))
    h = float(-np.sum(p * ls))
    return kl, h


def judge(loss, entropy, run=RKL, check=None):
    values = {"loss": loss, "student_entropy": entropy}
    return (check or ReverseKLSignatureCheck()).on_step_metrics(StepMetrics(4, values), run)


@pytest.mark.parametrize("seed,scale", [(0, 1.0), (1, 4.0), (2, 9.0)])
def test_student_against_uniform_teacher_is_critical(seed, scale):
    kl, h = student_vs_uniform(seed, scale)
    (f,) = judge(kl, h)
    assert f.code == Code.LOSS_REVERSE_KL_SIGNATURE and f.severity is Severity.CRITICAL
    assert abs(f.values["gap"]) < 1e-6
    assert f.step == 4


def test_loss_scale_is_undone():
    kl, h = student_vs_uniform(0, 4.0)
    run = RunSpec(vocab_size=QWEN3_V, loss=LossKind.REVERSE_KL, loss_scale=3.0)
    assert [f.code for f in judge(3.0 * kl, h, run)] == [Code.LOSS_REVERSE_KL_SIGNATURE]
    assert judge(kl, h, run) == []  # unscaled by mistake: KL/3 + H is far from ln V


@pytest.mark.parametrize("kl,h", [(0.05, 0.4), (0.3, 1.2), (2.0, 3.0)])
def test_healthy_reverse_kl_is_not_flagged(kl, h):
    assert judge(kl, h) == []


def test_tolerance_boundary():
    log_v = math.log(QWEN3_V)
    check = ReverseKLSignatureCheck(rel_tol=0.02)
    assert judge(log_v * 0.985 - 1.0, 1.0, check=check) != []
    assert judge(log_v * 0.975 - 1.0, 1.0, check=check) == []


@pytest.mark.parametrize(
    "run",
    [
        RunSpec(vocab_size=QWEN3_V, loss=LossKind.JSD),
        RunSpec(vocab_size=QWEN3_V, loss=LossKind.FORWARD_KL),
        RunSpec(loss=LossKind.REVERSE_KL),
    ],
    ids=["jsd", "forward-kl", "no-vocab"],
)
def test_only_for_reverse_kl_with_known_vocab(run):
    kl, h = student_vs_uniform(0, 4.0)
    assert judge(kl, h, run) == []


def test_needs_both_metrics_finite():
    kl, h = student_vs_uniform(0, 4.0)
    check = ReverseKLSignatureCheck()
    assert check.on_step_metrics(StepMetrics(0, {"loss": kl}), RKL) == []
    assert check.on_step_metrics(StepMetrics(0, {"student_entropy": h}), RKL) == []
    assert judge(math.nan, h) == [] and judge(kl, math.inf) == []
