"""CanaryCheck's judgement alone: pure, no teacher. The live canary is in tests/live/test_canary.py."""

from __future__ import annotations

import math

import pytest

from distill_guard.checks.canary import CanaryCheck, CanaryMeasurement
from distill_guard.findings import Code, Severity

V = 1000
U = -math.log(V)


def measured(token: list[float], top: list[list[float]] | None = None, step=1) -> CanaryMeasurement:
    tokens = list(range(len(token) + 1))
    return CanaryMeasurement(tokens, token, top, None, step=step)


def test_uniform_measurement_is_caught_with_the_bound_and_the_fix():
    found, cmp = CanaryCheck().judge(
        measured([U] * 8, [[U] * 4] * 8), None, vocab_size=V, deterministic=False
    )
    assert [f.code for f in found] == [Code.TEACHER_UNIFORM]
    assert found[0].severity is Severity.CRITICAL and found[0].step == 1
    assert (
        "−ln V = -6.90776" in found[0].message and "--enable-weights-cpu-backup" in found[0].message
    )
    assert cmp.uniform and cmp.vocab_size == V and not cmp.vocab_inferred


def test_v_is_inferred_from_a_flat_response_and_reported_as_such():
    found, cmp = CanaryCheck().judge(
        measured([U] * 8, [[U] * 4] * 8), None, vocab_size=None, deterministic=False
    )
    assert [f.code for f in found] == [Code.TEACHER_UNIFORM]
    assert cmp.vocab_inferred and cmp.vocab_size == V
    assert "inferred from the response" in found[0].message


def test_a_moved_measurement_is_a_mismatch_against_the_reference():
    ref = measured([-1.0] * 8, [[-1.0, -2.0]] * 8, step=0)
    moved = measured([-3.0] * 8, [[-1.0, -2.0]] * 8)
    found, cmp = CanaryCheck().judge(moved, ref, vocab_size=V, deterministic=False)
    assert [f.code for f in found] == [Code.TEACHER_FINGERPRINT_MISMATCH]
    assert cmp.mean_abs_delta == pytest.approx(2.0) and found[0].values["fingerprint_step"] == 0


def test_noise_within_tolerance_passes_unless_deterministic():
    ref = measured([-1.0] * 8, None, step=0)
    noisy = measured([-1.01] * 8, None)
    check = CanaryCheck(top_k=0)
    assert check.judge(noisy, ref, vocab_size=V, deterministic=False)[0] == []
    strict, _ = check.judge(noisy, ref, vocab_size=V, deterministic=True)
    assert [f.code for f in strict] == [Code.TEACHER_FINGERPRINT_MISMATCH]


def test_nonfinite_values_are_their_own_finding_and_no_delta_is_taken():
    ref = measured([-1.0] * 4, None, step=0)
    found, cmp = CanaryCheck(top_k=0).judge(
        measured([-1.0, math.nan, -1.0, -math.inf]), ref, vocab_size=V, deterministic=False
    )
    assert [f.code for f in found] == [Code.TEACHER_NONFINITE] and cmp.nonfinite == 2
    assert cmp.max_abs_delta is None


def test_a_reference_of_other_tokens_is_not_compared():
    ref = CanaryMeasurement([9] * 9, [-1.0] * 8, None, None, step=0)
    found, cmp = CanaryCheck(top_k=0).judge(
        measured([-5.0] * 8), ref, vocab_size=V, deterministic=False
    )
    assert found == [] and cmp.max_abs_delta is None


def test_drawn_tokens_are_seeded_and_below_v():
    a, b = CanaryCheck(seed=3).draw_tokens(50), CanaryCheck(seed=3).draw_tokens(50)
    assert a == b and len(a) == 64 and max(a) < 50
    assert max(CanaryCheck().draw_tokens(None)) < 256  # V unknown: byte-token range
    assert CanaryCheck(tokens=[5, 6]).draw_tokens(V) == [5, 6]
    with pytest.raises(ValueError, match="at least 2 tokens"):
        CanaryCheck(tokens=[5]).draw_tokens(V)


@pytest.mark.parametrize(
    ("token", "top"),
    [([0.7] * 8, None), ([-1.0] * 8, [[-0.2, -0.3, -0.4]] * 8)],
    ids=["a positive logprob", "a top-k row summing past 1"],
)
def test_a_canary_answer_no_distribution_gives_is_critical(token, top) -> None:
    """The canary's answer is not log-probabilities (logits, a sign flipped, something else
    answering at the teacher's URL): critical, never a healthy wake."""
    measured = CanaryMeasurement(list(range(9)), token, top, None, step=1)
    findings, _ = CanaryCheck().judge(measured, None, vocab_size=1000, deterministic=False)
    assert [f.code for f in findings] == [Code.TEACHER_IMPOSSIBLE]
    assert findings[0].severity is Severity.CRITICAL
