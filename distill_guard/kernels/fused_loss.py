"""The fused loss of :mod:`distill_guard.losses` on GPU, one read per pass: the statistics (and the
KL losses), the JSD given the log-normalisers (also the guard's JSD signal), the gradient."""

from __future__ import annotations

import torch

from distill_guard.errors import GuardValueError
from distill_guard.kernels.shared import (
    _as_rows,
    _lane_fold,
    _lanes_merged,
    _row_and_width,
    _row_tile,
    tl,
    triton,
)

MODE_JSD, MODE_FORWARD_KL, MODE_REVERSE_KL = 0, 1, 2
STATS_ROWS = 7
"""Rows of the ``[7, N]`` float32 statistics: see the ``STAT_*`` indices."""
STAT_LSE_S, STAT_LSE_T, STAT_H_S, STAT_H_T, STAT_TOP1_T, STAT_LOSS, STAT_AUX = range(7)
STATS_TILE_ROWS, STATS_TILE_COLS, STATS_NUM_WARPS = 8, 1024, 4
"""The statistics pass reads a row as ``[8, 1024]`` tiles and keeps a running max and sums per
column lane, merged once at the row's end: no reduction across threads (barriers, shuffles)
inside the loop, and 16 loads of 16 bytes in flight per thread (benchmarks/RESULTS.md 9b)."""
PASS_BLOCK, PASS_NUM_WARPS, PASS_STAGES = 2048, 8, 1
"""Block, warps and software-pipelining stages of each kernel's loop (benchmarks/gpu_loss.py
--sweep on an H200: benchmarks/RESULTS.md)."""


@triton.jit
def _block_log2_probs(s_base, t_base, start, n_cols, c, lse_s, lse_t, BLOCK: tl.constexpr):
    """Columns ``start + [0, BLOCK)`` of both rows as log₂-probabilities ``x·c − lse₂``
    (−inf past the row's end), with the columns and their mask."""
    cols = start + tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(s_base + cols, mask=mask, other=float("-inf")).to(tl.float32)
    y = tl.load(t_base + cols, mask=mask, other=float("-inf")).to(tl.float32)
    return cols, mask, x * c - lse_s, y * c - lse_t


@triton.jit
def _log2(x, FAST: tl.constexpr):
    """log₂ x; with FAST the hardware approximation (rel. error < 2^-22), not libdevice's."""
    if FAST:
        y = tl.inline_asm_elementwise(
            "lg2.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        y = tl.log2(x)
    return y


def _fast_log(x: torch.Tensor) -> bool:
    """PTX inline assembly: NVIDIA GPUs only (not ROCm, not Triton's CPU interpreter)."""
    return x.is_cuda and torch.version.hip is None


@triton.jit
def _pair_fold(ms, ss, ws, mt, st, wt, wc, x, y, c, MODE: tl.constexpr):
    """One tile of both rows folded into their lanes' running statistics, and for a KL end
    (MODE 1: forward, 2: reverse) into the cross term ``wc``, rescaled with the max it follows."""
    ms, ss, ws, a_s, ps = _lane_fold(ms, ss, ws, x, c)
    mt, st, wt, a_t, pt = _lane_fold(mt, st, wt, y, c)
    if MODE == 1:
        wc = wc * a_t + tl.sum(tl.where(pt == 0, 0.0, pt * x), axis=0)
    if MODE == 2:
        wc = wc * a_s + tl.sum(tl.where(ps == 0, 0.0, ps * y), axis=0)
    return ms, ss, ws, mt, st, wt, wc


@triton.jit
def _loss_stats_kernel(
    s_ptr,
    t_ptr,
    valid_ptr,
    stats_ptr,
    n_rows,
    n_cols,
    stride_s,
    stride_t,
    inv_temp,
    HAS_VALID: tl.constexpr,
    MODE: tl.constexpr,
    ROWS: tl.constexpr,
    COLS: tl.constexpr,
):
    row, n_eff = _row_and_width(valid_ptr, n_cols, HAS_VALID)  # masked rows read nothing
    s_base = s_ptr + row * stride_s
    t_base = t_ptr + row * stride_t
    c = inv_temp * 1.4426950408889634
    ms = tl.full([COLS], float("-inf"), tl.float32)
    mt = tl.full([COLS], float("-inf"), tl.float32)
    ss = tl.zeros([COLS], tl.float32)
    st = tl.zeros([COLS], tl.float32)
    ws = tl.zeros([COLS], tl.float32)
    wt = tl.zeros([COLS], tl.float32)
    wc = tl.zeros([COLS], tl.float32)  # a KL end's cross term: Σ 2^t_t·x or Σ 2^t_s·y, per lane
    TILE: tl.constexpr = ROWS * COLS
    n_full = (n_eff // TILE) * TILE
    for start in range(0, n_full, TILE):  # whole tiles, unmasked
        x = _row_tile(s_base, start, n_cols, ROWS, COLS, False)
        y = _row_tile(t_base, start, n_cols, ROWS, COLS, False)
        ms, ss, ws, mt, st, wt, wc = _pair_fold(ms, ss, ws, mt, st, wt, wc, x, y, c, MODE)
    if n_full < n_eff:  # the row's last, partial tile
        x = _row_tile(s_base, n_full, n_cols, ROWS, COLS, True)
        y = _row_tile(t_base, n_full, n_cols, ROWS, COLS, True)
        ms, ss, ws, mt, st, wt, wc = _pair_fold(ms, ss, ws, mt, st, wt, wc, x, y, c, MODE)
    top_s, sum_s, w_s, lane_s = _lanes_merged(ms, ss, ws, c)
    top_t, sum_t, w_t, lane_t = _lanes_merged(mt, st, wt, c)
    lse_s = tl.where(top_s == float("-inf"), 0.0, top_s) * inv_temp + tl.log(sum_s)
    lse_t = tl.where(top_t == float("-inf"), 0.0, top_t) * inv_temp + tl.log(sum_t)
    h_s = tl.log(sum_s) - w_s / sum_s * 0.6931471805599453  # H = ln Σ 2^t − E[t]·ln 2
    h_t = tl.log(sum_t) - w_t / sum_t * 0.6931471805599453
    loss = 0.0
    if MODE == 1:  # KL(t‖s) = E_t[y] − E_t[x] − lse_t + lse_s, E_t[y] = lse_t − H_t
        loss = lse_s - h_t - tl.sum(lane_t * wc, axis=0) / sum_t * inv_temp
    if MODE == 2:  # KL(s‖t) = lse_t − H_s − E_s[y]
        loss = lse_t - h_s - tl.sum(lane_s * wc, axis=0) / sum_s * inv_temp
    out = stats_ptr + row
    tl.store(out + 0 * n_rows, lse_s)
    tl.store(out + 1 * n_rows, lse_t)
    tl.store(out + 2 * n_rows, h_s)
    tl.store(out + 3 * n_rows, h_t)
    tl.store(out + 4 * n_rows, top_t * inv_temp - lse_t)
    tl.store(out + 5 * n_rows, loss)
    tl.store(out + 6 * n_rows, loss)


@triton.jit
def _jsd_given_lse_kernel(
    s_ptr,
    t_ptr,
    lse_s_ptr,
    lse_t_ptr,
    valid_ptr,
    out_ptr,
    aux_ptr,
    n_cols,
    stride_s,
    stride_t,
    inv_temp,
    beta,
    HAS_VALID: tl.constexpr,
    FAST_LOG: tl.constexpr,
    BLOCK: tl.constexpr,
    STAGES: tl.constexpr = 1,
):
    row, n_eff = _row_and_width(valid_ptr, n_cols, HAS_VALID)
    s_base = s_ptr + row * stride_s
    t_base = t_ptr + row * stride_t
    # in log2 units throughout: x·c − lse₂ is log₂ p, one FMA per element
    c = inv_temp * 1.4426950408889634
    lse_s = tl.load(lse_s_ptr + row) * 1.4426950408889634
    lse_t = tl.load(lse_t_ptr + row) * 1.4426950408889634
    acc_s = tl.zeros([BLOCK], tl.float32)
    acc_t = tl.zeros([BLOCK], tl.float32)
    for start in tl.range(0, n_eff, BLOCK, num_stages=STAGES):
        cols, mask, ls, lt = _block_log2_probs(
            s_base, t_base, start, n_cols, c, lse_s, lse_t, BLOCK
        )
        ps = tl.exp2(ls)
        pt = tl.exp2(lt)
        lm = _log2((1.0 - beta) * ps + beta * pt, FAST_LOG)  # the mixture, in probability space
        acc_s += tl.where(ps == 0, 0.0, ps * (ls - lm))
        acc_t += tl.where(pt == 0, 0.0, pt * (lt - lm))
    kl_s = tl.sum(acc_s, axis=0) * 0.6931471805599453
    kl_t = tl.sum(acc_t, axis=0) * 0.6931471805599453
    tl.store(out_ptr + row, (1.0 - beta) * kl_s + beta * kl_t)
    tl.store(aux_ptr + row, kl_s)


@triton.jit
def _loss_grad_kernel(
    s_ptr,
    t_ptr,
    g_ptr,
    lse_s_ptr,
    lse_t_ptr,
    aux_ptr,
    w_ptr,
    n_cols,
    stride_s,
    stride_t,
    stride_g,
    inv_temp,
    beta,
    MODE: tl.constexpr,
    FAST_LOG: tl.constexpr,
    BLOCK: tl.constexpr,
    STAGES: tl.constexpr = 1,
):
    row = tl.program_id(0).to(tl.int64)
    s_base = s_ptr + row * stride_s
    t_base = t_ptr + row * stride_t
    g_base = g_ptr + row * stride_g
    w = tl.load(w_ptr + row)
    n_eff = tl.where(w != 0, n_cols, 0)  # a row of weight 0 (masked) is only zeroed
    c = inv_temp * 1.4426950408889634
    lse_s = tl.load(lse_s_ptr + row) * 1.4426950408889634  # log2 units, as in the JSD pass
    lse_t = tl.load(lse_t_ptr + row) * 1.4426950408889634
    aux = tl.load(aux_ptr + row)
    for start in tl.range(0, n_eff, BLOCK, num_stages=STAGES):
        cols, mask, ls, lt = _block_log2_probs(
            s_base, t_base, start, n_cols, c, lse_s, lse_t, BLOCK
        )
        ps = tl.exp2(ls)
        if MODE == 0:  # ∂JSD/∂x = (1−β)·p_s·(ls − lm − KL(s‖m)); (1−β)/τ is in w
            lm = _log2((1.0 - beta) * ps + beta * tl.exp2(lt), FAST_LOG)
            g = tl.where(ps == 0, 0.0, ps * ((ls - lm) * 0.6931471805599453 - aux))
        elif MODE == 1:  # ∂KL(t‖s)/∂x = p_s − p_t
            g = ps - tl.exp2(lt)
        else:  # ∂KL(s‖t)/∂x = p_s·(ls − lt − KL(s‖t))
            g = tl.where(ps == 0, 0.0, ps * ((ls - lt) * 0.6931471805599453 - aux))
        tl.store(g_base + cols, (w * g).to(g_ptr.dtype.element_ty), mask=mask)
    for start in range(0, n_cols - n_eff, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        tl.store(g_base + cols, tl.zeros([BLOCK], g_ptr.dtype.element_ty), mask=cols < n_cols)


def _valid_arg(valid: torch.Tensor | None, like: torch.Tensor) -> tuple[torch.Tensor, bool]:
    if valid is None:
        return like, False  # a placeholder pointer, never read
    return valid.to(torch.int8).contiguous(), True


def triton_loss_stats(
    student_rows: torch.Tensor,
    teacher_rows: torch.Tensor,
    valid: torch.Tensor | None,
    inv_temp: float,
    mode: int,
    *,
    tile_rows: int = STATS_TILE_ROWS,
    tile_cols: int = STATS_TILE_COLS,
    num_warps: int = STATS_NUM_WARPS,
) -> torch.Tensor:
    """``[7, N]`` float32 statistics of ``[N, V]`` rows at temperature 1/inv_temp, one read
    each (rows where ``valid`` is False are not read; their entries are meaningless)."""
    s, t = _as_rows(student_rows), _as_rows(teacher_rows)
    n = s.shape[0]
    stats = torch.empty(STATS_ROWS, n, dtype=torch.float32, device=s.device)
    v, has_valid = _valid_arg(valid, stats)
    if n:
        # per row, x = s·inv_temp, y = t·inv_temp, p_s = softmax(x), p_t = softmax(y):
        # lse_s = logsumexp(x), lse_t = logsumexp(y), H_s = lse_s − Σ p_s·x, H_t = lse_t − Σ p_t·y,
        # top1_t = max(y) − lse_t, and loss = aux = KL(p_t‖p_s) = Σ p_t·(y − x) − lse_t + lse_s
        # (MODE 1), KL(p_s‖p_t) = Σ p_s·(x − y) − lse_s + lse_t (MODE 2), 0 (MODE 0: the JSD pass)
        _loss_stats_kernel[(n,)](
            s_ptr=s, t_ptr=t, valid_ptr=v, stats_ptr=stats,
            n_rows=n, n_cols=s.shape[1], stride_s=s.stride(0), stride_t=t.stride(0),
            inv_temp=inv_temp,
            HAS_VALID=has_valid, MODE=mode, ROWS=tile_rows, COLS=tile_cols, num_warps=num_warps,
        )  # fmt: skip
    return stats


def triton_jsd_given_lse(
    student_rows: torch.Tensor,
    teacher_rows: torch.Tensor,
    student_lse: torch.Tensor,
    teacher_lse: torch.Tensor,
    beta: float,
    *,
    inv_temp: float = 1.0,
    valid: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    aux: torch.Tensor | None = None,
    block: int = PASS_BLOCK,
    num_warps: int = PASS_NUM_WARPS,
    stages: int = PASS_STAGES,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(JSD, KL(student‖m)) per row in one read of each input, given the log-normalisers of
    ``logits * inv_temp``; 0 < β < 1 (teacher weight)."""
    if not 0.0 < beta < 1.0:
        raise GuardValueError(f"triton_jsd_given_lse needs 0 < beta < 1, got {beta}")
    s, t = _as_rows(student_rows), _as_rows(teacher_rows)
    n = s.shape[0]
    lse_s = student_lse.reshape(-1).float().contiguous()
    lse_t = teacher_lse.reshape(-1).float().contiguous()
    if lse_s.numel() != n or lse_t.numel() != n:
        raise GuardValueError(
            f"log-normalisers have {lse_s.numel()} and {lse_t.numel()} entries for {n} rows"
        )
    out = torch.empty(n, dtype=torch.float32, device=s.device) if out is None else out
    aux = torch.empty(n, dtype=torch.float32, device=s.device) if aux is None else aux
    v, has_valid = _valid_arg(valid, out)
    if n:
        # per row, log p_s = s·inv_temp − lse_s, log p_t = t·inv_temp − lse_t, M = (1−β)·p_s + β·p_t
        # (β weighs the teacher): out = (1−β)·KL(p_s‖M) + β·KL(p_t‖M), aux = KL(p_s‖M)
        _jsd_given_lse_kernel[(n,)](
            s_ptr=s, t_ptr=t, lse_s_ptr=lse_s, lse_t_ptr=lse_t, valid_ptr=v,
            out_ptr=out, aux_ptr=aux,
            n_cols=s.shape[1], stride_s=s.stride(0), stride_t=t.stride(0),
            inv_temp=inv_temp, beta=beta,
            HAS_VALID=has_valid, FAST_LOG=_fast_log(s), BLOCK=block, STAGES=stages,
            num_warps=num_warps,
        )  # fmt: skip
    return out, aux


def triton_loss_grad(
    student_rows: torch.Tensor,
    teacher_rows: torch.Tensor,
    stats: torch.Tensor,
    weight: torch.Tensor,
    beta: float,
    inv_temp: float,
    mode: int,
    out: torch.Tensor,
    *,
    block: int = PASS_BLOCK,
    num_warps: int = PASS_NUM_WARPS,
    stages: int = PASS_STAGES,
) -> torch.Tensor:
    """The loss's gradient w.r.t. the student's ``[N, V]`` rows into ``out`` (which may be the
    student rows themselves): ``weight[r]`` times ∂loss_r/∂(logits·inv_temp), for the JSD
    without its factor (1−β), which the caller puts in ``weight``."""
    s, t = _as_rows(student_rows), _as_rows(teacher_rows)
    n = s.shape[0]
    if n:
        # g = w·∂loss/∂x per row, x = s·inv_temp: p_s·(log p_s − log M − KL(p_s‖M)), M as in the
        # JSD pass (MODE 0, aux = KL(p_s‖M); the factor 1−β is in w), p_s − p_t (MODE 1: forward
        # KL(p_t‖p_s)), p_s·(log p_s − log p_t − KL(p_s‖p_t)) (MODE 2: reverse, aux = the loss);
        # rows of w = 0 are zeroed, not read
        _loss_grad_kernel[(n,)](
            s_ptr=s, t_ptr=t, g_ptr=out,
            lse_s_ptr=stats[STAT_LSE_S], lse_t_ptr=stats[STAT_LSE_T], aux_ptr=stats[STAT_AUX],
            w_ptr=weight.float().contiguous(),
            n_cols=s.shape[1], stride_s=s.stride(0), stride_t=t.stride(0), stride_g=out.stride(0),
            inv_temp=inv_temp, beta=beta,
            MODE=mode, FAST_LOG=_fast_log(s), BLOCK=block, STAGES=stages, num_warps=num_warps,
        )  # fmt: skip
    return out
