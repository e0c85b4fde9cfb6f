"""NonfiniteMetricsCheck: NaN/inf metrics, critical for the loss, warn for the rest."""

from __future__ import annotations

import math

import pytest

from distill_guard.checks import NonfiniteMetricsCheck
from distill_guard.findings import Code, Severity
from distill_guard.observations import RunSpec, StepMetrics


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_nonfinite_loss_is_critical(value):
    (f,) = NonfiniteMetricsCheck().on_step_metrics(StepMetrics(9, {"loss": value}), RunSpec())
    assert f.code == Code.METRIC_NONFINITE and f.severity is Severity.CRITICAL
    assert f.values["metric"] == "loss" and f.step == 9
    assert "'loss'" in f.message


def test_other_roles_warn_and_each_bad_metric_is_reported():
    values = {"loss": 0.1, "student_entropy": math.nan, "truncated_ratio": math.inf}
    out = NonfiniteMetricsCheck().on_step_metrics(StepMetrics(0, values), RunSpec())
    assert sorted(f.values["metric"] for f in out) == ["student_entropy", "truncated_ratio"]
    assert {f.severity for f in out} == {Severity.WARN}


def test_critical_roles_are_configurable():
    check = NonfiniteMetricsCheck(critical_roles=["student_entropy"])
    out = check.on_step_metrics(
        StepMetrics(0, {"loss": math.nan, "student_entropy": math.nan}), RunSpec()
    )
    severity = {f.values["metric"]: f.severity for f in out}
    assert severity == {"loss": Severity.WARN, "student_entropy": Severity.CRITICAL}


def test_finite_and_absent_values_are_fine():
    check = NonfiniteMetricsCheck()
    assert (
        check.on_step_metrics(StepMetrics(0, {"loss": 0.0, "student_entropy": -1e30}), RunSpec())
        == []
    )
    assert check.on_step_metrics(StepMetrics(0, {"loss": None}), RunSpec()) == []
