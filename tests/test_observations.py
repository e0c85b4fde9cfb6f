"""RunSpec and StepMetrics: the facts of the run, validated when set."""

from __future__ import annotations

import math

import pytest

from distill_guard.observations import LossKind, RunSpec, StepMetrics
from tests._reference import binary_entropy64


def test_loss_ceiling_and_log_vocab():
    assert RunSpec(beta=0.1).loss_ceiling == pytest.approx(binary_entropy64(0.1))
    assert RunSpec(loss=LossKind.REVERSE_KL).loss_ceiling is None
    assert RunSpec(beta=1.0).loss_ceiling is None
    assert RunSpec(vocab_size=151936).log_vocab == pytest.approx(math.log(151936))
    assert RunSpec().log_vocab is None


def test_loss_kind_by_value():
    assert RunSpec(loss="reverse_kl").loss is LossKind.REVERSE_KL


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"vocab_size": 1}, "vocab_size"),
        ({"beta": 1.5}, "beta"),
        ({"beta": -0.1}, "beta"),
        ({"loss_scale": 0.0}, "loss_scale"),
        ({"loss_scale": -1.0}, "loss_scale"),
        ({"loss": "kl"}, "loss"),
    ],
)
def test_bad_values_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        RunSpec(**kwargs)


def test_step_metrics_get():
    m = StepMetrics(0, {"loss": 1, "x": None})
    assert m.get("loss") == 1.0 and isinstance(m.get("loss"), float)
    assert m.get("x") is None and m.get("missing") is None
