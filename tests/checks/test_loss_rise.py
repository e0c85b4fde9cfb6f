"""LossRiseCheck: a per-token loss that multiplies over the student's own start and holds warns,
below a JSD's ceiling too, and blames the side the teacher's evidence points to."""

from __future__ import annotations

import json
import math
import random

import pytest

from distill_guard.checks import LossRiseCheck
from distill_guard.findings import Code, Severity
from distill_guard.observations import LossKind, RunSpec, StepMetrics
from tests.checks._seed import seed_loss

JSD = RunSpec()
KL = RunSpec(loss=LossKind.FORWARD_KL)


def feed(check, losses, run=JSD, healthy=True, start=0):
    return [
        check.on_step_metrics(StepMetrics(start + i, {"loss": x}, healthy), run)
        for i, x in enumerate(losses)
    ]


def first(out):
    return next((i for i, fs in enumerate(out) if fs), None)


def lr_too_high(n=60, seed=0, sd=0.05, start=0.03, end=0.23, over=20):
    """A learning rate 30× too high: 0.03 at the start, 0.23 after ``over`` steps, then held."""
    rng = random.Random(seed)
    return [
        start * (end / start) ** (min(t, over) / over) * rng.lognormvariate(0, sd) for t in range(n)
    ]


def healthy(n=2000, seed=0, sd=0.1, warmup=0):
    """A decaying loss under a learning-rate warm-up of ``warmup`` steps, lognormal noise."""
    rng = random.Random(seed)
    lr_sum, out = 0.0, []
    for t in range(n):
        lr_sum += min(1.0, (t + 1) / warmup) if warmup else 1.0
        out.append((0.02 + 0.06 * math.exp(-lr_sum / 300)) * rng.lognormvariate(0, sd))
    return out


@pytest.mark.parametrize("run", [JSD, KL], ids=["jsd", "forward_kl"])
@pytest.mark.parametrize("seed", range(3))
def test_a_learning_rate_far_too_high_from_step_0_is_caught(run, seed):
    out = feed(LossRiseCheck(), lr_too_high(seed=seed), run)
    i = first(out)
    assert i is not None and i <= 16  # 3× the start at step 11, the median two steps later
    (f,) = out[i]
    assert f.code == Code.LOSS_RISE and f.severity is Severity.WARN
    assert f.values["window_median"] >= f.values["bound"] >= 3 * f.values["reference_median"]
    assert f.values["reference_median"] == pytest.approx(0.03, rel=0.2)
    assert "learning rate far too high" in f.message and "Reloading the teacher" in f.message
    assert f"{f.values['window_median']:.4g}" in f.message
    assert run.loss.value in f.message


def test_a_rise_mid_run_is_judged_against_the_start():
    """Healthy from 0.08 down to 0.03 for 300 steps, then the learning rate is raised 30×: the
    loss climbs to 0.4, 5× the start, still below ln 2."""
    rng = random.Random(1)
    rise = [
        0.03 * (0.4 / 0.03) ** (min(t, 20) / 20) * rng.lognormvariate(0, 0.05) for t in range(40)
    ]
    out = feed(LossRiseCheck(), healthy(300) + rise)
    i = first(out)
    assert not any(out[:300])
    assert i is not None and 300 + 10 <= i <= 300 + 20
    assert out[i][0].values["reference_median"] == pytest.approx(0.08, rel=0.15)


@pytest.mark.parametrize(
    "healthy_flag,says",
    [
        (True, "the student is leaving its teacher"),
        (None, "to tell the two causes apart"),
    ],
)
def test_the_blame_follows_the_teachers_evidence(healthy_flag, says):
    """(A flagged teacher's steps are not the student's: see the test after the next.)"""
    out = feed(LossRiseCheck(), lr_too_high(), healthy=healthy_flag)
    f = out[first(out)][0]
    assert says in f.message and f.values["teacher_healthy"] is healthy_flag
    if healthy_flag is None:
        assert "learning rate" in f.message and "teacher's logprobs" in f.message


@pytest.mark.parametrize("warmup", [0, 20, 200])
@pytest.mark.parametrize("sd", [0.02, 0.15])
@pytest.mark.parametrize("seed", range(3))
def test_healthy_losses_under_any_warm_up_and_noise_are_silent(seed, sd, warmup):
    assert not any(feed(LossRiseCheck(), healthy(seed=seed, sd=sd, warmup=warmup)))


@pytest.mark.parametrize("size", [2.0, 10.0])
def test_isolated_spikes_of_one_step_are_silent(size):
    losses = healthy(1000)
    for i in range(60, 1000, 37):
        losses[i] *= size
    losses[0] *= size  # at the start too: the start is the median of three
    assert not any(feed(LossRiseCheck(), losses))


def test_a_falling_loss_is_silent_and_so_is_the_seed_runs():
    assert not any(feed(LossRiseCheck(), [0.3 * 0.98**t for t in range(300)]))
    assert not any(feed(LossRiseCheck(), [seed_loss(t) for t in range(190)], healthy=None))


def test_a_loss_at_the_ceiling_is_left_to_the_ceiling_check():
    losses = [0.03] * 20 + [0.69] * 20
    assert not any(feed(LossRiseCheck(), losses, healthy=None))
    below = [0.03] * 20 + [0.5] * 20  # a student leaving a healthy teacher, below ln 2
    assert any(feed(LossRiseCheck(), below))
    assert any(feed(LossRiseCheck(), losses, KL))  # no ceiling: judged


def test_a_tiny_loss_that_triples_is_not_a_rise_and_the_scale_is_undone():
    assert not any(feed(LossRiseCheck(), [1e-4] * 5 + [3e-3] * 20))
    scaled = RunSpec(loss_scale=4.0)
    out = feed(LossRiseCheck(), [4 * x for x in lr_too_high()], scaled)
    f = out[first(out)][0]
    assert f.values["reference_median"] == pytest.approx(0.03, rel=0.2)


@pytest.mark.parametrize("cut", [1, 2, 3, 8])
def test_a_resume_keeps_the_start(cut):
    losses = lr_too_high()
    full = feed(LossRiseCheck(), losses)
    a = LossRiseCheck()
    feed(a, losses[:cut])
    b = LossRiseCheck()
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert b.state_dict() == a.state_dict()
    assert feed(b, losses[cut:], start=cut) == full[cut:]
    fresh = LossRiseCheck()
    fresh.load_state_dict({})  # a run resumed from a state before this check: starts anew
    assert fresh.state_dict() == LossRiseCheck().state_dict()


def test_a_step_whose_teacher_is_flagged_is_no_value_of_the_students():
    """The loss against a flagged teacher is the teacher's (already a finding): after three such
    steps the window holds none of them, and the healthy steps that follow raise nothing."""
    from distill_guard.checks.loss_rise import LossRiseCheck
    from distill_guard.observations import RunSpec, StepMetrics

    check, run = LossRiseCheck(), RunSpec()
    found = []
    for step in range(12):
        dead = 3 <= step < 6
        metrics = StepMetrics(step, {"loss": 0.6 if dead else 0.02}, not dead)
        found += check.on_step_metrics(metrics, run)
    assert found == []
