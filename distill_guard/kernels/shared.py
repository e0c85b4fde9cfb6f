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
