"""The teacher-collapse check's healthy-path statistics of one view on GPU, in one launch.

Why: on the guard's hot path (every step, 10⁶ positions) the check reads a view's sum, sum of
squares, largest value, largest row mass and its counts near −ln V. As PyTorch reductions that is
some fifteen launches a view, each paying the host's overhead: the step is bound by the host, not
the GPU. Here one launch writes per-block partials (float64 sums, maxima, counts) and the host
combines them after the step's one transfer (:func:`combine_parts`).
"""

from __future__ import annotations

import numpy as np
import torch

from distill_guard.kernels.shared import tl, triton

PARTS = ("sum", "sum_sq", "high", "mass", "uniform", "low", "flat")
"""The columns of the ``[blocks, 7]`` partials, as :meth:`TeacherCollapseCheck._parts` names
them."""
ROWS_PER_BLOCK, MAX_PROGRAMS, NUM_WARPS = 512, 128, 8
"""Blocks of 512 rows, at most 128 programs looping over them: the host then combines at most
128 partials a view."""


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


def _float32_at_or_below(bound: float) -> float:
    """The largest float32 ≤ ``bound``: for float32 ``v``, ``v <= bound`` (compared in float64)
    is ``v <= _float32_at_or_below(bound)`` compared in float32."""
    f = np.float32(bound)
    if float(f) > bound:
        f = np.nextafter(f, np.float32(-np.inf))
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
    n = values.shape[0]
    blocks = max(1, min(triton.cdiv(n, ROWS_PER_BLOCK), MAX_PROGRAMS))
    out = torch.empty(blocks, 7, dtype=torch.float64, device=values.device)
    has_x = rows is not None
    x = rows if has_x else values
    k = rows.shape[1] if has_x else 1
    # per block of rows: Σ v, Σ v², max v, max_r Σ_j exp(x_rj), #|v − target| ≤ atol, #v ≤ low,
    # #flat rows (top-1 − row min ≤ atol, top-1 < flat_below, top-1 finite)
    _view_parts_kernel[(blocks,)](
        v_ptr=values, x_ptr=x, out_ptr=out, n=n, k=k, stride_x=x.stride(0),
        target=target, atol=atol, low_bound=_float32_at_or_below(low_bound),
        flat_below=flat_below,
        HAS_X=has_x, BLOCK=ROWS_PER_BLOCK, BLOCK_K=triton.next_power_of_2(k),
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
