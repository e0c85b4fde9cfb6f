"""JSDCeilingCheck: a per-token JSD at H(β) means disjoint support, i.e. a uniform teacher."""

from __future__ import annotations

import math

import pytest

from distill_guard.checks import JSDCeilingCheck
from distill_guard.findings import Code, Severity
from distill_guard.observations import LossKind, RunSpec, StepMetrics
from tests._reference import binary_entropy64


def judge(loss, run=None, check=None, step=0):
    check = check or JSDCeilingCheck()
    return check.on_step_metrics(StepMetrics(step, {"loss": loss}), run or RunSpec(beta=0.5))


def test_failed_runs_step0_loss_is_critical():
    (f,) = judge(0.688)
    assert f.code == Code.LOSS_JSD_CEILING and f.severity is Severity.CRITICAL
    assert f.values["ceiling"] == pytest.approx(math.log(2))
    assert f.values["per_token_loss"] == pytest.approx(0.688)
    assert "0.688" in f.message and "0.6931" in f.message


@pytest.mark.parametrize("loss", [0.02, 0.026, 0.3, 1e-4, 0.0])
def test_healthy_and_spiky_losses_are_not_flagged(loss):
    assert judge(loss) == []


@pytest.mark.parametrize("beta", [0.1, 0.3, 0.5, 0.7, 0.9])
def test_bound_is_h_of_beta_for_either_convention(beta):
    ceiling = binary_entropy64(beta)
    check = JSDCeilingCheck()
    (f,) = judge(0.99 * ceiling, RunSpec(beta=beta), check)
    assert f.code == Code.LOSS_JSD_CEILING
    assert f.values["ceiling"] == pytest.approx(ceiling, rel=1e-9)
    assert judge(0.9 * ceiling, RunSpec(beta=beta), check) == []


def test_bound_fraction_is_inclusive_and_configurable():
    ceiling = math.log(2)
    check = JSDCeilingCheck(fraction_of_ceiling=0.8)
    assert [f.code for f in judge(0.8 * ceiling * (1 + 1e-9), check=check)] == [
        Code.LOSS_JSD_CEILING
    ]
    assert judge(0.79 * ceiling, check=check) == []


@pytest.mark.parametrize("scale", [2.0, 4.0, 0.25])
def test_loss_scale_is_undone_before_comparing(scale):
    run = RunSpec(beta=0.5, loss_scale=scale)
    (f,) = judge(0.688 * scale, run)
    assert f.code == Code.LOSS_JSD_CEILING
    assert f.values["per_token_loss"] == pytest.approx(0.688)
    assert judge(0.02 * scale, run) == []


def test_scaled_healthy_loss_would_be_flagged_without_loss_scale():
    """A healthy loss of 0.02 summed over 40 tokens looks like 0.8: not a JSD, so a warning,
    and with loss_scale set it is fine."""
    (f,) = judge(0.8)
    assert f.code == Code.LOSS_ABOVE_CEILING and f.severity is Severity.WARN
    assert judge(0.8, RunSpec(beta=0.5, loss_scale=40.0)) == []


def test_above_ceiling_is_a_config_warning_not_a_ceiling_finding():
    ceiling = math.log(2)
    out = judge(ceiling * 1.2)
    assert [f.code for f in out] == [Code.LOSS_ABOVE_CEILING]
    assert "loss_scale" in out[0].message
    # within the tolerance above the bound it is still the ceiling finding
    assert [f.code for f in judge(ceiling * 1.03)] == [Code.LOSS_JSD_CEILING]


@pytest.mark.parametrize("kind", [LossKind.REVERSE_KL, LossKind.FORWARD_KL])
def test_off_for_kl_losses(kind):
    assert judge(0.688, RunSpec(loss=kind)) == []
    assert judge(50.0, RunSpec(loss=kind)) == []


@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_off_at_the_ends_of_beta(beta):
    assert judge(0.688, RunSpec(beta=beta)) == []


@pytest.mark.parametrize("loss", [math.nan, math.inf, -math.inf])
def test_nonfinite_loss_is_left_to_the_nonfinite_check(loss):
    assert judge(loss) == []


def test_no_loss_no_finding():
    assert (
        JSDCeilingCheck().on_step_metrics(StepMetrics(0, {"student_entropy": 1.0}), RunSpec()) == []
    )


def test_a_kl_loss_judged_as_a_jsd_is_told_it_may_not_be_one():
    """A forward-KL run replayed with the default (JSD) settings: the old message blamed only
    scaling or extra terms, the wrong diagnosis for a loss that is simply not a JSD."""
    (f,) = judge(2.3)
    assert "not a JSD" in f.message and "KL" in f.message and "run.loss" in f.message


def test_blame_follows_the_teachers_own_evidence():
    run = RunSpec(beta=0.5)
    check = JSDCeilingCheck()
    healthy = check.on_step_metrics(StepMetrics(0, {"loss": 0.688}, teacher_healthy=True), run)
    unknown = check.on_step_metrics(StepMetrics(0, {"loss": 0.688}), run)
    dead = check.on_step_metrics(StepMetrics(0, {"loss": 0.688}, teacher_healthy=False), run)
    assert [f.code for f in healthy] == [Code.STUDENT_DIVERGED]
    assert "learning rate" in healthy[0].message and "uniform" not in healthy[0].message
    assert [f.code for f in unknown] == [Code.LOSS_JSD_CEILING]
    assert "diverged" in unknown[0].message  # both causes named when nothing tells them apart
    assert [f.code for f in dead] == [Code.LOSS_JSD_CEILING]
    assert "it is the teacher" in dead[0].message
