"""EvalAccuracyCheck: accuracy losing half its early level on most of the last evaluations."""

from __future__ import annotations

import random

from distill_guard.checks import EvalAccuracyCheck
from distill_guard.findings import Code
from distill_guard.observations import RunSpec, StepMetrics


def feed(check, accs):
    return [
        check.on_step_metrics(StepMetrics(10 * i, {"eval_accuracy": a}), RunSpec())
        for i, a in enumerate(accs)
    ]


def test_one_bad_evaluation_is_not_a_drop():
    rng = random.Random(0)
    accs = [0.35 + 0.002 * i + rng.gauss(0, 0.02) for i in range(40)]
    accs[20] = 0.0
    assert not any(feed(EvalAccuracyCheck(), accs))


def test_the_failed_runs_fall_to_zero_is_a_warning():
    accs = [0.361, 0.36, 0.35, 0.2, 0.05, 0.011, 0.0, 0.0]
    out = feed(EvalAccuracyCheck(), accs)
    first = next(i for i, f in enumerate(out) if f)
    f = out[first][0]
    assert f.code == Code.EVAL_ACCURACY_DROP
    assert f.values["reference_median"] - f.values["window_median"] >= f.values["bound"]
    assert f"{f.values['window_median']:.3f}" in f.message


def test_a_run_with_little_accuracy_to_lose_is_left_alone():
    assert not any(feed(EvalAccuracyCheck(), [0.04, 0.05, 0.04, 0.01, 0.0, 0.0]))
