"""The guard's signals on GPU: per-row entropy in one read of the logits, the JSD in two. Why: the
chunked PyTorch path of :mod:`distill_guard.signals` writes float32 copies, far below bandwidth."""

from __future__ import annotations

import torch

from distill_guard.errors import GuardValueError
from distill_guard.kernels.shared import (
    _as_rows,
    _block_update,
    _row_fold,
    tl,
    triton,
)

# Chosen by the sweeps in benchmarks/gpu_signals.py on an H200 (benchmarks/RESULTS.md): the
# entropy reads a row as [8, 1024] tiles with a running max and sums per column lane (no
# reduction across threads inside the loop), as the loss's statistics pass does.
TILE_ROWS, TILE_COLS, NUM_WARPS = 8, 1024, 4
JSD_BLOCK, JSD_NUM_WARPS = 1024, 4


@triton.jit
def _entropy_kernel(x_ptr, out_ptr, n_cols, stride_row, ROWS: tl.constexpr, COLS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = x_ptr + row * stride_row
    _top, total, wt = _row_fold(base, n_cols, n_cols, 1.4426950408889634, ROWS, COLS)
    # H = ln Σ 2^t − E[t]·ln 2, t = (x − max)·log₂e
    tl.store(out_ptr + row, tl.log(total) - wt / total * 0.6931471805599453)


@triton.jit
def _jsd_kernel(s_ptr, t_ptr, out_ptr, n_cols, stride_s, stride_t, beta, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    s_base = s_ptr + row * stride_s
    t_base = t_ptr + row * stride_t
    ms, mt, ss, st = float("-inf"), float("-inf"), 0.0, 0.0  # running maxima and sums
    for start in range(0, n_cols, BLOCK):  # pass 1: both log-normalisers
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        a = tl.load(s_base + cols, mask=mask, other=float("-inf")).to(tl.float32)
        b = tl.load(t_base + cols, mask=mask, other=float("-inf")).to(tl.float32)
        ms, ss, _a1, _p1 = _block_update(ms, ss, a)
        mt, st, _a2, _p2 = _block_update(mt, st, b)
    lse_s = tl.where(ms == float("-inf"), 0.0, ms) + tl.log(ss)
    lse_t = tl.where(mt == float("-inf"), 0.0, mt) + tl.log(st)
    acc = tl.zeros([BLOCK], tl.float32)
    n_blocks = tl.cdiv(n_cols, BLOCK)
    for i in range(0, n_blocks):  # pass 2, backwards: the blocks pass 1 read last are in L2
        cols = (n_blocks - 1 - i) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < n_cols
        ls = tl.load(s_base + cols, mask=mask, other=float("-inf")).to(tl.float32) - lse_s
        lt = tl.load(t_base + cols, mask=mask, other=float("-inf")).to(tl.float32) - lse_t
        ps = tl.exp2(ls * 1.4426950408889634)
        pt = tl.exp2(lt * 1.4426950408889634)
        lm = tl.log((1.0 - beta) * ps + beta * pt)  # the mixture, formed in probability space
        acc += (1.0 - beta) * tl.where(ps == 0, 0.0, ps * (ls - lm)) + beta * tl.where(
            pt == 0, 0.0, pt * (lt - lm)
        )
    tl.store(out_ptr + row, tl.sum(acc, axis=0))


def triton_entropy(
    logits: torch.Tensor,
    *,
    tile_rows: int = TILE_ROWS,
    tile_cols: int = TILE_COLS,
    num_warps: int = NUM_WARPS,
) -> torch.Tensor:
    """Per-row entropy of ``[..., V]`` logits in float32, one read of the input."""
    rows = _as_rows(logits)
    out = torch.empty(rows.shape[0], dtype=torch.float32, device=rows.device)
    if rows.shape[0]:
        # H(p) = logsumexp(x) − Σ_v p_v·x_v per row x, p = softmax(x)
        _entropy_kernel[(rows.shape[0],)](
            x_ptr=rows, out_ptr=out, n_cols=rows.shape[1], stride_row=rows.stride(0),
            ROWS=tile_rows, COLS=tile_cols, num_warps=num_warps,
        )  # fmt: skip
    return out.reshape(logits.shape[:-1])


def triton_jsd(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    beta: float,
    *,
    block: int = JSD_BLOCK,
    num_warps: int = JSD_NUM_WARPS,
) -> torch.Tensor:
    """Per-row generalized JSD (teacher weight β) in float32; 0 < β < 1."""
    if not 0.0 < beta < 1.0:
        raise GuardValueError(f"triton_jsd needs 0 < beta < 1, got {beta}")
    s, t = _as_rows(student_logits), _as_rows(teacher_logits)
    out = torch.empty(s.shape[0], dtype=torch.float32, device=s.device)
    if s.shape[0]:
        # JSD_β(S‖T) = (1−β)·KL(S‖M) + β·KL(T‖M), M = (1−β)·S + β·T, with S = softmax(s),
        # T = softmax(t) per row: β weighs the teacher
        _jsd_kernel[(s.shape[0],)](
            s_ptr=s, t_ptr=t, out_ptr=out,
            n_cols=s.shape[1], stride_s=s.stride(0), stride_t=t.stride(0),
            beta=beta,
            BLOCK=block, num_warps=num_warps,
        )  # fmt: skip
    return out.reshape(student_logits.shape[:-1])
