"""Triton kernels for full-vocabulary signals on GPU: entropy in one read, JSD in two.

Why: the chunked PyTorch path in :mod:`distill_guard.signals` writes several float32 copies of
each chunk, so on a GPU it runs far below memory bandwidth. These kernels read bf16/fp16/fp32
logits once per pass and keep everything else in registers, using the online (running-max)
softmax so a 151936-wide row never needs to fit anywhere. Selected automatically for CUDA
tensors by ``signals.entropy_from_logits`` / ``signals.jsd_from_logits`` when Triton is
importable; tested on CPU through Triton's interpreter (``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Chosen by the sweep in benchmarks/gpu_signals.py on an H200 (benchmarks/RESULTS.md).
BLOCK, NUM_WARPS = 4096, 4
JSD_BLOCK, JSD_NUM_WARPS = 1024, 4


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
def _entropy_kernel(x_ptr, out_ptr, n_cols, stride_row, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = x_ptr + row * stride_row
    m = float("-inf")
    s = 0.0
    w = 0.0  # running sum of p * x, rescaled like s
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(base + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
        m, s, alpha, p = _block_update(m, s, x)
        w = w * alpha + tl.sum(tl.where(p > 0, p * x, 0.0), axis=0)
    safe = tl.where(m == float("-inf"), 0.0, m)
    # H = log Z - E[x], with log Z = m + log s and E[x] = w / s
    tl.store(out_ptr + row, safe + tl.log(s) - w / s)


@triton.jit
def _jsd_kernel(s_ptr, t_ptr, out_ptr, n_cols, stride_s, stride_t, beta, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    s_base = s_ptr + row * stride_s
    t_base = t_ptr + row * stride_t
    ms = float("-inf")
    mt = float("-inf")
    ss = 0.0
    st = 0.0
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
        acc += (1.0 - beta) * tl.where(ps > 0, ps * (ls - lm), 0.0) + beta * tl.where(
            pt > 0, pt * (lt - lm), 0.0
        )
    tl.store(out_ptr + row, tl.sum(acc, axis=0))


def _as_rows(x: torch.Tensor) -> torch.Tensor:
    x = x.reshape(-1, x.shape[-1])
    return x if x.stride(-1) == 1 else x.contiguous()


def triton_entropy(
    logits: torch.Tensor, *, block: int = BLOCK, num_warps: int = NUM_WARPS
) -> torch.Tensor:
    """Per-row entropy of ``[..., V]`` logits in float32, one read of the input."""
    rows = _as_rows(logits)
    out = torch.empty(rows.shape[0], dtype=torch.float32, device=rows.device)
    if rows.shape[0]:
        _entropy_kernel[(rows.shape[0],)](
            rows, out, rows.shape[1], rows.stride(0), BLOCK=block, num_warps=num_warps
        )
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
        raise ValueError(f"triton_jsd needs 0 < beta < 1, got {beta}")
    s, t = _as_rows(student_logits), _as_rows(teacher_logits)
    out = torch.empty(s.shape[0], dtype=torch.float32, device=s.device)
    if s.shape[0]:
        _jsd_kernel[(s.shape[0],)](
            s,
            t,
            out,
            s.shape[1],
            s.stride(0),
            t.stride(0),
            beta,
            BLOCK=block,
            num_warps=num_warps,
        )
    return out.reshape(student_logits.shape[:-1])
