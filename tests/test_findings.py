"""Findings: ordered severities, stable codes, worst-of."""

from __future__ import annotations

import pytest

from distill_guard.findings import Code, Finding, Severity, worst


def test_severity_order():
    assert Severity.INFO < Severity.WARN < Severity.CRITICAL
    assert Severity.CRITICAL >= Severity.CRITICAL and Severity.WARN <= Severity.CRITICAL
    assert Severity.WARN >= "info" and not Severity.INFO > "warn"
    assert sorted([Severity.CRITICAL, Severity.INFO, Severity.WARN], key=lambda s: s.rank) == [
        Severity.INFO,
        Severity.WARN,
        Severity.CRITICAL,
    ]


def test_worst():
    assert worst([]) is None
    fs = [Finding("a", s, "m") for s in (Severity.INFO, Severity.CRITICAL, Severity.WARN)]
    assert worst(fs) is Severity.CRITICAL
    assert worst(fs[:1]) is Severity.INFO


def test_codes_are_unique_dotted_and_stable():
    codes = {k: v for k, v in vars(Code).items() if k.isupper()}
    assert len(set(codes.values())) == len(codes)
    assert all("." in v and v == v.lower() for v in codes.values())
    # dashboards key on these: renaming one is a breaking change
    assert Code.TEACHER_UNIFORM == "teacher.uniform"
    assert Code.LOSS_JSD_CEILING == "loss.jsd_ceiling"
    assert Code.METRIC_NONFINITE == "metric.nonfinite"
    assert Code.GUARD_INTERNAL_ERROR == "guard.internal_error"


def test_finding_is_immutable():
    f = Finding("a", Severity.INFO, "m")
    with pytest.raises(AttributeError):
        f.code = "b"  # type: ignore[misc]
