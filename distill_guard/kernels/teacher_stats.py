"""The teacher checks' healthy-path statistics on GPU, each in one launch.

Why: on the guard's hot path (every step, 10⁶ positions) the teacher-collapse check reads a
view's sum, sum of squares, largest value, largest row mass and its counts near −ln V, and the
pairing check the gaps between the teacher's top-1 and the sampled tokens. As PyTorch reductions
that is some fifteen launches a view, each paying the host's overhead: the step is bound by the
host, not the GPU. Here one launch writes per-block partials (float64 sums, maxima, counts) and
the host combines them after the check's one transfer (:func:`combine_parts`). The rows' top-1
(:func:`triton_row_max`) is one launch too: PyTorch's ``amax(dim=1)`` over rows of 16 took
130 µs on the H200 where reading them takes 16.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from distill_guard.kernels.shared import tl, triton

PARTS = ("sum", "sum_sq", "high", "mass", "uniform", "low", "flat")
"""The columns of the ``[blocks, 7]`` partials, as :meth:`TeacherCollapseCheck._parts` names
them."""
ROWS_PER_BLOCK, MAX_PROGRAMS, NUM_WARPS = 512, 128, 8
"""Blocks of 512 rows, at most 128 programs looping over them: the host then combines at most
128 partials a view."""
TILE_ELEMENTS = 8192
"""Elements of a row block held at once: 512 rows of a top-16, fewer rows of a wider top-k."""
MAX_FUSED_K = 512
"""The widest top-k row the kernels take (16 rows a block); wider rows stay on PyTorch."""


def rows_per_block(k: int) -> int:
    """Rows of a top-``k`` block: 512 up to k = 16, fewer beyond (one tile of
    :data:`TILE_ELEMENTS`)."""
    return max(1, min(ROWS_PER_BLOCK, TILE_ELEMENTS // triton.next_power_of_2(k)))


@triton.jit
def _view_parts_kernel(
    v_ptr,
    x_ptr,
    out_ptr,
    n,
    k,
    stride_x,
    target,
    atol,
    low_bound,
    flat_below,
    HAS_X: tl.constexpr,
    BLOCK: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid = tl.program_id(0)
    step = tl.num_programs(0).to(tl.int64) * BLOCK
    total = tl.zeros([BLOCK], tl.float64)
    total_sq = tl.zeros([BLOCK], tl.float64)
    high = tl.full([BLOCK], float("-inf"), tl.float32)
    uniform = tl.zeros([BLOCK], tl.int32)
    low = tl.zeros([BLOCK], tl.int32)
    mass = tl.zeros([BLOCK], tl.float32)
    flat = tl.zeros([BLOCK], tl.int32)
    cols = tl.arange(0, BLOCK_K)
    for start in range(pid.to(tl.int64) * BLOCK, n, step):  # this program's blocks of rows
        rows = start + tl.arange(0, BLOCK)
        m = rows < n
        v = tl.load(v_ptr + rows, mask=m, other=0.0)
        w = v.to(tl.float64)
        total += w
        total_sq += w * w
        high = tl.maximum(high, tl.where(m, v, float("-inf")))
        uniform += (m & (tl.abs(v - target) <= atol)).to(tl.int32)
        low += (m & (v <= low_bound)).to(tl.int32)
        if HAS_X:
            xm = m[:, None] & (cols < k)[None, :]
            x = tl.load(
                x_ptr + rows[:, None] * stride_x + cols[None, :], mask=xm, other=float("-inf")
            )
            mass = tl.maximum(mass, tl.sum(tl.exp(x), axis=1))
            lowest = tl.min(tl.where(xm, x, float("inf")), axis=1)
            finite = tl.abs(v) < float("inf")
            flat += (m & ((v - lowest) <= atol) & (v < flat_below) & finite).to(tl.int32)
    out = out_ptr + pid * 7
    tl.store(out + 0, tl.sum(total, axis=0))
    tl.store(out + 1, tl.sum(total_sq, axis=0))
    tl.store(out + 2, tl.max(high, axis=0).to(tl.float64))
    tl.store(out + 3, tl.max(mass, axis=0).to(tl.float64))
    tl.store(out + 4, tl.sum(uniform, axis=0).to(tl.float64))
    tl.store(out + 5, tl.sum(low, axis=0).to(tl.float64))
    tl.store(out + 6, tl.sum(flat, axis=0).to(tl.float64))


@triton.jit
def _row_max_kernel(x_ptr, out_ptr, n, k, stride_x, BLOCK: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    cols = tl.arange(0, BLOCK_K)
    m = rows < n
    xm = m[:, None] & (cols < k)[None, :]
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=xm, other=float("-inf"))
    top = tl.max(x, axis=1)
    nan = tl.max((x != x).to(tl.int32), axis=1) > 0  # a NaN anywhere reaches the row's max
    tl.store(out_ptr + rows, tl.where(nan, float("nan"), top), mask=m)


@triton.jit
def _gap_parts_kernel(top_ptr, tok_ptr, out_ptr, n, far_from, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    step = tl.num_programs(0).to(tl.int64) * BLOCK
    total = tl.zeros([BLOCK], tl.float64)
    far = tl.zeros([BLOCK], tl.int32)
    for start in range(pid.to(tl.int64) * BLOCK, n, step):  # this program's blocks of positions
        i = start + tl.arange(0, BLOCK)
        m = i < n
        gap = tl.load(top_ptr + i, mask=m, other=0.0) - tl.load(tok_ptr + i, mask=m, other=0.0)
        total += gap.to(tl.float64)
        far += (m & (gap >= far_from)).to(tl.int32)
    tl.store(out_ptr + pid * 2, tl.sum(total, axis=0))
    tl.store(out_ptr + pid * 2 + 1, tl.sum(far, axis=0).to(tl.float64))


def triton_row_max(rows: torch.Tensor) -> torch.Tensor:
    """Each row's maximum of float32 ``rows [N, K]`` (K ≤ :data:`MAX_FUSED_K`), NaN where the
    row holds one: ``rows.amax(dim=1)``, in one launch. No host sync."""
    rows = rows.contiguous()
    n, k = rows.shape
    block = rows_per_block(k)
    out = torch.empty(n, dtype=rows.dtype, device=rows.device)
    if n:
        _row_max_kernel[(triton.cdiv(n, block),)](
            x_ptr=rows, out_ptr=out, n=n, k=k, stride_x=rows.stride(0),
            BLOCK=block, BLOCK_K=triton.next_power_of_2(k), num_warps=NUM_WARPS,
        )  # fmt: skip
    return out


def triton_gap_parts(top1: torch.Tensor, tokens: torch.Tensor, bound: float) -> torch.Tensor:
    """``[2]`` float64 on the device: Σ (top1 − tokens) over float32 ``[N]`` gaps (non-finite
    iff a gap is) and how many gaps are ≥ ``bound`` (as compared in float64), for the pairing
    check's tokens test. One launch and one sum of ≤ 128 partials; no host sync."""
    top1, tokens = top1.contiguous(), tokens.contiguous()
    n = top1.shape[0]
    blocks = max(1, min(triton.cdiv(n, ROWS_PER_BLOCK), MAX_PROGRAMS))
    out = torch.empty(blocks, 2, dtype=torch.float64, device=top1.device)
    _gap_parts_kernel[(blocks,)](
        top_ptr=top1, tok_ptr=tokens, out_ptr=out, n=n,
        far_from=_float32_toward(bound, math.inf), BLOCK=ROWS_PER_BLOCK, num_warps=NUM_WARPS,
    )  # fmt: skip
    return out.sum(dim=0)


def _float32_toward(bound: float, side: float) -> float:
    """The float32 nearest ``bound`` on its ``side`` (+inf or −inf), ``bound`` itself where
    float32 holds it: for float32 ``v``, ``v >= bound`` compared in float64 is
    ``v >= _float32_toward(bound, inf)`` compared in float32, and ``v <= bound`` is
    ``v <= _float32_toward(bound, -inf)`` (Triton passes a Python float as float32)."""
    f = np.float32(bound)
    if (side > 0 and float(f) < bound) or (side < 0 and float(f) > bound):  # the other side
        f = np.nextafter(f, np.float32(side))
    return float(f)


def triton_view_parts(
    values: torch.Tensor,
    rows: torch.Tensor | None,
    *,
    target: float,
    atol: float,
    low_bound: float,
    flat_below: float,
) -> torch.Tensor:
    """``[blocks, 7]`` float64 partials (:data:`PARTS`) of float32 ``values [N]`` and, for a
    top-k view, its float32 ``rows [N, K]``: Σ v and Σ v² in float64, max v, max row Σ exp(x),
    the counts of |v − target| ≤ atol (float32, as PyTorch compares a float32 tensor with a
    Python float), of v ≤ low_bound (as compared in float64) and of flat rows
    (:meth:`~distill_guard.checks.teacher_collapse.TeacherCollapseCheck._flat_rows`). A
    ``target`` of NaN counts nothing. No host sync."""
    values = values.contiguous()
    rows = rows.contiguous() if rows is not None else None
    n = values.shape[0]
    k = rows.shape[1] if rows is not None else 1
    block = rows_per_block(k)
    blocks = max(1, min(triton.cdiv(n, block), MAX_PROGRAMS))
    out = torch.empty(blocks, 7, dtype=torch.float64, device=values.device)
    has_x = rows is not None
    x = rows if has_x else values
    # per block of rows: Σ v, Σ v², max v, max_r Σ_j exp(x_rj), #|v − target| ≤ atol, #v ≤ low,
    # #flat rows (top-1 − row min ≤ atol, top-1 < flat_below, top-1 finite)
    _view_parts_kernel[(blocks,)](
        v_ptr=values, x_ptr=x, out_ptr=out, n=n, k=k, stride_x=x.stride(0),
        target=target, atol=atol, low_bound=_float32_toward(low_bound, -math.inf),
        flat_below=flat_below,
        HAS_X=has_x, BLOCK=block, BLOCK_K=triton.next_power_of_2(k),
        num_warps=NUM_WARPS,
    )  # fmt: skip
    return out


def combine_parts(partials: np.ndarray) -> dict[str, float]:
    """One view's :data:`PARTS` from its ``[blocks, 7]`` partials on the host: the sums and
    counts summed, the maxima taken (counts stay exact: integers in float64)."""
    sums = partials.sum(axis=0)
    highs = partials.max(axis=0)
    got = {name: float(sums[i]) for i, name in enumerate(PARTS)}
    got["high"], got["mass"] = float(highs[2]), float(highs[3])
    return got
