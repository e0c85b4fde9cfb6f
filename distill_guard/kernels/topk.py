"""The student's side of the top-K teacher loss on GPU, for :mod:`distill_guard.linear_loss`.

Why: against a teacher known on K ids per row, the loss needs of the student's ``[C, V]`` float32
logits only its log-normaliser, its entropy and its probabilities scaled per row (the JSD's tail,
the forward KL's p_s), the K ids' entries being small ``[C, K]`` work. In PyTorch ops that is
eight passes over the chunk and a float32 copy of it; here it is one read for the statistics and
one read and one write for the gradient rows, over sub-rows (``V/S`` columns) so that a chunk of a
few hundred rows fills the GPU.
"""

from __future__ import annotations

import torch

from distill_guard.errors import GuardValueError
from distill_guard.kernels.fused_loss import (
    PASS_BLOCK,
    PASS_NUM_WARPS,
    STATS_NUM_WARPS,
    STATS_TILE_COLS,
)
from distill_guard.kernels.shared import (
    _lane_fold,
    _lanes_merged,
    _row_and_width,
    _row_tile,
    tl,
    triton,
)
from distill_guard.kernels.split_rows import SUB_ROW_TILE_ROWS


@triton.jit
def _lse_entropy_kernel(
    x_ptr,
    valid_ptr,
    out_ptr,
    n_rows,
    n_cols,
    stride_x,
    inv_temp,
    ROWS: tl.constexpr,
    COLS: tl.constexpr,
):
    row, n_eff = _row_and_width(valid_ptr, n_cols, True)  # masked rows read nothing
    base = x_ptr + row * stride_x
    c = inv_temp * 1.4426950408889634
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
    lse = tl.where(top == float("-inf"), 0.0, top) * inv_temp + tl.log(total)
    tl.store(out_ptr + row, lse)
    tl.store(out_ptr + n_rows + row, tl.log(total) - wt / total * 0.6931471805599453)


@triton.jit
def _scaled_probs_kernel(
    x_ptr,
    g_ptr,
    lse_ptr,
    scale_ptr,
    n_cols,
    stride_x,
    stride_g,
    inv_temp,
    S: tl.constexpr,
    BLOCK: tl.constexpr,
):
    p = tl.program_id(0).to(tl.int64)  # the sub-row; its row is p // S
    row = p // S
    scale = tl.load(scale_ptr + row)
    n_eff = tl.where(scale != 0, n_cols, 0)  # a row of scale 0 (masked) is only zeroed
    c = inv_temp * 1.4426950408889634
    lse = tl.load(lse_ptr + row) * 1.4426950408889634
    x_base = x_ptr + p * stride_x
    g_base = g_ptr + p * stride_g
    for start in range(0, n_eff, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_base + cols, mask=mask, other=float("-inf")).to(tl.float32)
        g = scale * tl.exp2(x * c - lse)
        tl.store(g_base + cols, g.to(g_ptr.dtype.element_ty), mask=mask)
    for start in range(0, n_cols - n_eff, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        tl.store(g_base + cols, tl.zeros([BLOCK], g_ptr.dtype.element_ty), mask=cols < n_cols)


def triton_lse_entropy(
    logits: torch.Tensor, valid: torch.Tensor, inv_temp: float, splits: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logsumexp, entropy) of each ``[C, V]`` row of ``logits * inv_temp``, float32, one read,
    the rows read as ``splits`` sub-rows and merged; rows where ``valid`` is False are not read
    (their entries are meaningless)."""
    c, v = logits.shape
    if v % splits:
        raise GuardValueError(f"splits = {splits} does not divide V = {v}")
    x = logits.contiguous().view(c * splits, v // splits)
    sub = torch.empty(2, c * splits, dtype=torch.float32, device=x.device)
    if c:
        # per sub-row x_i: lse_i = logsumexp(x_i·inv_temp), H_i its softmax's entropy
        _lse_entropy_kernel[(c * splits,)](
            x_ptr=x, valid_ptr=valid.to(torch.int8).repeat_interleave(splits), out_ptr=sub,
            n_rows=c * splits, n_cols=v // splits, stride_x=x.stride(0), inv_temp=inv_temp,
            ROWS=SUB_ROW_TILE_ROWS, COLS=STATS_TILE_COLS, num_warps=STATS_NUM_WARPS,
        )  # fmt: skip
    lse_i, h_i = sub.view(2, c, splits)
    lse = torch.logsumexp(lse_i, 1)
    share = (lse_i - lse[:, None]).exp()  # each sub-row's share of its row's mass
    # H = lse − E[x] = lse − Σ_i share_i·(lse_i − H_i)
    return lse, lse - torch.where(share == 0, 0.0, share * (lse_i - h_i)).sum(1)


def triton_scaled_probs(
    logits: torch.Tensor,
    lse: torch.Tensor,
    scale: torch.Tensor,
    inv_temp: float,
    splits: int,
    out: torch.Tensor,
) -> torch.Tensor:
    """``out[r] = scale[r]·softmax(logits[r]·inv_temp)`` given its log-normaliser ``lse[r]``,
    formed in float32 and rounded once to ``out``'s dtype; a row of scale 0 is zeroed unread."""
    c, v = logits.shape
    if v % splits:
        raise GuardValueError(f"splits = {splits} does not divide V = {v}")
    x = logits.contiguous().view(c * splits, v // splits)
    g = out.view(c * splits, v // splits)
    if c:
        _scaled_probs_kernel[(c * splits,)](
            x_ptr=x, g_ptr=g, lse_ptr=lse.float().contiguous(),
            scale_ptr=scale.float().contiguous(),
            n_cols=v // splits, stride_x=x.stride(0), stride_g=g.stride(0), inv_temp=inv_temp,
            S=splits, BLOCK=PASS_BLOCK, num_warps=PASS_NUM_WARPS,
        )  # fmt: skip
    return out
