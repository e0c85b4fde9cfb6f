"""EvalAccuracyCheck: accuracy losing half its best level (its first evaluation, or the best
median since) on most of the last evaluations; an open incident's follow-up confirms it."""

from __future__ import annotations

import json
import random

import pytest

from distill_guard.checks import EvalAccuracyCheck
from distill_guard.findings import Code, Severity
from distill_guard.observations import RunSpec, StepMetrics
from tests.checks._seed import SEED_EVALS


def feed(check, accs, incident=None, start=0):
    """One evaluation every 10 steps; ``open_incident=incident`` from step 1 on."""
    return [
        check.on_step_metrics(
            StepMetrics(
                10 * (start + i),
                {"eval_accuracy": a},
                open_incident=incident if 10 * (start + i) >= 1 else None,
            ),
            RunSpec(),
        )
        for i, a in enumerate(accs)
    ]


def codes(out):
    return [[f.code for f in fs] for fs in out]


def test_one_bad_evaluation_is_not_a_drop():
    rng = random.Random(0)
    accs = [0.35 + 0.002 * i + rng.gauss(0, 0.02) for i in range(40)]
    accs[20] = 0.0
    assert not any(feed(EvalAccuracyCheck(), accs))


@pytest.mark.parametrize("seed", range(5))
def test_a_healthy_noisy_rise_that_levels_off_is_left_alone(seed):
    rng = random.Random(seed)
    accs = [min(0.5, 0.3 + 0.01 * i) + rng.gauss(0, 0.03) for i in range(60)]
    assert not any(feed(EvalAccuracyCheck(), accs))


def test_the_seed_runs_evaluations_warn_by_the_third():
    """0.361, 0.011, 0.0: the median of the first three (the old reference) is 0.011, so a drop
    from it was never seen; against the first evaluation it is seen at the third."""
    out = feed(EvalAccuracyCheck(), list(SEED_EVALS.values()))
    assert codes(out)[:3] == [[], [], [Code.EVAL_ACCURACY_DROP]]
    f = out[2][0]
    assert f.severity is Severity.WARN
    assert f.values["reference_median"] == pytest.approx(0.361)
    assert f.values["window_median"] == pytest.approx(0.011)
    assert f.values["reference_median"] - f.values["window_median"] >= f.values["bound"]
    assert "0.361" in f.message and "0.011" in f.message


def test_the_failed_runs_fall_to_zero_is_a_warning():
    accs = [0.361, 0.36, 0.35, 0.2, 0.05, 0.011, 0.0, 0.0]
    out = feed(EvalAccuracyCheck(), accs)
    first = next(i for i, f in enumerate(out) if f)
    f = out[first][0]
    assert f.code == Code.EVAL_ACCURACY_DROP
    assert f.values["reference_median"] - f.values["window_median"] >= f.values["bound"]
    assert f"{f.values['window_median']:.3f}" in f.message


def test_a_mid_run_fall_is_judged_against_the_best_level_not_the_start():
    """Accuracy rose 0.3 → 0.6, then a dead teacher takes it to 0.25: still above half the start
    (0.3), but less than half the best level the run showed."""
    accs = [0.3 + 0.03 * i for i in range(11)] + [0.6] * 5 + [0.25] * 5
    out = feed(EvalAccuracyCheck(), accs)
    first = next(i for i, f in enumerate(out) if f)
    assert first == 16 + 1  # the second evaluation at 0.25 moves the median of three
    f = out[first][0]
    assert f.values["reference_median"] == pytest.approx(0.6)
    assert f.values["first_evaluation"] == pytest.approx(0.3)


def test_a_run_with_little_accuracy_to_lose_is_left_alone():
    assert not any(feed(EvalAccuracyCheck(), [0.04, 0.05, 0.04, 0.01, 0.0, 0.0]))


# ---------------------------------------------------------------- follow-ups of an open incident


def test_an_incident_open_at_step_0_is_confirmed_by_the_next_evaluation():
    out = feed(EvalAccuracyCheck(), list(SEED_EVALS.values()), incident=0)
    assert codes(out)[:2] == [[], [Code.STUDENT_FOLLOWS_DEAD_TEACHER]]
    f = out[1][0]
    assert f.severity is Severity.CRITICAL and f.step == 10
    assert f.values["open_incident"] == 0 and f.values["baseline"] == pytest.approx(0.361)
    assert f.values["bound"] == pytest.approx(0.25 * 0.361)
    for text in ("0.011", "0.361", "step 0", "--enable-weights-cpu-backup", "before step 0"):
        assert text in f.message
    later = [c for cs in codes(out)[2:] for c in cs]
    assert Code.STUDENT_FOLLOWS_DEAD_TEACHER not in later, "said once per incident"


def test_without_an_incident_no_follow_up_and_a_close_evaluation_confirms_nothing():
    assert Code.STUDENT_FOLLOWS_DEAD_TEACHER not in {
        c for cs in codes(feed(EvalAccuracyCheck(), list(SEED_EVALS.values()))) for c in cs
    }
    steady = feed(EvalAccuracyCheck(), [0.36, 0.33, 0.38, 0.35, 0.4], incident=0)
    assert not any(steady)  # within 25 % of the best level


# ---------------------------------------------------------------- resume


@pytest.mark.parametrize("cut", [1, 2, 3, 10])
def test_a_resume_keeps_the_first_and_best_levels(cut):
    accs = [0.3 + 0.03 * i for i in range(11)] + [0.6] * 5 + [0.25] * 5
    full = feed(EvalAccuracyCheck(), accs, incident=None)
    a = EvalAccuracyCheck()
    feed(a, accs[:cut])
    b = EvalAccuracyCheck()
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert b.level == a.level and b.state_dict() == a.state_dict()
    assert feed(b, accs[cut:], start=cut) == full[cut:]


def test_an_old_state_loads_its_warm_up_median_as_the_best_level():
    mid = EvalAccuracyCheck()
    mid.load_state_dict({"reference": {"median": None, "sigma": None, "pending": [0.4, 0.41]}})
    assert mid.level == 0.4
    done = EvalAccuracyCheck()
    done.load_state_dict(
        {"reference": {"median": 0.4, "sigma": 0.01, "pending": []}, "recent": {"values": []}}
    )
    assert done.level == 0.4
    assert codes(feed(done, [0.1, 0.1, 0.1], start=3))[-1] == [Code.EVAL_ACCURACY_DROP]
