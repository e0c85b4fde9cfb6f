"""Pure math on teacher and student outputs: the invariants the checks hold the run against.

Every function here is side-effect free and knows nothing of trainers or teachers. Functions over
full-vocabulary logits work in row chunks so the extra memory is one ``[chunk, V]`` float32 block,
never an ``[N, V]`` float32 copy of the logits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

DEFAULT_CHUNK_ROWS = 256
"""Rows per chunk for full-vocabulary work: 256 × 151936 float32 is 156 MB."""


def uniform_logprob(vocab_size: int) -> float:
    """log(1/V): the value every logprob takes when the teacher's distribution is exactly uniform."""
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
    return -math.log(vocab_size)


def binary_entropy(beta: float) -> float:
    """H(β) = −β ln β − (1−β) ln(1−β) in nats; 0 at the ends."""
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must lie in [0, 1], got {beta}")
    return -sum(p * math.log(p) for p in (beta, 1.0 - beta) if p > 0.0)


def jsd_ceiling(beta: float) -> float | None:
    """Upper bound of the generalized JSD with mixture weight β, or None where there is none.

    With m = (1−β)·P + β·Q the divergence (1−β)·KL(P‖m) + β·KL(Q‖m) is at most H(β) and reaches it
    iff P and Q have disjoint support. H(β) = H(1−β), so the bound does not depend on which side β
    weights. At β ∈ {0, 1} the loss is a KL divergence, which has no ceiling: returns None.
    """
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must lie in [0, 1], got {beta}")
    if beta in (0.0, 1.0):
        return None
    return binary_entropy(beta)


@dataclass(frozen=True)
class TeacherLogprobStats:
    """Summary of a batch of teacher logprobs, finite values only unless counted as non-finite."""

    count: int
    """Number of (unmasked) values looked at, non-finite ones included."""
    nonfinite: int
    """How many were NaN or ±inf."""
    mean: float
    """Mean of the finite values (NaN if there are none)."""
    spread: float
    """Standard deviation of the finite values (0 for one value)."""
    min: float
    max: float
    uniform_fraction: float
    """Fraction of finite values within ``atol`` of −ln V (NaN when V is unknown)."""
    top1_mean: float
    """Mean top-1 logprob per row (top-k input), else the mean of per-token values."""
    entropy_lower_bound: float
    """Mean over rows of −(top-1 logprob): H ≥ −max log p, so a lower bound on teacher entropy."""
    row_flat_fraction: float
    """Top-k input: fraction of rows whose k values are all within ``atol`` of each other."""


def teacher_logprob_stats(
    logprobs: torch.Tensor,
    vocab_size: int | None = None,
    *,
    atol: float = 1e-3,
    mask: torch.Tensor | None = None,
) -> TeacherLogprobStats:
    """Statistics of teacher logprobs, either per sampled token ``[N]`` or top-k rows ``[N, K]``.

    Top-k rows are assumed sorted or not; top-1 is taken as the row maximum. ``mask`` selects
    tokens (``[N]`` for either shape). Runs on the tensor's device; returns Python floats.
    """
    if logprobs.dim() not in (1, 2):
        raise ValueError(
            f"teacher logprobs must be [N] or [N, K], got shape {tuple(logprobs.shape)}"
        )
    x = logprobs.detach()
    if mask is not None:
        mask = mask.to(device=x.device, dtype=torch.bool).reshape(-1)
        if mask.numel() != x.shape[0]:
            raise ValueError(f"mask has {mask.numel()} entries for {x.shape[0]} token positions")
        x = x[mask]
    x = x.to(torch.float64)
    rows = x if x.dim() == 2 else x.unsqueeze(1)
    flat = rows.reshape(-1)
    finite = torch.isfinite(flat)
    count = flat.numel()
    nonfinite = int(count - int(finite.sum()))
    vals = flat[finite]
    nan = float("nan")
    if vals.numel() == 0:
        return TeacherLogprobStats(count, nonfinite, nan, nan, nan, nan, nan, nan, nan, nan)
    mean = float(vals.mean())
    spread = float(vals.std(unbiased=False)) if vals.numel() > 1 else 0.0
    uniform_fraction = nan
    if vocab_size is not None:
        uniform_fraction = float(
            ((vals - uniform_logprob(vocab_size)).abs() <= atol).double().mean()
        )
    finite_rows = torch.isfinite(rows).all(dim=1)
    good = rows[finite_rows]
    if good.shape[0]:
        top1 = good.max(dim=1).values
        top1_mean = float(top1.mean())
        row_flat = (good.max(dim=1).values - good.min(dim=1).values) <= atol
        row_flat_fraction = float(row_flat.double().mean()) if rows.shape[1] > 1 else nan
    else:
        top1_mean = row_flat_fraction = nan
    return TeacherLogprobStats(
        count=count,
        nonfinite=nonfinite,
        mean=mean,
        spread=spread,
        min=float(vals.min()),
        max=float(vals.max()),
        uniform_fraction=uniform_fraction,
        top1_mean=top1_mean,
        entropy_lower_bound=-top1_mean,
        row_flat_fraction=row_flat_fraction,
    )


def infer_uniform_vocab_size(logprob: float) -> int:
    """The V for which −ln V is this value: how a uniform response betrays the vocabulary size."""
    return round(math.exp(-logprob))


def _row_chunks(n: int, chunk_rows: int):
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    for start in range(0, n, chunk_rows):
        yield start, min(start + chunk_rows, n)


def entropy_from_logits(
    logits: torch.Tensor, *, chunk_rows: int = DEFAULT_CHUNK_ROWS
) -> torch.Tensor:
    """Full-vocabulary entropy per row of ``[..., V]`` logits, in float32, chunked over rows.

    H = logsumexp(z) − Σ softmax(z)·z. The extra memory is a few ``[chunk_rows, V]`` float32
    blocks regardless of N, so it can run on a 16k × 152k bf16 batch without a float32 copy.
    """
    z = logits.reshape(-1, logits.shape[-1])
    out = torch.empty(z.shape[0], dtype=torch.float32, device=z.device)
    for a, b in _row_chunks(z.shape[0], chunk_rows):
        c = z[a:b].float()
        lse = torch.logsumexp(c, dim=-1)
        p = torch.softmax(c, dim=-1)
        # a −inf logit has p = 0 and contributes nothing (0·log 0 = 0), not 0·(−inf) = NaN
        out[a:b] = lse - (p * c.masked_fill(p == 0, 0.0)).sum(dim=-1)
    return out.reshape(logits.shape[:-1])


def jsd_from_logits(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    beta: float = 0.5,
    *,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
) -> torch.Tensor:
    """Per-row generalized JSD over the full vocabulary, m = (1−β)·student + β·teacher.

    Returns (1−β)·KL(student‖m) + β·KL(teacher‖m) per row in float32. At β = 0 or 1 this is 0
    by construction (m equals one side); use a KL for those ends. Chunked like
    :func:`entropy_from_logits`.
    """
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(
            f"student logits {tuple(student_logits.shape)} and teacher logits "
            f"{tuple(teacher_logits.shape)} must have the same shape"
        )
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must lie in [0, 1], got {beta}")
    s_all = student_logits.reshape(-1, student_logits.shape[-1])
    t_all = teacher_logits.reshape(-1, teacher_logits.shape[-1])
    out = torch.empty(s_all.shape[0], dtype=torch.float32, device=s_all.device)
    log1mb = math.log1p(-beta) if beta < 1 else -math.inf
    logb = math.log(beta) if beta > 0 else -math.inf
    for a, b in _row_chunks(s_all.shape[0], chunk_rows):
        ls = torch.log_softmax(s_all[a:b].float(), dim=-1)
        lt = torch.log_softmax(t_all[a:b].float(), dim=-1)
        lm = torch.logaddexp(ls + log1mb, lt + logb)
        # tokens one side gives probability 0 (−inf logits) add 0 to its KL, not NaN
        kl_s = (ls.exp() * (ls - lm)).masked_fill(ls == -math.inf, 0.0).sum(dim=-1)
        kl_t = (lt.exp() * (lt - lm)).masked_fill(lt == -math.inf, 0.0).sum(dim=-1)
        out[a:b] = (1.0 - beta) * kl_s + beta * kl_t
    return out.reshape(student_logits.shape[:-1])


def reverse_kl_uniform_gap(reverse_kl: float, student_entropy: float, vocab_size: int) -> float:
    """ln V − (KL(student‖teacher) + H(student)): zero when the teacher is uniform.

    KL(s‖u) = Σ s·(log s + ln V) = ln V − H(s), so a reverse-KL loss against a uniform teacher
    plus the student's entropy is exactly ln V. Healthy runs sit far below it.
    """
    return math.log(vocab_size) - (reverse_kl + student_entropy)
