"""What both kernel families share: Triton itself (the ``[gpu]`` extra, named when missing), the
online-softmax fold of one block, and ``[N, V]`` rows of unit stride."""

from __future__ import annotations

import torch

from distill_guard.extras import needed

with needed("the Triton signal kernels (backend='triton')", "gpu"):
    import triton
    import triton.language as tl


@triton.jit
def _block_update(m, s, x):
    """Fold one block into the running (max ``m``, sum ``s`` of exp(x - m)) of a row.

    The max is a scalar per block, so the rescale costs one exp per block, not per element:
    the kernels are bound by the exp unit long before memory on Hopper.
    """
    m_new = tl.maximum(m, tl.max(x, axis=0))
    safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2((m - safe) * 1.4426950408889634)
    p = tl.exp2((x - safe) * 1.4426950408889634)
    return m_new, s * alpha + tl.sum(p, axis=0), alpha, p


@triton.jit
def _lane_fold(m, s, w, x, c):
    """Fold a ``[ROWS, COLS]`` tile ``x`` of raw logits into each column lane's running max ``m``
    (raw), ``s = Σ 2^t`` and ``w = Σ 2^t·t``, ``t = (x − m)·c`` in log₂ units. ``t`` is clamped at
    −200 (2^−200 is 0 in float32) so a −inf logit adds 0, not NaN; a NaN logit stays NaN."""
    m_new = tl.maximum(m, tl.max(x, axis=0))
    safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    d = tl.where(m == float("-inf"), 0.0, (m - safe) * c)  # ≤ 0: the old max against the new
    alpha = tl.exp2(d)
    t = tl.maximum(x * c - (safe * c)[None, :], -200.0, propagate_nan=tl.PropagateNan.ALL)
    p = tl.exp2(t)
    w = alpha * (w + d * s) + tl.sum(p * t, axis=0)
    s = alpha * s + tl.sum(p, axis=0)
    return m_new, s, w, alpha, p


@triton.jit
def _lanes_merged(m, s, w, c):
    """A row's (max, Σ 2^t, Σ 2^t·t), ``t`` against the row's max, from its lanes'; and each
    lane's factor 2^((m_lane − max)·c), which merges any other per-lane sum of the same lane's
    exponentials (a KL end's cross term) the same way."""
    top = tl.max(m, axis=0)
    safe = tl.where(top == float("-inf"), 0.0, top)
    d = tl.where(m == float("-inf"), 0.0, (m - safe) * c)
    a = tl.exp2(d)
    return top, tl.sum(a * s, axis=0), tl.sum(a * (w + d * s), axis=0), a


@triton.jit
def _row_tile(base, start, n_cols, ROWS: tl.constexpr, COLS: tl.constexpr, MASKED: tl.constexpr):
    """Columns ``start + [0, ROWS·COLS)`` of one row as a float32 ``[ROWS, COLS]`` tile; with
    MASKED, −inf past the row's end (only a row's last tile needs the mask)."""
    cols = start + tl.arange(0, ROWS)[:, None] * COLS + tl.arange(0, COLS)[None, :]
    if MASKED:
        x = tl.load(base + cols, mask=cols < n_cols, other=float("-inf"))
    else:
        x = tl.load(base + cols)
    return x.to(tl.float32)


@triton.jit
def _row_fold(base, n_eff, n_cols, c, ROWS: tl.constexpr, COLS: tl.constexpr):
    """One row's (max, Σ 2^t, Σ 2^t·t) over its first ``n_eff`` columns, read as
    ``[ROWS, COLS]`` tiles with per-lane sums merged at the end: the entropy's one pass."""
    m = tl.full([COLS], float("-inf"), tl.float32)
    s = tl.zeros([COLS], tl.float32)
    w = tl.zeros([COLS], tl.float32)
    TILE: tl.constexpr = ROWS * COLS
    n_full = (n_eff // TILE) * TILE
    for start in range(0, n_full, TILE):  # whole tiles, unmasked
        m, s, w, _a, _p = _lane_fold(m, s, w, _row_tile(base, start, n_cols, ROWS, COLS, False), c)
    if n_full < n_eff:  # the row's last, partial tile
        m, s, w, _a, _p = _lane_fold(m, s, w, _row_tile(base, n_full, n_cols, ROWS, COLS, True), c)
    top, total, wt, _lane = _lanes_merged(m, s, w, c)
    return top, total, wt


@triton.jit
def _row_and_width(valid_ptr, n_cols, HAS_VALID: tl.constexpr):
    """This program's row, and how many of its columns it reads: none for a masked row."""
    row = tl.program_id(0).to(tl.int64)
    n_eff = n_cols
    if HAS_VALID:
        n_eff = tl.where(tl.load(valid_ptr + row) != 0, n_cols, 0)
    return row, n_eff


def _as_rows(x: torch.Tensor) -> torch.Tensor:
    x = x.reshape(-1, x.shape[-1])
    return x if x.stride(-1) == 1 else x.contiguous()
