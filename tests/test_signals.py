"""signals: the invariants, held against float64 references computed here."""

from __future__ import annotations

import math
from dataclasses import astuple

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from distill_guard import signals
from distill_guard.signals import (
    binary_entropy,
    entropy_from_logits,
    infer_uniform_vocab_size,
    jsd_ceiling,
    jsd_from_logits,
    reverse_kl_uniform_gap,
    teacher_logprob_stats,
    uniform_logprob,
)
from tests._reference import binary_entropy64, entropy64, jsd64, log_softmax64
from tests.conftest import LN_QWEN3_V, QWEN3_V


def _logits(seed: int, shape: tuple[int, ...], scale: float, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype)


# ---------------------------------------------------------------- uniform logprob, H(β), ceiling


@pytest.mark.parametrize("v", [2, 3, 1000, 32000, QWEN3_V, 154880])
def test_uniform_logprob_is_minus_ln_v(v):
    assert uniform_logprob(v) == pytest.approx(-np.log(np.float64(v)), abs=1e-12)
    # and the inverse recovers V, as a uniform response betrays the vocabulary size
    assert infer_uniform_vocab_size(uniform_logprob(v)) == v


def test_uniform_logprob_of_qwen3_matches_the_measured_value():
    assert uniform_logprob(QWEN3_V) == pytest.approx(-11.9312, abs=5e-5)


@pytest.mark.parametrize("v", [1, 0, -5])
def test_uniform_logprob_rejects_degenerate_vocab(v):
    with pytest.raises(ValueError, match="vocab_size"):
        uniform_logprob(v)


def test_jsd_ceiling_known_values():
    assert jsd_ceiling(0.5) == pytest.approx(math.log(2), abs=1e-12)
    assert jsd_ceiling(0.1) == pytest.approx(0.325, abs=5e-4)
    assert jsd_ceiling(0.1) == pytest.approx(binary_entropy64(0.1), abs=1e-12)
    assert jsd_ceiling(0.0) is None
    assert jsd_ceiling(1.0) is None
    assert binary_entropy(0.0) == 0.0 and binary_entropy(1.0) == 0.0


@pytest.mark.parametrize("beta", [-0.01, 1.01, float("inf")])
def test_jsd_ceiling_and_binary_entropy_reject_beta_outside_unit_interval(beta):
    with pytest.raises(ValueError, match="beta"):
        jsd_ceiling(beta)
    with pytest.raises(ValueError, match="beta"):
        binary_entropy(beta)


@given(st.floats(min_value=1e-9, max_value=1 - 1e-9))
def test_binary_entropy_matches_reference_is_symmetric_and_at_most_ln2(beta):
    ref = binary_entropy64(beta)
    assert binary_entropy(beta) == pytest.approx(ref, rel=1e-9, abs=1e-15)
    assert jsd_ceiling(beta) == pytest.approx(ref, rel=1e-9, abs=1e-15)
    assert jsd_ceiling(beta) == pytest.approx(jsd_ceiling(1.0 - beta), rel=1e-6, abs=1e-12)
    assert binary_entropy(beta) <= math.log(2) + 1e-15


# ---------------------------------------------------------------- entropy_from_logits


def test_entropy_of_uniform_logits_is_ln_v_and_of_one_hot_is_zero():
    z = torch.zeros(3, QWEN3_V)
    np.testing.assert_allclose(entropy_from_logits(z).numpy(), LN_QWEN3_V, rtol=1e-6)
    peaked = torch.full((2, 50), -1e4)
    peaked[:, 7] = 0.0
    np.testing.assert_allclose(entropy_from_logits(peaked).numpy(), 0.0, atol=1e-6)


@given(
    n=st.integers(1, 40),
    v=st.integers(2, 300),
    chunk_rows=st.sampled_from([1, 3, 7, 64, 10_000]),
    scale=st.floats(0.01, 20.0),
    seed=st.integers(0, 2**16),
)
def test_entropy_from_logits_matches_float64_reference(n, v, chunk_rows, scale, seed):
    z = _logits(seed, (n, v), scale)
    got = entropy_from_logits(z, chunk_rows=chunk_rows)
    assert got.dtype == torch.float32 and got.shape == (n,)
    np.testing.assert_allclose(got.numpy(), entropy64(z), rtol=1e-4, atol=2e-5)
    assert (got >= -1e-5).all() and (got <= math.log(v) + 1e-4).all()


@given(
    shape=st.tuples(st.integers(1, 5), st.integers(1, 7), st.integers(2, 64)),
    chunk_rows=st.sampled_from([1, 5, 1000]),
    seed=st.integers(0, 2**16),
)
def test_entropy_from_logits_bf16_and_3d(shape, chunk_rows, seed):
    z = _logits(seed, shape, 4.0, torch.bfloat16)
    got = entropy_from_logits(z, chunk_rows=chunk_rows)
    assert got.shape == shape[:-1] and got.dtype == torch.float32
    # reference on exactly the bf16 values the function saw
    np.testing.assert_allclose(got.numpy(), entropy64(z), rtol=1e-4, atol=2e-5)


def test_entropy_from_logits_with_masked_vocabulary_entries():
    """−inf logits (banned or padded vocabulary slots) carry zero mass and must not give NaN."""
    z = _logits(0, (6, 40), 3.0)
    z[:, :10] = -math.inf
    z[2, 30:] = -math.inf
    got = entropy_from_logits(z, chunk_rows=4)
    assert torch.isfinite(got).all()
    np.testing.assert_allclose(got.numpy(), entropy64(z), rtol=1e-4, atol=2e-5)


def test_entropy_from_logits_empty_and_bad_chunk():
    assert entropy_from_logits(torch.zeros(0, 10)).shape == (0,)
    with pytest.raises(ValueError, match="chunk_rows"):
        entropy_from_logits(torch.zeros(2, 10), chunk_rows=0)


def _recorder(fn):
    """Wrap a torch function or Tensor method; record the row count of every input it sees."""
    rows: list[int] = []

    def wrapper(x, *args, **kwargs):
        rows.append(x.reshape(-1, x.shape[-1]).shape[0] if x.dim() else 1)
        return fn(x, *args, **kwargs)

    return wrapper, rows


@pytest.mark.parametrize("chunk_rows", [1, 5, 13])
def test_entropy_from_logits_never_materialises_more_than_chunk_rows(monkeypatch, chunk_rows):
    """Peak memory stays at [chunk, V] blocks: every full-vocabulary op sees ≤ chunk_rows rows,
    and the bf16 → float32 cast happens per chunk, never on the whole batch."""
    n, v = 37, 50
    z = _logits(3, (n, v), 2.0, torch.bfloat16)
    softmax, softmax_rows = _recorder(torch.softmax)
    lse, lse_rows = _recorder(torch.logsumexp)
    cast, cast_rows = _recorder(torch.Tensor.float)
    monkeypatch.setattr(torch, "softmax", softmax)
    monkeypatch.setattr(torch, "logsumexp", lse)
    monkeypatch.setattr(torch.Tensor, "float", cast)
    got = entropy_from_logits(z, chunk_rows=chunk_rows)
    monkeypatch.undo()
    for rows in (softmax_rows, lse_rows, cast_rows):
        assert rows, "the recorder never saw a call: the test no longer watches the function"
        assert max(rows) <= chunk_rows
    assert sum(softmax_rows) == n  # every row was covered exactly once
    np.testing.assert_allclose(got.numpy(), entropy64(z), rtol=1e-4, atol=2e-5)


def test_jsd_from_logits_never_materialises_more_than_chunk_rows(monkeypatch):
    n, v, chunk_rows = 23, 30, 4
    s, t = _logits(1, (n, v), 2.0), _logits(2, (n, v), 2.0)
    log_softmax, rows = _recorder(torch.log_softmax)
    monkeypatch.setattr(torch, "log_softmax", log_softmax)
    got = jsd_from_logits(s, t, 0.5, chunk_rows=chunk_rows)
    monkeypatch.undo()
    assert rows and max(rows) <= chunk_rows
    assert sum(rows) == 2 * n
    np.testing.assert_allclose(got.numpy(), jsd64(s, t, 0.5), rtol=1e-4, atol=2e-6)


# ---------------------------------------------------------------- jsd_from_logits


@given(
    n=st.integers(1, 30),
    v=st.integers(2, 200),
    beta=st.floats(0.01, 0.99),
    chunk_rows=st.sampled_from([1, 3, 7, 10_000]),
    scale=st.floats(0.01, 15.0),
    seed=st.integers(0, 2**16),
)
def test_jsd_from_logits_matches_reference_and_respects_bounds(n, v, beta, chunk_rows, scale, seed):
    s, t = _logits(seed, (n, v), scale), _logits(seed + 1, (n, v), scale)
    got = jsd_from_logits(s, t, beta, chunk_rows=chunk_rows)
    ref = jsd64(s, t, beta)
    assert got.dtype == torch.float32 and got.shape == (n,)
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-4, atol=5e-6)
    assert (got >= -1e-6).all()
    assert (got <= binary_entropy64(beta) + 1e-5).all()
    # H(β) = H(1−β): swapping the sides and β gives the same divergence
    swapped = jsd_from_logits(t, s, 1.0 - beta, chunk_rows=chunk_rows)
    np.testing.assert_allclose(swapped.numpy(), got.numpy(), rtol=1e-4, atol=5e-6)


@given(
    shape=st.tuples(st.integers(1, 4), st.integers(1, 6), st.integers(2, 50)),
    beta=st.floats(0.05, 0.95),
    seed=st.integers(0, 2**16),
)
def test_jsd_is_zero_for_identical_inputs_also_bf16_3d(shape, beta, seed):
    z = _logits(seed, shape, 5.0, torch.bfloat16)
    got = jsd_from_logits(z, z.clone(), beta, chunk_rows=3)
    assert got.shape == shape[:-1]
    np.testing.assert_allclose(got.numpy(), 0.0, atol=1e-6)
    other = _logits(seed + 7, shape, 5.0, torch.bfloat16)
    np.testing.assert_allclose(
        jsd_from_logits(z, other, beta, chunk_rows=2).numpy(),
        jsd64(z, other, beta),
        rtol=1e-4,
        atol=5e-6,
    )


@pytest.mark.parametrize("beta", [0.5, 0.1])
def test_jsd_uniform_teacher_vs_peaked_student_is_at_the_ceiling(beta):
    """The failed run's step 0: ln 2 − O(K/V) at β = 0.5."""
    teacher = torch.zeros(2, QWEN3_V)
    student = torch.zeros(2, QWEN3_V)
    student[0, 17] = 60.0
    student[1, 99_999] = 60.0
    got = jsd_from_logits(student, teacher, beta)
    ceiling = binary_entropy64(beta)
    assert (got <= ceiling + 1e-5).all()
    np.testing.assert_allclose(got.numpy(), ceiling, atol=2e-3)
    np.testing.assert_allclose(got.numpy(), jsd64(student, teacher, beta), atol=1e-4)


def test_jsd_with_masked_vocabulary_entries_is_finite():
    s, t = _logits(4, (5, 30), 3.0), _logits(5, (5, 30), 3.0)
    s[:, :5] = -math.inf  # student bans some tokens
    t[:, 3:8] = -math.inf  # teacher bans others (overlapping)
    got = jsd_from_logits(s, t, 0.5, chunk_rows=2)
    assert torch.isfinite(got).all()
    np.testing.assert_allclose(got.numpy(), jsd64(s, t, 0.5), rtol=1e-4, atol=5e-6)


def test_jsd_rejects_shape_mismatch_and_bad_beta():
    with pytest.raises(ValueError, match="same shape"):
        jsd_from_logits(torch.zeros(2, 5), torch.zeros(2, 6))
    with pytest.raises(ValueError, match="beta"):
        jsd_from_logits(torch.zeros(2, 5), torch.zeros(2, 5), beta=1.5)


# ---------------------------------------------------------------- teacher_logprob_stats


def test_stats_of_uniform_token_logprobs():
    x = torch.full((500,), uniform_logprob(QWEN3_V))
    s = teacher_logprob_stats(x, QWEN3_V)
    assert s.count == 500 and s.nonfinite == 0
    assert s.mean == pytest.approx(-LN_QWEN3_V, abs=1e-5)
    assert s.spread == pytest.approx(0.0, abs=1e-6)
    assert s.uniform_fraction == 1.0
    assert math.isnan(s.row_flat_fraction)  # not defined for per-token input


def test_stats_of_uniform_topk_rows():
    x = torch.full((64, 16), uniform_logprob(QWEN3_V))
    s = teacher_logprob_stats(x, QWEN3_V)
    assert s.count == 64 * 16
    assert s.uniform_fraction == 1.0
    assert s.row_flat_fraction == 1.0
    assert s.top1_mean == pytest.approx(-LN_QWEN3_V, abs=1e-5)
    assert s.entropy_lower_bound == pytest.approx(LN_QWEN3_V, abs=1e-5)


@pytest.mark.parametrize("value", [0.0, -0.5, -3.0])
def test_peaked_teacher_repeating_a_value_is_not_uniform(value):
    """Zero spread alone is not collapse: the values must sit at −ln V."""
    s = teacher_logprob_stats(torch.full((200,), value), QWEN3_V)
    assert s.spread == pytest.approx(0.0, abs=1e-9)
    assert s.uniform_fraction == 0.0
    assert s.mean == pytest.approx(value)


def test_stats_count_nonfinite_and_summarise_only_finite_values():
    x = torch.tensor([-1.0, float("nan"), -2.0, float("inf"), -float("inf"), -4.0])
    s = teacher_logprob_stats(x, 1000)
    finite = np.array([-1.0, -2.0, -4.0])
    assert s.count == 6 and s.nonfinite == 3
    assert s.mean == pytest.approx(finite.mean())
    assert s.spread == pytest.approx(finite.std())
    assert (s.min, s.max) == (-4.0, -1.0)


def test_stats_all_nonfinite_are_nan_not_an_error():
    s = teacher_logprob_stats(torch.full((4,), float("nan")), 1000)
    assert s.count == 4 and s.nonfinite == 4
    assert math.isnan(s.mean) and math.isnan(s.uniform_fraction)


def test_stats_without_vocab_leave_uniform_fraction_undefined():
    assert math.isnan(teacher_logprob_stats(torch.full((3,), -2.0)).uniform_fraction)


def test_stats_mask_selects_positions_for_both_shapes(gen):
    tok = torch.randn(50, generator=gen) - 2
    topk = torch.randn(50, 4, generator=gen) - 2
    mask = torch.rand(50, generator=gen) > 0.4
    for x in (tok, topk):
        masked = teacher_logprob_stats(x, 1000, mask=mask)
        selected = teacher_logprob_stats(x[mask], 1000)
        np.testing.assert_equal(astuple(masked), astuple(selected))  # NaN == NaN here
    # masking out the uniform positions removes them from the fraction
    x = tok.clone()
    x[~mask] = uniform_logprob(1000)
    assert teacher_logprob_stats(x, 1000, mask=mask).uniform_fraction == 0.0
    assert teacher_logprob_stats(x, 1000).uniform_fraction == pytest.approx(
        float((~mask).double().mean())
    )


def test_stats_topk_row_flat_fraction_counts_finite_rows():
    g = torch.Generator().manual_seed(0)
    x = torch.log_softmax(torch.randn(10, 100, generator=g) * 3, -1).topk(8, -1).values
    x[[1, 4, 7]] = -7.0  # three flat rows
    x[9, 2] = float("nan")  # excluded from the row statistics
    s = teacher_logprob_stats(x, 1000)
    assert s.row_flat_fraction == pytest.approx(3 / 9)
    good = torch.cat([x[:9]]).double()
    assert s.top1_mean == pytest.approx(float(good.max(dim=1).values.mean()))


@given(
    n=st.integers(1, 30),
    k=st.integers(1, 8),
    seed=st.integers(0, 2**16),
    v=st.sampled_from([50, 1000, QWEN3_V]),
)
def test_stats_match_numpy_reference(n, k, seed, v):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, max(k, 2) * 4, generator=g) * 3
    x = torch.log_softmax(logits, -1).topk(k, -1).values
    x[torch.rand(n, generator=g) < 0.3] = uniform_logprob(v)
    s = teacher_logprob_stats(x, v)
    a = x.double().numpy()
    assert s.mean == pytest.approx(a.mean(), abs=1e-9)
    assert s.spread == pytest.approx(a.std(), abs=1e-9)
    assert s.top1_mean == pytest.approx(a.max(axis=1).mean(), abs=1e-9)
    assert s.uniform_fraction == pytest.approx(
        np.mean(np.abs(a + np.log(np.float64(v))) <= 1e-3), abs=1e-12
    )
    if k > 1:
        assert s.row_flat_fraction == pytest.approx(np.mean(np.ptp(a, axis=1) <= 1e-3))


def test_stats_reject_bad_shapes_and_masks():
    with pytest.raises(ValueError, match="shape"):
        teacher_logprob_stats(torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match="mask"):
        teacher_logprob_stats(torch.zeros(5), mask=torch.ones(4, dtype=torch.bool))


# ---------------------------------------------------------------- reverse-KL identity


@given(v=st.integers(2, 400), scale=st.floats(0.0, 20.0), seed=st.integers(0, 2**16))
def test_reverse_kl_against_uniform_plus_entropy_is_ln_v(v, scale, seed):
    """KL(s‖u) + H(s) = ln V for any student s, so the gap is zero."""
    ls = log_softmax64(_logits(seed, (v,), scale, torch.float64))
    p = np.exp(ls)
    kl_su = float(np.sum(np.where(p > 0, p * (ls + np.log(v)), 0.0)))
    h = float(-np.sum(np.where(p > 0, p * ls, 0.0)))
    assert reverse_kl_uniform_gap(kl_su, h, v) == pytest.approx(0.0, abs=1e-9)
    # for a non-uniform teacher t the gap is ln V − cross-entropy(s, t)
    lt = log_softmax64(_logits(seed + 1, (v,), 3.0, torch.float64))
    kl_st = float(np.sum(p * (ls - lt)))
    ce = float(-np.sum(p * lt))
    assert reverse_kl_uniform_gap(kl_st, h, v) == pytest.approx(np.log(v) - ce, abs=1e-9)


def test_module_default_chunk_is_bounded():
    # 256 × 151936 float32 ≈ 156 MB: the documented bound on one chunk
    assert signals.DEFAULT_CHUNK_ROWS * QWEN3_V * 4 <= 160e6
