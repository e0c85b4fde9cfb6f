"""TruncationCheck: a truncated ratio at or above the limit for `patience` steps warns."""

from __future__ import annotations

import math

import pytest

from distill_guard.checks import TruncationCheck
from distill_guard.findings import Code, Severity
from distill_guard.observations import RunSpec, StepMetrics


def feed(check, ratios, start=0):
    return [
        check.on_step_metrics(StepMetrics(start + i, {"truncated_ratio": r}), RunSpec())
        for i, r in enumerate(ratios)
    ]


@pytest.mark.parametrize("patience", [1, 3, 5])
def test_warns_after_patience_consecutive_steps(patience):
    out = feed(TruncationCheck(patience=patience), [0.9] * (patience + 2))
    first = next(i for i, f in enumerate(out) if f)
    assert first == patience - 1
    assert all(out[i] for i in range(first, len(out)))
    f = out[first][0]
    assert f.code == Code.STUDENT_TRUNCATION and f.severity is Severity.WARN
    assert f.values["consecutive_steps"] == patience and f.step == patience - 1


def test_a_short_step_resets_the_count():
    out = feed(TruncationCheck(patience=3), [0.9, 0.9, 0.1, 0.9, 0.9, 0.9])
    assert [bool(f) for f in out] == [False, False, False, False, False, True]


def test_the_limit_is_inclusive():
    check = TruncationCheck(max_ratio=0.5, patience=1)
    assert feed(check, [0.5])[0] and not feed(check, [0.49])[0]


def test_healthy_truncation_never_warns():
    assert not any(feed(TruncationCheck(), [0.04, 0.06, 0.03] * 100))


def test_nonfinite_ratio_neither_counts_nor_resets():
    out = feed(TruncationCheck(patience=3), [0.9, math.nan, 0.9, 0.9])
    assert [bool(f) for f in out] == [False, False, False, True]


def test_state_round_trip_keeps_the_count():
    a = TruncationCheck(patience=3)
    feed(a, [0.9, 0.9])
    b = TruncationCheck(patience=3)
    b.load_state_dict(a.state_dict())
    assert feed(b, [0.9], start=2)[0]
