"""The fused distillation loss from full logits, with the guard's per-token signals from the same
pass over memory.

Why: a loop that holds both models' full logits computes its JSD/KL loss with two
``log_softmax`` float32 copies of ``[N, V]`` (tens of GB at V = 151936), and the guard then reads
the logits again for the teacher's scores and the student's entropy. :func:`distill_loss`
computes the loss and those signals together, and its backward recomputes from the logits: the
extra memory is a few ``[N]`` vectors on CUDA (Triton kernels) and one ``[chunk_rows, V]`` float32
block elsewhere (row chunks in PyTorch), never an ``[N, V]`` float32 tensor.

Convention (TRL's ``generalized_jsd_loss``, Liger's ``LigerJSD``, :mod:`distill_guard.signals`):
β is the weight of the *teacher* in the mixture m = (1−β)·p_student + β·p_teacher, and the loss is
(1−β)·KL(student‖m) + β·KL(teacher‖m), bounded by H(β). The ends are KL divergences, which have
no ceiling: β = 0 is the forward KL(teacher‖student), β = 1 the reverse KL(student‖teacher).
Temperature τ divides both models' logits (as TRL's GKD does); the loss is not multiplied by τ²
unless ``scale_by_temperature_squared`` (then tell the guard ``run.loss_scale = τ²``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from typing import Any

import torch

from distill_guard.errors import GuardTypeError, GuardValueError
from distill_guard.observations import LossKind, Metric, RunSpec
from distill_guard.signals import DEFAULT_CHUNK_ROWS, _row_chunks, _use_triton, jsd_ceiling

# Row indices of the [7, N] statistics (the Triton kernels' layout too).
_LSE_S, _LSE_T, _H_S, _H_T, _TOP1_T, _LOSS, _AUX = range(7)
_MODES = {LossKind.JSD: 0, LossKind.FORWARD_KL: 1, LossKind.REVERSE_KL: 2}
_FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)

log = logging.getLogger("distill_guard")


def loss_kind(beta: float) -> LossKind:
    """Which divergence β selects: the JSD inside (0, 1), forward KL at 0, reverse KL at 1."""
    if not 0.0 <= beta <= 1.0:
        raise GuardValueError(
            f"beta must lie in [0, 1] (the teacher's weight in the mixture), got {beta}"
        )
    if beta == 0.0:
        return LossKind.FORWARD_KL
    if beta == 1.0:
        return LossKind.REVERSE_KL
    return LossKind.JSD


@dataclass(frozen=True)
class DistillLoss:
    """The loss to optimise and, per position of the logits' leading shape, what the guard reads.

    Signals are at the loss's temperature (the model's own at τ = 1), detached, NaN at masked
    positions; :meth:`metrics` reduces them over the valid positions in one host transfer.
    """

    loss: torch.Tensor
    """Scalar: mean of :attr:`per_token` over valid positions (× τ² if asked); 0 with none."""
    per_token: torch.Tensor
    """Float32 divergence per position (0 where masked), differentiable w.r.t. the student."""
    valid: torch.Tensor
    """Bool, the positions that count (mask and labels ≠ ignore_index)."""
    student_entropy: torch.Tensor
    teacher_entropy: torch.Tensor
    teacher_top1_logprob: torch.Tensor
    """max log p_teacher: −ln V exactly when the teacher is uniform."""
    student_lse: torch.Tensor
    """logsumexp(student_logits / τ): what :func:`~distill_guard.signals.jsd_from_logits` takes
    to read the logits once."""
    teacher_lse: torch.Tensor
    kind: LossKind
    beta: float
    temperature: float
    scale: float
    """The factor on :attr:`loss` (τ² or 1): the guard's ``run.loss_scale``."""
    vocab_size: int
    """V, the logits' width: what a uniform :attr:`teacher_top1_logprob` (−ln V) is judged by."""

    @property
    def sample_index(self) -> torch.Tensor | None:
        """Each position's sample (its index along the logits' leading dim), for the guard's
        per-sample checks; None for ``[N, V]`` logits, whose rows are positions of no known
        sample."""
        lead = self.valid.shape
        if len(lead) < 2:
            return None
        index = torch.arange(lead[0], device=self.valid.device)
        return index.reshape(-1, *([1] * (len(lead) - 1))).expand(lead)

    @property
    def ceiling(self) -> float | None:
        """H(β), the JSD's bound; None for the KL ends."""
        return jsd_ceiling(self.beta)

    def metrics(self) -> dict[str, float]:
        """Means over the valid positions, keyed by guard metric roles where one exists:
        ``loss`` (per token, unscaled: compare with :attr:`ceiling` as is),
        ``student_entropy``, plus ``teacher_entropy``, ``teacher_top1_logprob`` and
        ``valid_tokens``."""
        v = self.valid.reshape(-1)
        n = v.sum()
        rows = torch.stack(
            [
                self.per_token.detach().reshape(-1),
                self.student_entropy.reshape(-1),
                self.teacher_entropy.reshape(-1),
                self.teacher_top1_logprob.reshape(-1),
            ]
        ).double()
        means = torch.where(v, rows, 0.0).sum(dim=1) / n
        loss, h_s, h_t, top1, count = torch.cat([means, n.double().reshape(1)]).tolist()
        return {
            Metric.LOSS: loss,
            Metric.STUDENT_ENTROPY: h_s,
            "teacher_entropy": h_t,
            "teacher_top1_logprob": top1,
            "valid_tokens": count,
        }


def distill_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    *,
    beta: float = 0.5,
    temperature: float = 1.0,
    mask: torch.Tensor | None = None,
    labels: torch.Tensor | None = None,
    ignore_index: int = -100,
    scale_by_temperature_squared: bool = False,
    inplace_backward: bool = False,
    backend: str = "auto",
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
) -> DistillLoss:
    """Generalized-JSD (or KL end) distillation loss over ``[..., V]`` logits, mean over valid
    positions, with the per-position signals of :class:`DistillLoss`.

    Gradients flow to ``student_logits`` only (the teacher is detached). ``mask`` (nonzero =
    keep) and ``labels`` have the logits' leading shape. bf16, fp16, fp32 (and on the PyTorch
    path fp64) logits; the gradient is in the student's dtype. ``inplace_backward`` writes the
    gradient into the student logits' own storage (no ``[N, V]`` allocation at all); use it only
    when nothing else needs those logits after the backward (autograd then refuses a later
    backward that would read them). ``backend``: ``"auto"`` (Triton on CUDA when importable),
    ``"triton"`` or ``"torch"`` (row chunks of ``chunk_rows``; fp64 always takes this path).
    """
    kind = loss_kind(beta)
    if not (math.isfinite(temperature) and temperature > 0):
        raise GuardValueError(f"temperature must be a finite number > 0, got {temperature}")
    if student_logits.shape != teacher_logits.shape:
        raise GuardValueError(
            f"student logits {tuple(student_logits.shape)} and teacher logits "
            f"{tuple(teacher_logits.shape)} must have the same shape"
        )
    if student_logits.dim() < 1 or student_logits.shape[-1] < 2:
        raise GuardValueError(
            f"logits must be [..., V] with V >= 2, got shape {tuple(student_logits.shape)}"
        )
    if student_logits.device != teacher_logits.device:
        raise GuardValueError(
            f"student logits on {student_logits.device}, teacher logits on {teacher_logits.device}"
        )
    for name, x in (("student", student_logits), ("teacher", teacher_logits)):
        if x.dtype not in _FLOAT_DTYPES:
            raise GuardTypeError(f"{name} logits must be bf16, fp16, fp32 or fp64, got {x.dtype}")
    lead = student_logits.shape[:-1]
    valid = _valid_positions(lead, student_logits.device, mask, labels, ignore_index)
    v = student_logits.shape[-1]
    triton = _use_triton(student_logits, backend) and student_logits.dtype != torch.float64
    per_row, h_s, h_t, top1, lse_s, lse_t = _FusedDivergence.apply(
        student_logits.reshape(-1, v),
        teacher_logits.detach().reshape(-1, v),
        valid.reshape(-1),
        beta,
        1.0 / temperature,
        triton,
        chunk_rows,
        inplace_backward,
    )
    loss = per_row.sum() / valid.sum().clamp_min(1)
    return _distill_loss_of_rows(
        loss, per_row, valid, (h_s, h_t, top1, lse_s, lse_t), lead,
        kind=kind, beta=beta, temperature=temperature,
        scale_by_temperature_squared=scale_by_temperature_squared, vocab_size=v,
    )  # fmt: skip


def _distill_loss_of_rows(
    mean: torch.Tensor,
    per_row: torch.Tensor,
    valid: torch.Tensor,
    signals: tuple[torch.Tensor, ...],
    lead: torch.Size,
    *,
    kind: LossKind,
    beta: float,
    temperature: float,
    scale_by_temperature_squared: bool,
    vocab_size: int,
) -> DistillLoss:
    """The :class:`DistillLoss` of a fused loss's flat results (what :func:`distill_loss` and
    :func:`~distill_guard.linear_loss.distill_loss_from_hidden` both return): the mean scaled
    by τ² if asked, the per-row outputs and ``signals`` (student and teacher entropy, teacher
    top-1, student and teacher log-normalisers) shaped like the logits' leading dims."""
    h_s, h_t, top1, lse_s, lse_t = (x.reshape(lead) for x in signals)
    scale = temperature**2 if scale_by_temperature_squared else 1.0
    return DistillLoss(
        loss=mean * scale if scale != 1.0 else mean,
        per_token=per_row.reshape(lead),
        valid=valid.reshape(lead),
        student_entropy=h_s,
        teacher_entropy=h_t,
        teacher_top1_logprob=top1,
        student_lse=lse_s,
        teacher_lse=lse_t,
        kind=kind,
        beta=float(beta),
        temperature=float(temperature),
        scale=scale,
        vocab_size=vocab_size,
    )


def _valid_positions(
    lead: torch.Size,
    device: torch.device,
    mask: torch.Tensor | None,
    labels: torch.Tensor | None,
    ignore_index: int,
) -> torch.Tensor:
    valid = torch.ones(lead, dtype=torch.bool, device=device)
    for name, x in (("mask", mask), ("labels", labels)):
        if x is None:
            continue
        if x.shape != lead:
            raise GuardValueError(
                f"{name} has shape {tuple(x.shape)}, the logits' leading shape is {tuple(lead)}"
            )
        x = x.detach().to(device)
        valid &= (x != ignore_index) if name == "labels" else x.to(torch.bool)
    return valid


class _FusedDivergence(torch.autograd.Function):
    """Per-row divergence and signals of ``[N, V]`` rows; the backward recomputes from the rows,
    keeping only ``[N]`` statistics between the passes."""

    @staticmethod
    def forward(ctx, student, teacher, valid, beta, inv_temp, triton, chunk_rows, inplace):
        mode = _MODES[loss_kind(beta)]
        if triton:
            stats = _triton_forward(student, teacher, valid, beta, inv_temp, mode)
        else:
            stats = _torch_forward(student, teacher, valid, beta, inv_temp, mode, chunk_rows)
        ctx.save_for_backward(student, teacher, valid, stats)
        ctx.config = (beta, inv_temp, mode, triton, chunk_rows, inplace)
        signals = tuple(stats[i].clone() for i in (_H_S, _H_T, _TOP1_T, _LSE_S, _LSE_T))
        ctx.mark_non_differentiable(*signals)
        return (stats[_LOSS].clone(), *signals)

    @staticmethod
    def backward(ctx, grad_rows, *_signal_grads):
        student, teacher, valid, stats = ctx.saved_tensors
        beta, inv_temp, mode, triton, chunk_rows, inplace = ctx.config
        # d loss_r / d student logits = grad_r · (1/τ) · ∂loss_r/∂(logits/τ); masked rows get 0
        weight = torch.where(valid, grad_rows.to(stats.dtype), 0.0) * inv_temp
        if mode == _MODES[LossKind.JSD]:
            weight = weight * (1.0 - beta)
        if inplace:
            out = student
            torch.autograd.graph.increment_version(student)
        else:
            out = torch.empty_like(student)
        if triton:
            from distill_guard.triton_kernels import triton_loss_grad

            triton_loss_grad(student, teacher, stats, weight, beta, inv_temp, mode, out)
        else:
            _torch_backward(student, teacher, stats, weight, beta, inv_temp, mode, chunk_rows, out)
        return out, None, None, None, None, None, None, None


def _triton_forward(student, teacher, valid, beta, inv_temp, mode) -> torch.Tensor:
    from distill_guard.triton_kernels import triton_jsd_given_lse, triton_loss_stats

    stats = triton_loss_stats(student, teacher, valid, inv_temp, mode)
    if mode == _MODES[LossKind.JSD]:
        triton_jsd_given_lse(
            student,
            teacher,
            stats[_LSE_S],
            stats[_LSE_T],
            beta,
            inv_temp=inv_temp,
            valid=valid,
            out=stats[_LOSS],
            aux=stats[_AUX],
        )
    fill = stats.new_tensor([math.nan] * 5 + [0.0, 0.0]).unsqueeze(1)
    return torch.where(valid, stats, fill)  # masked rows were not read


def _scaled(rows: torch.Tensor, index, dtype: torch.dtype, inv_temp: float) -> torch.Tensor:
    return rows[index].to(dtype) * inv_temp


def _torch_forward(student, teacher, valid, beta, inv_temp, mode, chunk_rows) -> torch.Tensor:
    """The statistics in row chunks over the valid rows, float32 (float64 for float64 input)."""
    dtype = torch.float64 if student.dtype == torch.float64 else torch.float32
    stats = torch.full((7, student.shape[0]), math.nan, dtype=dtype, device=student.device)
    stats[_LOSS] = 0.0
    stats[_AUX] = 0.0
    rows = valid.nonzero().squeeze(1)
    for a, b in _row_chunks(rows.numel(), chunk_rows):
        idx = rows[a:b]
        x, y = _scaled(student, idx, dtype, inv_temp), _scaled(teacher, idx, dtype, inv_temp)
        lse_s, lse_t = torch.logsumexp(x, dim=-1), torch.logsumexp(y, dim=-1)
        top1 = y.amax(dim=-1) - lse_t
        ls, lt = x.sub_(lse_s[:, None]), y.sub_(lse_t[:, None])
        ps, pt = ls.exp(), lt.exp()
        # p = 0 terms are 0 (a -inf logit); a NaN logit makes lse NaN, so NaNs still show
        stats[_H_S, idx] = -_xdot(ps, ls)
        stats[_H_T, idx] = -_xdot(pt, lt)
        stats[_LSE_S, idx], stats[_LSE_T, idx], stats[_TOP1_T, idx] = lse_s, lse_t, top1
        if mode == _MODES[LossKind.JSD]:
            lm = torch.logaddexp(ls + math.log1p(-beta), lt + math.log(beta))
            kl_s, kl_t = _xdot(ps, ls - lm), _xdot(pt, lt - lm)
            stats[_LOSS, idx] = (1.0 - beta) * kl_s + beta * kl_t
            stats[_AUX, idx] = kl_s
        elif mode == _MODES[LossKind.FORWARD_KL]:
            stats[_LOSS, idx] = _xdot(pt, lt - ls)
        else:
            stats[_LOSS, idx] = stats[_AUX, idx] = _xdot(ps, ls - lt)
    return stats


def _xdot(p: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Σ p·x per row, where terms with p = 0 count 0 (not 0·(±inf) = NaN); NaN stays NaN."""
    return torch.where(p == 0, 0.0, p * x).sum(dim=-1)


def _torch_backward(student, teacher, stats, weight, beta, inv_temp, mode, chunk_rows, out):
    rows = (weight != 0).nonzero().squeeze(1)
    if out is student:
        out[weight == 0] = 0
    else:
        out.zero_()
    for a, b in _row_chunks(rows.numel(), chunk_rows):
        idx = rows[a:b]
        x, y = (
            _scaled(student, idx, stats.dtype, inv_temp),
            _scaled(teacher, idx, stats.dtype, inv_temp),
        )
        ls, lt = x.sub_(stats[_LSE_S, idx, None]), y.sub_(stats[_LSE_T, idx, None])
        ps = ls.exp()
        if mode == _MODES[LossKind.JSD]:
            lm = torch.logaddexp(ls + math.log1p(-beta), lt + math.log(beta))
            g = torch.where(ps == 0, 0.0, ps * (ls - lm - stats[_AUX, idx, None]))
        elif mode == _MODES[LossKind.FORWARD_KL]:
            g = ps - lt.exp()
        else:
            g = torch.where(ps == 0, 0.0, ps * (ls - lt - stats[_AUX, idx, None]))
        out[idx] = (g * weight[idx, None]).to(out.dtype)
    return out


def run_stated_by(out: DistillLoss, run: RunSpec, *, learn_vocab_size: bool = True) -> RunSpec:
    """``run`` with the facts ``out`` states: its loss kind, β and scale (the loss the caller
    takes is the one to judge by; a disagreement is said at INFO), and V when unset."""
    facts: dict[str, Any] = {"loss": out.kind, "beta": out.beta, "loss_scale": out.scale}
    if learn_vocab_size and run.vocab_size is None:
        facts["vocab_size"] = out.vocab_size
    changed = {k: v for k, v in facts.items() if getattr(run, k) != v}
    if not changed:
        return run
    said = {k: getattr(run, k) for k in changed if k != "vocab_size"}
    if said:
        log.info(
            "distill_guard: the guard's run said %s, the loss handed to observe_distill_loss "
            "is %s; the guard judges by the loss's",
            said,
            {k: changed[k] for k in said},
        )
    return dataclasses.replace(run, **changed)
