"""Pure math on teacher and student outputs: the invariants the checks hold the run against.

Every function here is side-effect free and knows nothing of trainers or teachers. Functions over
full-vocabulary logits work in row chunks so the extra memory is one ``[chunk, V]`` float32 block,
never an ``[N, V]`` float32 copy of the logits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch

from distill_guard.errors import GuardValueError

DEFAULT_CHUNK_ROWS = 256
"""Rows per chunk for full-vocabulary work: 256 × 151936 float32 is 156 MB."""


def uniform_logprob(vocab_size: int) -> float:
    """log(1/V): the value every logprob takes when the teacher's distribution is exactly uniform."""
    if vocab_size < 2:
        raise GuardValueError(f"vocab_size must be >= 2, got {vocab_size}")
    return -math.log(vocab_size)


def binary_entropy(beta: float) -> float:
    """H(β) = −β ln β − (1−β) ln(1−β) in nats; 0 at the ends."""
    if not 0.0 <= beta <= 1.0:
        raise GuardValueError(f"beta must lie in [0, 1], got {beta}")
    return -sum(p * math.log(p) for p in (beta, 1.0 - beta) if p > 0.0)


def jsd_ceiling(beta: float) -> float | None:
    """Upper bound of the generalized JSD with mixture weight β, or None where there is none.

    With m = (1−β)·P + β·Q the divergence (1−β)·KL(P‖m) + β·KL(Q‖m) is at most H(β) and reaches it
    iff P and Q have disjoint support. H(β) = H(1−β), so the bound does not depend on which side β
    weights. At β ∈ {0, 1} the loss is a KL divergence, which has no ceiling: returns None.
    """
    if not 0.0 <= beta <= 1.0:
        raise GuardValueError(f"beta must lie in [0, 1], got {beta}")
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
        raise GuardValueError(
            f"teacher logprobs must be [N] or [N, K], got shape {tuple(logprobs.shape)}"
        )
    x = logprobs.detach()
    if mask is not None:
        mask = mask.to(device=x.device, dtype=torch.bool).reshape(-1)
        if mask.numel() != x.shape[0]:
            raise GuardValueError(
                f"mask has {mask.numel()} entries for {x.shape[0]} token positions"
            )
        x = x[mask]
    if x.dim() == 1:
        return _token_stats(x, vocab_size, atol)
    rows = x.to(torch.float64)
    # Masked reductions and a single host transfer: on a GPU this costs one sync, not ten.
    finite = torch.isfinite(rows)
    n_fin = finite.sum().double()
    vals = torch.where(finite, rows, 0.0)
    mean = vals.sum() / n_fin
    var = torch.where(finite, (rows - mean) ** 2, 0.0).sum() / n_fin
    hi = torch.where(finite, rows, -math.inf)
    lo = torch.where(finite, rows, math.inf)
    top1 = hi.amax(dim=1)
    row_ok = torch.isfinite(top1) & finite.all(dim=1)
    n_rows = row_ok.sum().double()
    top1_mean = torch.where(row_ok, top1, 0.0).sum() / n_rows
    flat = row_ok & ((top1 - lo.amin(dim=1)) <= atol)
    target = uniform_logprob(vocab_size) if vocab_size is not None else 0.0
    uniform = (finite & ((rows - target).abs() <= atol)).sum() / n_fin
    (n_fin_, mean_, var_, min_, max_, uniform_, top1_mean_, flat_) = torch.stack(
        [n_fin, mean, var, lo.min(), hi.max(), uniform, top1_mean, flat.sum() / n_rows]
    ).tolist()
    count = rows.numel()
    nan = float("nan")
    if n_fin_ == 0:
        return TeacherLogprobStats(count, count, nan, nan, nan, nan, nan, nan, nan, nan)
    return TeacherLogprobStats(
        count=count,
        nonfinite=int(count - n_fin_),
        mean=mean_,
        spread=math.sqrt(max(var_, 0.0)) if n_fin_ > 1 else 0.0,
        min=min_,
        max=max_,
        uniform_fraction=uniform_ if vocab_size is not None else nan,
        top1_mean=top1_mean_,
        entropy_lower_bound=-top1_mean_,
        row_flat_fraction=flat_ if rows.shape[1] > 1 else nan,
    )


def _token_stats(x: torch.Tensor, vocab_size: int | None, atol: float) -> TeacherLogprobStats:
    """The ``[N]`` case with as few kernels as possible: it is on the guard's per-step path."""
    finite = torch.isfinite(x)
    vals = torch.where(finite, x, 0.0)
    target = uniform_logprob(vocab_size) if vocab_size is not None else 0.0
    lo, hi = torch.aminmax(vals)
    n_fin, s1, s2, lo_, hi_, uni = torch.stack(
        [
            finite.sum(dtype=torch.float64),
            vals.sum(dtype=torch.float64),
            vals.double().square().sum(),
            lo.double(),
            hi.double(),
            ((x - target).abs() <= atol).sum(dtype=torch.float64),
        ]
    ).tolist()
    count, nan = x.numel(), float("nan")
    if n_fin == 0:
        return TeacherLogprobStats(count, count, nan, nan, nan, nan, nan, nan, nan, nan)
    if n_fin < count:  # rare: the zeros standing in for non-finite values must not set min/max
        kept = x[finite].double()
        lo_, hi_ = float(kept.min()), float(kept.max())
    mean, spread = mean_spread(n_fin, s1, s2)
    return TeacherLogprobStats(
        count=count,
        nonfinite=int(count - n_fin),
        mean=mean,
        spread=spread,
        min=lo_,
        max=hi_,
        uniform_fraction=uni / n_fin if vocab_size is not None else nan,
        top1_mean=mean,
        entropy_lower_bound=-mean,
        row_flat_fraction=nan,
    )


def mean_spread(n: float, total: float, total_sq: float) -> tuple[float, float]:
    """Mean and standard deviation of ``n ≥ 1`` values from their sum and sum of squares: the
    host side of statistics reduced on the device to three numbers (0 spread for one value)."""
    mean = total / n
    return mean, math.sqrt(max(total_sq / n - mean * mean, 0.0)) if n > 1 else 0.0


def infer_uniform_vocab_size(logprob: float) -> int:
    """The V for which −ln V is this value: how a uniform response betrays the vocabulary size."""
    return round(math.exp(-logprob))


def _row_chunks(n: int, chunk_rows: int):
    if chunk_rows < 1:
        raise GuardValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    for start in range(0, n, chunk_rows):
        yield start, min(start + chunk_rows, n)


def _use_triton(x: torch.Tensor, backend: str) -> bool:
    if backend not in ("auto", "torch", "triton"):
        raise GuardValueError(f"backend must be auto, torch or triton, got {backend!r}")
    if backend == "torch" or (backend == "auto" and not x.is_cuda):
        return False
    try:
        import distill_guard.triton_kernels  # noqa: F401
    except ImportError:
        if backend == "triton":
            raise
        return False
    return True


def fusable_float32(*tensors: torch.Tensor) -> bool:
    """Whether the teacher checks' Triton kernels can read these tensors: float32 on CUDA, with
    Triton importable. Other dtypes keep PyTorch, whose comparisons they were written against."""
    if not all(t.is_cuda and t.dtype == torch.float32 for t in tensors):
        return False
    return _use_triton(tensors[0], "auto")


def row_max(rows: torch.Tensor) -> torch.Tensor:
    """Each row's maximum of ``rows [N, K]`` (NaN where a row holds one), as
    ``rows.amax(dim=1)``; in one Triton launch for CUDA float32 rows up to K = 512."""
    if fusable_float32(rows):
        from distill_guard.kernels.teacher_stats import MAX_FUSED_K, triton_row_max

        if rows.shape[1] <= MAX_FUSED_K:
            return triton_row_max(rows)
    return rows.amax(dim=1)


def entropy_from_logits(
    logits: torch.Tensor, *, chunk_rows: int = DEFAULT_CHUNK_ROWS, backend: str = "auto"
) -> torch.Tensor:
    """Full-vocabulary entropy per row of ``[..., V]`` logits, in float32.

    H = logsumexp(z) − Σ softmax(z)·z. On CUDA with Triton (``backend="auto"``) a kernel reads
    the logits once; otherwise rows are processed in chunks, so the extra memory is a few
    ``[chunk_rows, V]`` float32 blocks regardless of N, never an ``[N, V]`` float32 copy.
    """
    if _use_triton(logits, backend):
        from distill_guard.triton_kernels import triton_entropy

        return triton_entropy(logits)
    z = logits.reshape(-1, logits.shape[-1])
    out = torch.empty(z.shape[0], dtype=torch.float32, device=z.device)
    for a, b in _row_chunks(z.shape[0], chunk_rows):
        c = z[a:b].float()
        lse = torch.logsumexp(c, dim=-1)
        p = torch.softmax(c, dim=-1)
        # nansum: a -inf logit (masked token) has p = 0 and contributes 0, not 0 * -inf = NaN;
        # a NaN logit still makes lse NaN, so real NaNs are not hidden.
        out[a:b] = lse - (p * c).nansum(dim=-1)
    return out.reshape(logits.shape[:-1])


def jsd_from_logits(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    beta: float = 0.5,
    *,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    backend: str = "auto",
    student_lse: torch.Tensor | None = None,
    teacher_lse: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-row generalized JSD over the full vocabulary, m = (1−β)·student + β·teacher.

    Returns (1−β)·KL(student‖m) + β·KL(teacher‖m) per row in float32. At β = 0 or 1 this is 0
    by construction (m equals one side); use a KL for those ends. Backends as in
    :func:`entropy_from_logits`. The Triton kernel reads each input twice (the log-normalisers,
    then the divergence) unless ``student_lse`` and ``teacher_lse`` (logsumexp per row, e.g.
    :class:`distill_guard.losses.DistillLoss`'s at τ = 1) are given: then once.
    """
    if student_logits.shape != teacher_logits.shape:
        raise GuardValueError(
            f"student logits {tuple(student_logits.shape)} and teacher logits "
            f"{tuple(teacher_logits.shape)} must have the same shape"
        )
    if not 0.0 <= beta <= 1.0:
        raise GuardValueError(f"beta must lie in [0, 1], got {beta}")
    if (student_lse is None) != (teacher_lse is None):
        raise GuardValueError("give both student_lse and teacher_lse, or neither")
    if student_lse is not None:
        lead = student_logits.shape[:-1]
        for name, lse in (("student_lse", student_lse), ("teacher_lse", teacher_lse)):
            if lse.shape != lead:
                raise GuardValueError(
                    f"{name} has shape {tuple(lse.shape)}, the logits' leading shape is "
                    f"{tuple(lead)}"
                )
    if 0.0 < beta < 1.0 and _use_triton(student_logits, backend):
        from distill_guard.triton_kernels import triton_jsd, triton_jsd_given_lse

        if student_lse is None:
            return triton_jsd(student_logits, teacher_logits, beta)
        jsd, _ = triton_jsd_given_lse(
            student_logits, teacher_logits, student_lse, teacher_lse, beta
        )
        return jsd.reshape(student_logits.shape[:-1])
    s_all = student_logits.reshape(-1, student_logits.shape[-1])
    t_all = teacher_logits.reshape(-1, teacher_logits.shape[-1])
    out = torch.empty(s_all.shape[0], dtype=torch.float32, device=s_all.device)
    log1mb = math.log1p(-beta) if beta < 1 else -math.inf
    logb = math.log(beta) if beta > 0 else -math.inf
    for a, b in _row_chunks(s_all.shape[0], chunk_rows):
        if student_lse is None:
            ls = torch.log_softmax(s_all[a:b].float(), dim=-1)
            lt = torch.log_softmax(t_all[a:b].float(), dim=-1)
        else:
            ls = s_all[a:b].float() - student_lse.reshape(-1, 1)[a:b].float()
            lt = t_all[a:b].float() - teacher_lse.reshape(-1, 1)[a:b].float()
        lm = torch.logaddexp(ls + log1mb, lt + logb)
        kl_s = (ls.exp() * (ls - lm)).nansum(dim=-1)  # p = 0 terms are 0 (see above)
        kl_t = (lt.exp() * (lt - lm)).nansum(dim=-1)
        out[a:b] = (1.0 - beta) * kl_s + beta * kl_t
    return out.reshape(student_logits.shape[:-1])


def reverse_kl_uniform_gap(reverse_kl: float, student_entropy: float, vocab_size: int) -> float:
    """ln V − (KL(student‖teacher) + H(student)): zero when the teacher is uniform.

    KL(s‖u) = Σ s·(log s + ln V) = ln V − H(s), so a reverse-KL loss against a uniform teacher
    plus the student's entropy is exactly ln V. Healthy runs sit far below it.
    """
    return math.log(vocab_size) - (reverse_kl + student_entropy)


class ReducedLogits(NamedTuple):
    """A teacher's full logits reduced to what the guard keeps, at the kept positions."""

    topk: torch.Tensor
    """``[n, k]`` top-k logprobs, descending."""
    token: torch.Tensor | None
    """``[n]`` logprobs of the labels (None without labels)."""
    topk_ids: torch.Tensor
    """``[n, k]`` the ids of ``topk``."""
    token_ids: torch.Tensor | None
    """``[n]`` the labels (None without labels)."""
    sample_index: torch.Tensor
    """``[n]`` the leading-dimension row (the sample) of each kept position."""


def teacher_logprobs_from_logits(
    logits: torch.Tensor,
    *,
    top_k: int = 16,
    mask: torch.Tensor | None = None,
    labels: torch.Tensor | None = None,
    ignore_index: int = -100,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
) -> ReducedLogits:
    """Top-k logprobs ``[n, k]`` and their ids (and logprobs of ``labels``, ``[n]``) of the kept
    positions.

    ``logits`` is ``[..., V]``; ``mask`` and ``labels`` have its leading shape (positions whose
    label is ``ignore_index`` are dropped). Works in float32 row chunks of ``chunk_rows``, so the
    extra memory is one ``[chunk_rows, V]`` block whatever the batch.
    """
    if top_k < 1:
        raise GuardValueError(f"top_k must be >= 1, got {top_k}")
    v = logits.shape[-1]
    z = logits.detach().reshape(-1, v)
    per_sample = logits.shape[-2] if logits.dim() >= 3 else z.shape[0]
    keep = None if mask is None else mask.detach().reshape(-1).to(device=z.device, dtype=torch.bool)
    lab = None
    if labels is not None:
        lab = labels.detach().reshape(-1).to(z.device)
        valid = lab != ignore_index
        keep = valid if keep is None else keep & valid
    if keep is not None and keep.numel() != z.shape[0]:
        raise GuardValueError(
            f"mask/labels have {keep.numel()} positions for {z.shape[0]} logit rows"
        )
    k = min(top_k, v)
    tops: list[torch.Tensor] = []
    top_ids: list[torch.Tensor] = []
    toks: list[torch.Tensor] = []
    for a in range(0, z.shape[0], chunk_rows):
        b = min(a + chunk_rows, z.shape[0])
        c = z[a:b]
        if keep is not None:
            c = c[keep[a:b]]
        if c.shape[0] == 0:
            continue
        c = c.float()
        lse = torch.logsumexp(c, dim=-1, keepdim=True)
        best = c.topk(k, dim=-1)
        tops.append(best.values - lse)
        top_ids.append(best.indices)
        if lab is not None:
            ids = lab[a:b][keep[a:b]] if keep is not None else lab[a:b]
            toks.append((c.gather(-1, ids.long().unsqueeze(-1)) - lse).squeeze(-1))
    rows = torch.arange(z.shape[0], device=z.device)
    rows = rows[keep] if keep is not None else rows
    return ReducedLogits(
        topk=torch.cat(tops) if tops else z.new_empty((0, k), dtype=torch.float32),
        token=(torch.cat(toks) if toks else z.new_empty((0,), dtype=torch.float32))
        if lab is not None
        else None,
        topk_ids=torch.cat(top_ids) if top_ids else z.new_empty((0, k), dtype=torch.long),
        token_ids=lab[keep].long() if lab is not None and keep is not None else lab,
        sample_index=rows // per_sample,
    )
