"""TopKTruncationCheck: a clamp active at most tokens; the student's top-k mass draining."""

from __future__ import annotations

from distill_guard.checks import TopKTruncationCheck
from distill_guard.findings import Code
from distill_guard.observations import RunSpec, StepMetrics


def feed(check, role, values):
    return [
        check.on_step_metrics(StepMetrics(i, {role: v}), RunSpec()) for i, v in enumerate(values)
    ]


def test_a_clamp_active_at_most_tokens_warns_and_one_busy_step_does_not():
    out = feed(TopKTruncationCheck(), "topk_clamp_fraction", [0.05] * 10 + [0.89] * 5)
    first = next(i for i, f in enumerate(out) if f)
    assert first == 12 and out[first][0].code == Code.LOSS_TOPK_CLAMP
    spikes = [0.05] * 10 + [0.95] + [0.05] * 10
    assert not any(feed(TopKTruncationCheck(), "topk_clamp_fraction", spikes))


def test_student_mass_leaving_the_top_k_warns():
    mass = [0.92] * 30 + [0.92 - 0.02 * t for t in range(30)]
    out = feed(TopKTruncationCheck(), "student_topk_mass", mass)
    found = [f for fs in out for f in fs]
    assert found and found[0].code == Code.STUDENT_TOPK_MASS_FALLING
    assert found[0].values["reference_median"] - found[0].values["window_median"] >= 0.2
    assert not any(feed(TopKTruncationCheck(), "student_topk_mass", [0.9, 0.85, 0.93] * 40))
