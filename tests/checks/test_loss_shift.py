"""LossShiftCheck: a KL loss that multiplies over its warm-up level and stays there warns."""

from __future__ import annotations

import random

import pytest

from distill_guard.checks import LossShiftCheck
from distill_guard.findings import Code, Severity
from distill_guard.observations import LossKind, RunSpec, StepMetrics

KL = RunSpec(loss=LossKind.FORWARD_KL)


def feed(check, losses, run=KL):
    return [check.on_step_metrics(StepMetrics(i, {"loss": x}), run) for i, x in enumerate(losses)]


def healthy(n=400, seed=0):
    rng = random.Random(seed)
    return [0.3 * (0.5 + 0.5 * 0.99**t) * rng.lognormvariate(0, 0.1) for t in range(n)]


@pytest.mark.parametrize("size", [5.0, 100.0, 1e6])
def test_one_or_two_hard_batches_of_any_size_do_not_warn(size):
    losses = healthy()
    losses[200] = losses[260] = losses[261] = size
    assert not any(feed(LossShiftCheck(), losses))


def test_a_dead_teachers_jump_is_caught_within_three_steps():
    losses = healthy()
    k = 300
    losses[k:] = [15 * losses[k]] * (len(losses) - k)
    out = feed(LossShiftCheck(), losses)
    first = next(i for i, f in enumerate(out) if f)
    assert first - k == 2  # the median of five moves with the third value
    f = out[first][0]
    assert f.code == Code.LOSS_SHIFT and f.severity is Severity.WARN
    assert f.values["window_median"] >= f.values["bound"] > f.values["reference_median"]
    assert "forward_kl" in f.message


def test_off_for_a_jsd_whose_ceiling_test_is_exact():
    losses = [0.1 * x for x in healthy()]  # a healthy JSD of about 0.02
    losses[300:] = [0.69] * 100
    assert not any(feed(LossShiftCheck(), losses, RunSpec()))
    assert any(feed(LossShiftCheck(only_without_ceiling=False), losses, RunSpec()))


def test_a_jump_after_a_tenfold_decay_is_caught_against_the_recent_level():
    """The warm-up level is 10× the loss at the failure: the jump is measured against the
    median of 20 steps before, not only against the warm-up."""
    losses = [0.5 * 0.98**t for t in range(300)]  # decays to ~0.001
    k = 250
    losses[k:] = [10 * losses[k]] * 50  # 10× the recent level, still below the warm-up's
    out = feed(LossShiftCheck(), losses)
    first = next(i for i, f in enumerate(out) if f)
    assert first - k == 2
    assert "steps ago" in out[first][0].message
