"""LossSignalCheck: a JSD at β near an end, and a loss too small to teach anything."""

from __future__ import annotations

import pytest

from distill_guard.checks import LossSignalCheck
from distill_guard.findings import Code, Severity
from distill_guard.observations import LossKind, RunSpec, StepMetrics


def feed(check, losses, run):
    return [
        f
        for i, x in enumerate(losses)
        for f in check.on_step_metrics(StepMetrics(i, {"loss": x}), run)
    ]


@pytest.mark.parametrize("beta", [1e-6, 1 - 1e-6, 0.005])
def test_a_jsd_clamped_near_an_end_is_said_once(beta):
    found = feed(LossSignalCheck(), [2e-6] * 30, RunSpec(beta=beta))
    codes = [f.code for f in found]
    assert codes.count(Code.CONFIG_BETA_AT_END) == 1 and codes[0] == Code.CONFIG_BETA_AT_END
    assert Code.LOSS_NO_SIGNAL in codes  # and the loss itself shows it
    assert all(f.severity is Severity.WARN for f in found)


def test_a_healthy_beta_and_loss_say_nothing():
    assert feed(LossSignalCheck(), [0.05] * 30, RunSpec(beta=0.5)) == []
    assert feed(LossSignalCheck(), [0.3] * 30, RunSpec(loss=LossKind.FORWARD_KL)) == []


def test_a_kl_whose_loss_is_near_zero_from_the_start_warns():
    found = feed(LossSignalCheck(), [3e-6] * 30, RunSpec(loss=LossKind.FORWARD_KL))
    assert [f.code for f in found] == [Code.LOSS_NO_SIGNAL]
    assert found[0].step == 19
