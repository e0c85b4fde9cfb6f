"""The fused loss's passes over rows split into ``S`` sub-rows, for :mod:`distill_guard.linear_loss`.

Why: a chunk of a few hundred float32 logits rows gives the one-program-per-row kernels of
:mod:`distill_guard.kernels.fused_loss` too few programs to draw the bandwidth. Here each program
reads one sub-row (``V/S`` columns of one row) and merges its row's ``S`` partial statistics
itself (a log-sum-exp over ``S`` values), so a chunk is three launches with no merge between
them. The statistics pass is :func:`~distill_guard.kernels.fused_loss._loss_stats_kernel` on the
``[C·S, V/S]`` view; the partials of every sub-row of the call live in one ``[7, N·S]`` buffer.
"""

from __future__ import annotations

import torch

from distill_guard.kernels.fused_loss import (
    PASS_BLOCK,
    PASS_NUM_WARPS,
    STATS_NUM_WARPS,
    STATS_TILE_COLS,
    _block_log2_probs,
    _fast_log,
    _log2,
    _loss_stats_kernel,
)
from distill_guard.kernels.shared import tl, triton

SUB_ROW_TILE_ROWS = 4
"""Rows of the statistics pass's ``[ROWS, 1024]`` tiles on sub-rows (a few thousand to tens of
thousands of columns, where a row's last tile is mostly past its end)."""


@triton.jit
def _row_lse(sub_lse_ptr, base, S: tl.constexpr):
    """log Σ exp over a row's ``S`` sub-row log-normalisers (natural log; −inf for no mass)."""
    x = tl.load(sub_lse_ptr + base + tl.arange(0, S))
    m = tl.max(x, axis=0)
    safe = tl.where(m == float("-inf"), 0.0, m)
    return safe + tl.log(tl.sum(tl.exp2((x - safe) * 1.4426950408889634), axis=0))


@triton.jit
def _sub_jsd_kernel(
    s_ptr,
    t_ptr,
    sub_ptr,
    jsd_ptr,
    valid_ptr,
    sub0,
    n_sub,
    n_cols,
    stride_s,
    stride_t,
    inv_temp,
    beta,
    S: tl.constexpr,
    FAST_LOG: tl.constexpr,
    BLOCK: tl.constexpr,
):
    p = tl.program_id(0).to(tl.int64)  # this chunk's sub-row
    gl = sub0 + p  # the call's sub-row
    base = gl // S * S
    n_eff = tl.where(tl.load(valid_ptr + gl) != 0, n_cols, 0)
    c = inv_temp * 1.4426950408889634
    lse_s = _row_lse(sub_ptr, base, S) * 1.4426950408889634  # the whole row's, log2 units
    lse_t = _row_lse(sub_ptr + n_sub, base, S) * 1.4426950408889634
    s_base = s_ptr + p * stride_s
    t_base = t_ptr + p * stride_t
    acc_s = tl.zeros([BLOCK], tl.float32)
    acc_t = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_eff, BLOCK):
        cols, mask, ls, lt = _block_log2_probs(
            s_base, t_base, start, n_cols, c, lse_s, lse_t, BLOCK
        )
        ps = tl.exp2(ls)
        pt = tl.exp2(lt)
        lm = _log2((1.0 - beta) * ps + beta * pt, FAST_LOG)
        acc_s += tl.where(ps == 0, 0.0, ps * (ls - lm))
        acc_t += tl.where(pt == 0, 0.0, pt * (lt - lm))
    kl_s = tl.sum(acc_s, axis=0) * 0.6931471805599453
    kl_t = tl.sum(acc_t, axis=0) * 0.6931471805599453
    tl.store(jsd_ptr + gl, (1.0 - beta) * kl_s + beta * kl_t)
    tl.store(jsd_ptr + n_sub + gl, kl_s)


@triton.jit
def _sub_grad_kernel(
    s_ptr,
    t_ptr,
    g_ptr,
    sub_ptr,
    jsd_ptr,
    w_ptr,
    sub0,
    n_sub,
    n_cols,
    stride_s,
    stride_t,
    stride_g,
    inv_temp,
    beta,
    S: tl.constexpr,
    MODE: tl.constexpr,
    FAST_LOG: tl.constexpr,
    BLOCK: tl.constexpr,
):
    p = tl.program_id(0).to(tl.int64)
    gl = sub0 + p
    base = gl // S * S
    w = tl.load(w_ptr + gl)
    n_eff = tl.where(w != 0, n_cols, 0)  # a masked row is only zeroed
    lse_s_n = _row_lse(sub_ptr, base, S)
    lse_t_n = _row_lse(sub_ptr + n_sub, base, S)
    aux = 0.0
    if MODE == 0:  # KL(s‖m): the sum of the row's JSD-pass partials
        aux = tl.sum(tl.load(jsd_ptr + n_sub + base + tl.arange(0, S)), axis=0)
    if MODE == 2:  # KL(s‖t) = Σ_i e^(lse_s,i − lse_s)·E_s,i[x − y] − lse_s + lse_t
        ls_i = tl.load(sub_ptr + base + tl.arange(0, S))
        lt_i = tl.load(sub_ptr + n_sub + base + tl.arange(0, S))
        kl_i = tl.load(sub_ptr + 5 * n_sub + base + tl.arange(0, S))
        share = tl.exp2((ls_i - lse_s_n) * 1.4426950408889634)
        aux = tl.sum(tl.where(share == 0, 0.0, share * (kl_i + ls_i - lt_i)), axis=0)
        aux = aux - lse_s_n + lse_t_n
    c = inv_temp * 1.4426950408889634
    lse_s = lse_s_n * 1.4426950408889634
    lse_t = lse_t_n * 1.4426950408889634
    s_base = s_ptr + p * stride_s
    t_base = t_ptr + p * stride_t
    g_base = g_ptr + p * stride_g
    for start in range(0, n_eff, BLOCK):
        cols, mask, ls, lt = _block_log2_probs(
            s_base, t_base, start, n_cols, c, lse_s, lse_t, BLOCK
        )
        ps = tl.exp2(ls)
        if MODE == 0:
            lm = _log2((1.0 - beta) * ps + beta * tl.exp2(lt), FAST_LOG)
            g = tl.where(ps == 0, 0.0, ps * ((ls - lm) * 0.6931471805599453 - aux))
        elif MODE == 1:
            g = ps - tl.exp2(lt)
        else:
            g = tl.where(ps == 0, 0.0, ps * ((ls - lt) * 0.6931471805599453 - aux))
        tl.store(g_base + cols, (w * g).to(g_ptr.dtype.element_ty), mask=mask)
    for start in range(0, n_cols - n_eff, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        tl.store(g_base + cols, tl.zeros([BLOCK], g_ptr.dtype.element_ty), mask=cols < n_cols)


class SplitRows:
    """The partial statistics of one call's ``N·S`` sub-rows, filled chunk by chunk.

    ``sub_valid`` and ``sub_weight`` (``[N·S]``) are each sub-row's row's validity and gradient
    weight; :attr:`stats` holds the statistics pass's ``[7, N·S]`` partials, :attr:`jsd` the
    JSD pass's ``[2, N·S]`` (the JSD and KL(student‖m) of each sub-row).
    """

    def __init__(self, rows: int, splits: int, valid: torch.Tensor, weight: torch.Tensor):
        self.splits = splits
        self.n_sub = rows * splits
        self.sub_valid = valid.to(torch.int8).repeat_interleave(splits)
        self.sub_weight = weight.float().repeat_interleave(splits)
        self.stats = torch.empty(7, self.n_sub, dtype=torch.float32, device=valid.device)
        self.jsd = torch.zeros(2, self.n_sub, dtype=torch.float32, device=valid.device)

    def chunk(self, x, y, a: int, inv_temp: float, beta: float, mode: int, out) -> None:
        """Rows ``[a, a + C)`` of float32 logits ``x``, ``y`` (``[C, V]``): their partials, and
        their gradient rows into ``out`` when given."""
        c, v = x.shape
        s = self.splits
        xs, ys = x.view(c * s, v // s), y.view(c * s, v // s)
        sub0, n = a * s, c * s
        # per sub-row, the statistics pass of distill_loss: lse, entropies, top-1, KL ends
        _loss_stats_kernel[(n,)](
            s_ptr=xs, t_ptr=ys, valid_ptr=self.sub_valid[sub0:], stats_ptr=self.stats[:, sub0:],
            n_rows=self.n_sub, n_cols=v // s, stride_s=xs.stride(0), stride_t=ys.stride(0),
            inv_temp=inv_temp,
            HAS_VALID=True, MODE=mode, ROWS=SUB_ROW_TILE_ROWS, COLS=STATS_TILE_COLS,
            num_warps=STATS_NUM_WARPS,
        )  # fmt: skip
        fast = _fast_log(x)
        if mode == 0:
            # per sub-row, Σ p_s·log(p_s/M) and Σ p_t·log(p_t/M) over its columns, with the
            # whole row's log-normalisers merged from its S partials
            _sub_jsd_kernel[(n,)](
                s_ptr=xs, t_ptr=ys, sub_ptr=self.stats, jsd_ptr=self.jsd,
                valid_ptr=self.sub_valid, sub0=sub0, n_sub=self.n_sub, n_cols=v // s,
                stride_s=xs.stride(0), stride_t=ys.stride(0), inv_temp=inv_temp, beta=beta,
                S=s, FAST_LOG=fast, BLOCK=PASS_BLOCK, num_warps=PASS_NUM_WARPS,
            )  # fmt: skip
        if out is None:
            return
        g = out.view(c * s, v // s)
        # per sub-row, w·∂loss/∂x as in distill_loss's gradient pass, the row's KL(s‖m) (JSD)
        # or KL(s‖t) (reverse) merged from its partials
        _sub_grad_kernel[(n,)](
            s_ptr=xs, t_ptr=ys, g_ptr=g, sub_ptr=self.stats, jsd_ptr=self.jsd,
            w_ptr=self.sub_weight, sub0=sub0, n_sub=self.n_sub, n_cols=v // s,
            stride_s=xs.stride(0), stride_t=ys.stride(0), stride_g=g.stride(0),
            inv_temp=inv_temp, beta=beta,
            S=s, MODE=mode, FAST_LOG=fast, BLOCK=PASS_BLOCK, num_warps=PASS_NUM_WARPS,
        )  # fmt: skip
