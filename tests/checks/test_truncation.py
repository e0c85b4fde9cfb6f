"""TruncationCheck: the median truncated ratio of the last `window` steps at the limit warns; an
open incident's follow-up confirms it from the ratio's own start."""

from __future__ import annotations

import math

import pytest

from distill_guard.checks import TruncationCheck
from distill_guard.findings import Code, Severity
from distill_guard.observations import RunSpec, StepMetrics
from tests.checks._seed import seed_truncation


def feed(check, ratios, start=0):
    return [
        check.on_step_metrics(StepMetrics(start + i, {"truncated_ratio": r}), RunSpec())
        for i, r in enumerate(ratios)
    ]


@pytest.mark.parametrize("window", [1, 3, 5])
def test_warns_once_most_of_the_window_is_truncated(window):
    out = feed(TruncationCheck(window=window), [0.02] * window + [0.9] * (window + 2))
    first = next(i for i, f in enumerate(out) if f)
    assert first == window + window // 2  # the median crosses with the majority
    assert all(out[i] for i in range(first, len(out)))
    f = out[first][0]
    assert f.code == Code.STUDENT_TRUNCATION and f.severity is Severity.WARN
    assert f.values["window_median"] == pytest.approx(0.9) and f.values["window"] == window


@pytest.mark.parametrize("burst", [1, 2])
def test_a_burst_of_one_or_two_long_batches_is_not_a_trend(burst):
    ratios = [0.04] * 20 + [1.0] * burst + [0.04] * 20
    assert not any(feed(TruncationCheck(), ratios))


def test_the_limit_is_inclusive():
    check = TruncationCheck(max_ratio=0.5, window=1)
    feed(check, [0.0])  # the student's own level at the start
    assert feed(check, [0.5], start=1)[0] and not feed(check, [0.49], start=2)[0]


def test_healthy_truncation_never_warns():
    assert not any(feed(TruncationCheck(), [0.04, 0.06, 0.03] * 100))


def test_nonfinite_ratio_is_skipped():
    out = feed(TruncationCheck(window=3), [0.02] * 3 + [0.9, math.nan, 0.9, 0.9])
    assert [bool(f) for f in out] == [False] * 5 + [True, True]


def test_state_round_trip_keeps_the_window():
    a = TruncationCheck(window=3)
    feed(a, [0.02] * 3 + [0.9, 0.9])
    b = TruncationCheck(window=3)
    b.load_state_dict(a.state_dict())
    assert feed(b, [0.9], start=5)[0]
    assert b.state_dict()["start"]["median"] == pytest.approx(0.02)  # the start came along


def test_completions_clipped_from_step_0_are_not_a_lost_eos():
    """Issue 28: a toy TRL run clipped every completion from step 0 and was told at step 4
    that the student was losing its EOS: a level present from the start is not a trend."""
    assert not any(feed(TruncationCheck(), [1.0] * 200))
    assert not any(feed(TruncationCheck(), [0.95 + 0.05 * (i % 2) for i in range(200)]))


def test_the_eos_lost_mid_run_warns_against_the_students_own_start():
    out = feed(TruncationCheck(), [0.05] * 30 + [0.9] * 10)
    first = next(i for i, f in enumerate(out) if f)
    assert first == 32
    f = out[first][0]
    assert f.code == Code.STUDENT_TRUNCATION and f.severity is Severity.WARN
    assert f.values["start_median"] == pytest.approx(0.05) and "up from 5%" in f.message


def test_a_high_start_that_climbs_further_warns_and_one_that_holds_does_not():
    assert any(feed(TruncationCheck(), [0.6] * 30 + [1.0] * 10))
    assert not any(feed(TruncationCheck(), [0.6] * 30 + [0.65] * 10))


# ---------------------------------------------------------------- follow-ups of an open incident


def feed_incident(check, ratios, incident, incident_from):
    return [
        check.on_step_metrics(
            StepMetrics(
                i, {"truncated_ratio": r}, open_incident=incident if i >= incident_from else None
            ),
            RunSpec(),
        )
        for i, r in enumerate(ratios)
    ]


def follows(out):
    return [f for fs in out for f in fs if f.code == Code.STUDENT_FOLLOWS_DEAD_TEACHER]


def test_the_seed_runs_truncation_confirms_an_incident_open_at_step_0():
    ratios = [seed_truncation(t) for t in range(60)]
    out = feed_incident(TruncationCheck(), ratios, incident=0, incident_from=1)
    (f,) = follows(out)  # once per incident
    assert f.severity is Severity.CRITICAL and f.step <= 15  # long before the 0.5 limit
    assert f.values["baseline"] == pytest.approx(0.06) and f.values["open_incident"] == 0
    assert f.values["median_since"] - f.values["baseline"] >= f.values["bound"]
    assert "step 0" in f.message and "--enable-weights-cpu-backup" in f.message
    first_limit = next(
        i for i, fs in enumerate(out) if any(x.code == Code.STUDENT_TRUNCATION for x in fs)
    )
    assert f.step < first_limit
    assert not follows(feed(TruncationCheck(), ratios))  # never without an open incident


def test_a_mid_run_incident_is_judged_from_the_ratio_just_before_it():
    ratios = [0.04, 0.06, 0.03] * 100 + [min(1.0, 0.05 + 0.03 * t) for t in range(30)]
    out = feed_incident(TruncationCheck(), ratios, incident=300, incident_from=301)
    (f,) = follows(out)
    assert f.values["baseline"] == pytest.approx(0.04) and 300 < f.step <= 310


@pytest.mark.parametrize("burst", [1, 2])
def test_a_burst_under_an_open_incident_confirms_nothing(burst):
    ratios = [0.04] * 20 + [0.6] * burst + [0.04] * 20
    assert not follows(feed_incident(TruncationCheck(), ratios, incident=5, incident_from=6))
