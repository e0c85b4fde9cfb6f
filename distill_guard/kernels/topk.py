"""The student's side of the top-K teacher loss on GPU, for :mod:`distill_guard.linear_loss`.

Why: against a teacher known on K ids per row, the loss needs of the student's ``[C, V]`` float32
logits only its log-normaliser, its entropy and its probabilities scaled per row (the JSD's tail,
the forward KL's p_s), the K ids' entries being small ``[C, K]`` work. In PyTorch ops that is
eight passes over the chunk and a float32 copy of it; here it is one read for the statistics and
one read and one write for the gradient rows, over sub-rows (``V/S`` columns) so that a chunk of a
few hundred rows fills the GPU.
"""

from __future__ import annotations

import math

import torch

from distill_guard.errors import GuardValueError
from distill_guard.kernels.fused_loss import (
    PASS_BLOCK,
    PASS_NUM_WARPS,
    STATS_NUM_WARPS,
    STATS_TILE_COLS,
)
from distill_guard.kernels.shared import (
    _row_fold,
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
    S: tl.constexpr,
    ROWS: tl.constexpr,
    COLS: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)  # the sub-row; its row is row // S
    n_eff = tl.where(tl.load(valid_ptr + row // S) != 0, n_cols, 0)  # masked rows read nothing
    base = x_ptr + row * stride_x
    top, total, wt = _row_fold(base, n_eff, n_cols, inv_temp * 1.4426950408889634, ROWS, COLS)
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


@triton.jit
def _topk_rows_kernel(
    x_ptr,
    ids_ptr,
    lp_ptr,
    sub_ptr,
    valid_ptr,
    w_ptr,
    stats_ptr,
    scale_ptr,
    gk_ptr,
    n_rows,
    n_sub,
    k,
    stride_x,
    stride_ids,
    stride_lp,
    inv_temp,
    beta,
    tail,
    S: tl.constexpr,
    MODE: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    # the student's log-normaliser and entropy from its row's S sub-rows
    lse_i = tl.load(sub_ptr + row * S + tl.arange(0, S))
    h_i = tl.load(sub_ptr + n_sub + row * S + tl.arange(0, S))
    top = tl.max(lse_i, axis=0)
    safe = tl.where(top == float("-inf"), 0.0, top)
    mass = tl.exp(lse_i - safe)
    lse_s = safe + tl.log(tl.sum(mass, axis=0))
    share = mass / tl.sum(mass, axis=0)  # each sub-row's share of the row's mass
    h_s = lse_s - tl.sum(tl.where(share == 0, 0.0, share * (lse_i - h_i)), axis=0)
    # the K ids: the student's log-probabilities there, the teacher's renormalised at 1/inv_temp
    kk = tl.arange(0, BLOCK_K)
    km = kk < k
    ids = tl.load(ids_ptr + row * stride_ids + kk, mask=km, other=0)
    ls = tl.load(x_ptr + row * stride_x + ids, mask=km, other=float("-inf")) * inv_temp - lse_s
    ps = tl.exp(ls)  # 0 past K
    lp = tl.load(lp_ptr + row * stride_lp + kk, mask=km, other=float("-inf"))
    yt = lp * inv_temp
    mt = tl.max(yt, axis=0)
    lt = yt - (mt + tl.log(tl.sum(tl.exp(yt - mt), axis=0)))
    pt = tl.exp(lt)
    h_t = -tl.sum(tl.where(pt == 0, 0.0, pt * lt), axis=0)
    if MODE == 0:  # the JSD, its tail (no teacher mass: log(p_s/m) = tail) in closed form
        lm = tl.log((1.0 - beta) * ps + beta * pt)
        kl_s = tl.sum(tl.where(ps == 0, 0.0, ps * (ls - lm)), axis=0)
        kl_s += tl.maximum(1.0 - tl.sum(ps, axis=0), 0.0) * tail
        kl_t = tl.sum(tl.where(pt == 0, 0.0, pt * (lt - lm)), axis=0)
        loss = (1.0 - beta) * kl_s + beta * kl_t
        aux = kl_s
        factor = tail - kl_s  # ∂/∂x_j off the K ids: p_j·(tail − KL(s‖m))
        g = tl.where(ps == 0, 0.0, ps * (ls - lm - kl_s))
    else:  # the forward KL(t‖s); ∂/∂x = p_s − p_t
        loss = tl.sum(tl.where(pt == 0, 0.0, pt * (lt - ls)), axis=0)
        aux = loss
        factor = 1.0
        g = ps - pt
    keep = tl.load(valid_ptr + row) != 0
    w = tl.load(w_ptr + row)
    tl.store(scale_ptr + row, tl.where(keep, w * factor, 0.0))
    g = tl.where(keep, w * g, 0.0)  # a masked row's entries are 0, whatever its logits hold
    tl.store(gk_ptr + row * k + kk, g.to(gk_ptr.dtype.element_ty), mask=km)
    out = stats_ptr + row
    tl.store(out + 0 * n_rows, lse_s)
    tl.store(out + 1 * n_rows, float("nan"))  # the teacher's lse: not known from its top-K
    tl.store(out + 2 * n_rows, h_s)
    tl.store(out + 3 * n_rows, h_t)
    tl.store(out + 4 * n_rows, tl.max(lp, axis=0))  # the largest logprob as given
    tl.store(out + 5 * n_rows, loss)
    tl.store(out + 6 * n_rows, aux)


def triton_topk_chunk(
    logits: torch.Tensor,
    logprobs: torch.Tensor,
    ids: torch.Tensor,
    valid: torch.Tensor,
    weight: torch.Tensor,
    *,
    inv_temp: float,
    beta: float,
    mode: int,
    splits: int,
    out: torch.Tensor | None,
) -> torch.Tensor:
    """``[7, C]`` statistics of float32 logits rows ``[C, V]`` against a teacher known on its
    K ids per row (``logprobs``, ``ids``: ``[C, K]``), the JSD (mode 0) or forward KL (mode 1);
    ``weight[r]`` times the gradient rows into ``out``, if given (masked rows zeroed).

    Three launches and a scatter: the student's (lse, entropy) per sub-row, one read; per row
    its K ids' part of the loss, the merged statistics and the factor of p_s off the K ids; the
    rows ``factor·p_s``, one read and one write; the K ids' entries scattered over them.
    """
    c, v = logits.shape
    if v % splits:
        raise GuardValueError(f"splits = {splits} does not divide V = {v}")
    k = ids.shape[1]
    ids, logprobs = ids.contiguous(), logprobs.float().contiguous()
    x = logits.contiguous()
    xs = x.view(c * splits, v // splits)
    keep = valid.view(torch.int8) if valid.dtype == torch.bool else valid.to(torch.int8)
    w = weight.float().contiguous()
    sub = torch.empty(2, c * splits, dtype=torch.float32, device=x.device)
    stats = torch.empty(7, c, dtype=torch.float32, device=x.device)
    scale = torch.empty(c, dtype=torch.float32, device=x.device)
    gk = torch.empty(c, k, dtype=torch.float32 if out is None else out.dtype, device=x.device)
    if not c:
        return stats
    # per sub-row x_i: lse_i = logsumexp(x_i·inv_temp), H_i its softmax's entropy
    _lse_entropy_kernel[(c * splits,)](
        x_ptr=xs, valid_ptr=keep, out_ptr=sub, n_rows=c * splits, n_cols=v // splits,
        stride_x=xs.stride(0), inv_temp=inv_temp,
        S=splits, ROWS=SUB_ROW_TILE_ROWS, COLS=STATS_TILE_COLS, num_warps=STATS_NUM_WARPS,
    )  # fmt: skip
    # per row: p_s = softmax(x·inv_temp), p_t = softmax(logprobs·inv_temp) on the K ids; the
    # JSD with m = (1−β)·p_s + β·p_t, its tail Σ_{j∉K} p_s,j·log((p_s,j)/m_j) = (1 − Σ_K p_s)·tail,
    # tail = −log(1−β); or KL(p_t‖p_s); the gradient's factor off the K ids and its K entries
    _topk_rows_kernel[(c,)](
        x_ptr=x, ids_ptr=ids, lp_ptr=logprobs, sub_ptr=sub, valid_ptr=keep, w_ptr=w,
        stats_ptr=stats, scale_ptr=scale, gk_ptr=gk, n_rows=c, n_sub=c * splits, k=k,
        stride_x=x.stride(0), stride_ids=ids.stride(0), stride_lp=logprobs.stride(0),
        inv_temp=inv_temp, beta=beta, tail=-math.log1p(-beta) if mode == 0 else 0.0,
        S=splits, MODE=mode, BLOCK_K=triton.next_power_of_2(k),
    )  # fmt: skip
    if out is None:
        return stats
    g = out.view(c * splits, v // splits)
    # per sub-row: scale[r]·p_s, a row of scale 0 zeroed unread
    _scaled_probs_kernel[(c * splits,)](
        x_ptr=xs, g_ptr=g, lse_ptr=stats[0], scale_ptr=scale,
        n_cols=v // splits, stride_x=xs.stride(0), stride_g=g.stride(0), inv_temp=inv_temp,
        S=splits, BLOCK=PASS_BLOCK, num_warps=PASS_NUM_WARPS,
    )  # fmt: skip
    out.scatter_(1, ids, gk)
    return stats
