"""The distillation loss from hidden states and the lm-head weights, chunked over rows so the
``[N, V]`` logits never exist whole, with the guard's signals from the same pass.

Why: a loop that keeps its models' last hidden states (TRL's ``use_liger_kernel``, a custom loop)
should not materialise two ``[N, V]`` logits tensors (2 × 5 GB at N = 16384, V = 151936 in
bf16) to take a JSD. :func:`distill_loss_from_hidden` forms ``[chunk, V]`` float32 logits with
the matmul (the bf16 rounding of the logits alone puts a bf16 path's gradient 1.5 % off float64),
reduces them with the kernels of :func:`~distill_guard.losses.distill_loss`, and forms the
gradients for the student's hidden states and head in the same pass (the mean's gradient,
scaled in the backward), accumulating the head's gradient in float32.

The teacher is given either as its hidden states and head (the full distribution) or as its
top-K logprobs and ids (what an SGLang teacher returns). With top-K, the teacher's distribution
is its K entries renormalised at the loss's temperature, zero elsewhere: the forward KL and the
JSD are exact for it (the JSD's tail, where the mixture is (1−β)·p_student, is summed in closed
form); the reverse KL is infinite there and refused. β, τ and the signals follow
:mod:`distill_guard.losses`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from distill_guard.errors import GuardTypeError, GuardValueError
from distill_guard.losses import (
    _AUX,
    _H_S,
    _H_T,
    _LOSS,
    _LSE_S,
    _LSE_T,
    _MODES,
    _TOP1_T,
    DistillLoss,
    _distill_loss_of_rows,
    _torch_backward,
    _torch_forward,
    _valid_positions,
    loss_kind,
)
from distill_guard.observations import LossKind
from distill_guard.signals import _use_triton

_HEAD_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_MAX_SPLITS = 64
MIN_CHUNK_ROWS, MAX_CHUNK_ROWS = 128, 512
"""Rows of float32 logits per chunk: about N/32 (what is held grows with the hidden states, as
Liger's), within these. A product of C rows does about C FLOP per byte of the head it reads:
from 128 rows the head's re-reads cost little time, and 512 is where the H200 stops gaining."""
_GROUP_CHUNKS = 4
"""Chunks of gradient rows per hidden-state-gradient and head-gradient matmul."""
GRAD_H_SLICE_COLS: int | None = 32768
"""Vocabulary columns per product of the hidden states' gradient on CUDA, the products summed in
float32. On an H200, one product over all of V (groups of 2048 rows at N = 4096 and 16384)
left that gradient 0.3 % further from float64 than the rounding of its rows to bf16 alone, on
every input tried (why is not established); in slices of 32768 it is at that rounding, at no
cost measurable beside run-to-run noise (benchmarks/RESULTS.md 11). None: one product."""
_MIN_SPLIT_COLS = 4096
"""The narrowest sub-row the kernels get: two blocks of 2048 columns."""


@dataclass(frozen=True)
class _Plan:
    """How one call runs: the divergence, the backend, the chunking and the dtypes."""

    beta: float
    inv_temp: float
    mode: int
    triton: bool
    chunk_rows: int
    grad_dtype: torch.dtype
    """The gradient rows' dtype: the head's on CUDA (the matmul takes them as they are), float32
    on the CPU."""
    float32_weight_grad: bool


def distill_loss_from_hidden(
    student_hidden: torch.Tensor,
    student_head: torch.Tensor,
    teacher_hidden: torch.Tensor | None = None,
    teacher_head: torch.Tensor | None = None,
    *,
    teacher_topk: tuple[torch.Tensor, torch.Tensor] | None = None,
    beta: float = 0.5,
    temperature: float = 1.0,
    mask: torch.Tensor | None = None,
    labels: torch.Tensor | None = None,
    ignore_index: int = -100,
    scale_by_temperature_squared: bool = False,
    float32_weight_grad: bool = False,
    chunk_rows: int | None = None,
    backend: str = "auto",
) -> DistillLoss:
    """Generalized-JSD (or KL end) distillation loss of ``student_hidden @ student_head.T``
    against the teacher, mean over valid positions, never holding ``[N, V]`` logits.

    ``student_hidden`` is ``[..., H]`` and ``student_head`` the lm-head weight ``[V, H]`` (same
    dtype: bf16, fp16 or fp32). The teacher is ``teacher_hidden [..., H_t]`` with
    ``teacher_head [V, H_t]``, or ``teacher_topk=(logprobs, ids)``, each ``[..., K]``, ids
    unique per row. Gradients flow to the student's hidden states and head through
    :attr:`DistillLoss.loss` only: they are formed during the forward (so :attr:`per_token` is
    detached here). The head's gradient is accumulated in the head's dtype, one rounding per
    group of 4 chunks (Liger's default rounds once per chunk); ``float32_weight_grad``
    accumulates it in one ``[V, H]`` float32 buffer instead, rounded once (the rounding floor,
    for twice the gradient's memory during the call; on CPU it is always float32). ``chunk_rows`` (default
    :func:`default_chunk_rows`: about N/32, in [128, 512]) bounds what is held at once to two
    ``[chunk_rows, V]`` float32 logits and ``[4 × chunk_rows, V]`` gradient rows in the head's
    dtype.
    ``backend`` as in :func:`~distill_guard.losses.distill_loss`. With top-K the teacher's
    signals are over its K entries: :attr:`DistillLoss.teacher_top1_logprob` is the largest
    logprob as given (−ln V for a uniform teacher), the teacher's entropy is that of the
    renormalised K, and :attr:`DistillLoss.teacher_lse` is NaN.
    """
    kind = loss_kind(beta)
    if not (math.isfinite(temperature) and temperature > 0):
        raise GuardValueError(f"temperature must be a finite number > 0, got {temperature}")
    v, h = _check_head("student", student_hidden, student_head)
    lead = student_hidden.shape[:-1]
    device = student_hidden.device
    if (teacher_topk is None) == (teacher_hidden is None and teacher_head is None):
        raise GuardValueError(
            "give the teacher as teacher_hidden with teacher_head, or as teacher_topk=(logprobs, "
            "ids); not both, not neither"
        )
    if teacher_topk is None:
        if teacher_hidden is None or teacher_head is None:
            raise GuardValueError("teacher_hidden and teacher_head go together")
        v_t, _ = _check_head("teacher", teacher_hidden, teacher_head)
        if v_t != v:
            raise GuardValueError(
                f"student head has V = {v} rows, teacher head V = {v_t}: the vocabularies differ"
            )
        if teacher_hidden.shape[:-1] != lead:
            raise GuardValueError(
                f"teacher hidden states {tuple(teacher_hidden.shape)} and student hidden states "
                f"{tuple(student_hidden.shape)} must share their leading shape"
            )
        teacher = (teacher_hidden.detach().reshape(-1, teacher_hidden.shape[-1]), teacher_head)
    else:
        if kind is LossKind.REVERSE_KL:
            raise GuardValueError(
                "the reverse KL (beta=1) of a top-K teacher is infinite (the student has mass "
                "where the teacher's K entries give none): use beta < 1 or the teacher's hidden "
                "states"
            )
        teacher = _check_topk(teacher_topk, lead, v, device)
    valid = _valid_positions(lead, device, mask, labels, ignore_index).reshape(-1)
    n = valid.numel()
    if chunk_rows is None:
        chunk_rows = default_chunk_rows(n)
    elif chunk_rows < 1:
        raise GuardValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    plan = _Plan(
        beta=float(beta),
        inv_temp=1.0 / temperature,
        mode=_MODES[kind],
        triton=_use_triton(student_hidden, backend),
        chunk_rows=chunk_rows,
        grad_dtype=student_head.dtype if student_head.is_cuda else torch.float32,
        float32_weight_grad=float32_weight_grad,
    )
    loss, per_row, h_s, h_t, top1, lse_s, lse_t = _FusedLinearDivergence.apply(
        student_hidden.reshape(-1, h), student_head, valid, plan, *teacher
    )
    return _distill_loss_of_rows(
        loss, per_row, valid, (h_s, h_t, top1, lse_s, lse_t), lead,
        kind=kind, beta=beta, temperature=temperature,
        scale_by_temperature_squared=scale_by_temperature_squared, vocab_size=v,
    )  # fmt: skip


def default_chunk_rows(rows: int) -> int:
    """The power of two nearest N/32 within [:data:`MIN_CHUNK_ROWS`, :data:`MAX_CHUNK_ROWS`],
    and no more than the rows there are."""
    chunk = 1 << max(0, round(math.log2(max(rows, 1) / 32)))
    return max(1, min(max(MIN_CHUNK_ROWS, min(chunk, MAX_CHUNK_ROWS)), rows))


def _check_head(name: str, hidden: torch.Tensor, head: torch.Tensor) -> tuple[int, int]:
    for what, x in (("hidden states", hidden), ("head", head)):
        if not isinstance(x, torch.Tensor):
            raise GuardTypeError(f"{name} {what} must be a torch.Tensor, got {type(x).__name__}")
        if x.dtype not in _HEAD_DTYPES:
            raise GuardTypeError(f"{name} {what} must be bf16, fp16 or fp32, got {x.dtype}")
    if head.dim() != 2 or head.shape[0] < 2:
        raise GuardValueError(
            f"{name} head must be the lm-head weight [V, H] with V >= 2, got {tuple(head.shape)}"
        )
    if hidden.dim() < 1 or hidden.shape[-1] != head.shape[1]:
        raise GuardValueError(
            f"{name} hidden states {tuple(hidden.shape)} must end in the head's H = {head.shape[1]}"
        )
    if hidden.dtype != head.dtype:
        raise GuardTypeError(
            f"{name} hidden states are {hidden.dtype}, its head {head.dtype}: cast one to the other"
        )
    if hidden.device != head.device:
        raise GuardValueError(f"{name} hidden states on {hidden.device}, its head on {head.device}")
    return head.shape[0], head.shape[1]


def _check_topk(topk, lead: torch.Size, vocab: int, device: torch.device):
    if not (isinstance(topk, (tuple, list)) and len(topk) == 2):
        raise GuardTypeError("teacher_topk must be a pair (logprobs [..., K], ids [..., K])")
    logprobs, ids = topk
    if logprobs.shape != ids.shape or logprobs.dim() < 1 or logprobs.shape[:-1] != lead:
        raise GuardValueError(
            f"teacher top-K logprobs {tuple(logprobs.shape)} and ids {tuple(ids.shape)} must both "
            f"be [..., K] over the hidden states' leading shape {tuple(lead)}"
        )
    if not logprobs.is_floating_point() or ids.is_floating_point() or ids.is_complex():
        raise GuardTypeError(
            f"teacher top-K logprobs must be floating and ids integer, got {logprobs.dtype} and "
            f"{ids.dtype}"
        )
    k = logprobs.shape[-1]
    if k < 1:
        raise GuardValueError("teacher top-K has K = 0 entries")
    ids = ids.detach().to(device).reshape(-1, k).long()
    low, high = torch.stack([ids.min(), ids.max()]).tolist() if ids.numel() else (0, 0)
    if low < 0 or high >= vocab:
        raise GuardValueError(f"teacher top-K ids span [{low}, {high}], outside [0, V = {vocab})")
    return logprobs.detach().to(device).reshape(-1, k).float(), ids


class _FusedLinearDivergence(torch.autograd.Function):
    """The loss over row chunks of ``hidden @ head.T``; the gradients of the mean are formed in
    the forward and scaled by the upstream gradient in the backward."""

    @staticmethod
    def forward(ctx, hidden, head, valid, plan, teacher_a, teacher_b):
        n = hidden.shape[0]
        topk = teacher_b.dtype == torch.long  # (logprobs, ids), else (hidden, head)
        stats = torch.full((7, n), math.nan, dtype=torch.float32, device=hidden.device)
        count = valid.sum().clamp_min(1).float()
        # the row gradients carry 1/τ and, for the JSD, 1 − β (the kernels' convention); the
        # mean's 1/n is applied to the accumulated gradients, in float32
        weight = torch.where(valid, plan.inv_temp, 0.0)
        if plan.mode == _MODES[LossKind.JSD]:
            weight = weight * (1.0 - plan.beta)
        s_head = _matmul_head(head)
        t_head = None if topk else _matmul_head(teacher_b)
        grads = _GradBuffers(
            hidden, head, s_head, ctx.needs_input_grad[0], ctx.needs_input_grad[1], plan, count
        )
        split = None
        if plan.triton and not topk:
            from distill_guard.kernels.split_rows import SplitRows

            split = SplitRows(n, _splits(plan.chunk_rows, head.shape[0]), valid, weight)
        for a in range(0, n, plan.chunk_rows):
            b = min(a + plan.chunk_rows, n)
            x = _logits(hidden[a:b], s_head)
            out = grads.rows_for(a, b)  # where this chunk's gradient rows go; None: not asked
            if topk:
                chunk = (x, teacher_a[a:b], teacher_b[a:b], valid[a:b], weight[a:b], plan, out)
                stats[:, a:b] = _topk_chunk(*chunk)
                continue
            y = _logits(teacher_a[a:b], t_head)
            if split is None:
                stats[:, a:b] = _torch_chunk(x, y, valid[a:b], weight[a:b], plan, out)
            else:
                split.chunk(x, y, a, plan.inv_temp, plan.beta, plan.mode, out)
            del x, y
        if split is not None:
            stats = _merged(split, n, plan.mode)
        grad_h, grad_w = grads.finish()
        ctx.save_for_backward(grad_h, grad_w)
        per_row = torch.where(valid, stats[_LOSS], 0.0)
        signals = tuple(
            torch.where(valid, stats[i], math.nan) for i in (_H_S, _H_T, _TOP1_T, _LSE_S, _LSE_T)
        )
        ctx.mark_non_differentiable(per_row, *signals)
        return (per_row.sum() / count, per_row, *signals)

    @staticmethod
    def backward(ctx, grad_mean, *_signal_grads):
        if getattr(ctx, "used", False):
            raise GuardValueError(
                "distill_loss_from_hidden forms its gradients in the forward and hands them to the "
                "first backward: a second backward through the same loss (retain_graph=True) is "
                "not supported; call distill_loss_from_hidden again"
            )
        ctx.used = True
        grad_h, grad_w = ctx.saved_tensors
        # one host read, so that the common upstream 1.0 costs nothing and any other factor is
        # applied in float32, in place (a copy would double the [V, H] gradient's memory)
        factor = float(grad_mean)
        for g in (grad_h, grad_w):
            if factor != 1.0 and g.numel():
                g.mul_(factor)
        return (
            grad_h if grad_h.numel() else None,
            grad_w if grad_w.numel() else None,
            None,
            None,
            None,
            None,
        )


class _GradBuffers:
    """The gradient rows of a group of chunks, and what they give when the group is full: the
    student's hidden-state gradient and the head's (accumulated in float32, or in the head's
    dtype). One matmul per group, not per chunk: accumulating into the ``[V, H]`` head gradient
    reads and writes all of it each time, so a chunk of a few hundred rows would be bound by
    that traffic, not by the matmul."""

    def __init__(self, hidden, head, s_head, need_h: bool, need_w: bool, plan: _Plan, count):
        n, v = hidden.shape[0], head.shape[0]
        self.hidden, self.s_head, self.out_dtype = hidden.detach(), s_head, head.dtype
        self.inv_count = 1.0 / count
        """1/n, the mean's factor, applied in float32 to what the row gradients give."""
        self.grad_h = torch.empty_like(hidden) if need_h else None
        w_dtype = torch.float32 if plan.float32_weight_grad or not head.is_cuda else head.dtype
        self.grad_w = torch.zeros(head.shape, dtype=w_dtype, device=head.device) if need_w else None
        group = min(n, plan.chunk_rows * _GROUP_CHUNKS)
        self.rows = (
            torch.empty(group, v, dtype=plan.grad_dtype, device=hidden.device)
            if need_h or need_w
            else None
        )
        self.start = 0  # the hidden-state row of the buffer's first row
        self.filled = 0

    def rows_for(self, a: int, b: int) -> torch.Tensor | None:
        """The buffer rows chunk ``[a, b)`` writes its gradient rows into (after a flush of the
        group before, when full); None when no gradient is asked."""
        if self.rows is None:
            return None
        if self.filled + (b - a) > self.rows.shape[0]:
            self._flush()
        out = self.rows[self.filled : self.filled + b - a]
        self.filled += b - a
        return out

    def _flush(self) -> None:
        m, a = self.filled, self.start
        if m == 0:
            return
        g, rows = self.rows[:m], self.hidden[a : a + m]
        if self.grad_h is not None:  # float32, rounded once to the hidden states' dtype
            self.grad_h[a : a + m] = _mm_sliced(g, self.s_head).mul_(self.inv_count)
        if self.grad_w is not None:
            if self.grad_w.dtype != torch.float32:  # in the head's dtype; 1/n carried by the rows
                self.grad_w.addmm_(g.t(), (rows.float() * self.inv_count).to(g.dtype))
            else:  # float32; 1/n applied in finish()
                _addmm_float32(self.grad_w, g.t(), rows)
        self.start, self.filled = a + m, 0

    def finish(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Both gradients of the mean in the inputs' dtypes; empty where not asked."""
        if self.rows is not None:
            self._flush()
        self.rows = None  # freed before the head's gradient is cast
        grad_h, grad_w = self.grad_h, self.grad_w
        self.grad_h = self.grad_w = None
        if grad_w is not None and grad_w.dtype == torch.float32:
            grad_w = grad_w.mul_(self.inv_count).to(self.out_dtype)
        empty = torch.empty(0)
        return (empty if grad_h is None else grad_h, empty if grad_w is None else grad_w)


def _matmul_head(head: torch.Tensor) -> torch.Tensor:
    """The head as the matmuls take it: as is on CUDA and in float32; a float32 copy on the CPU,
    which has no half-precision matmul into float32."""
    head = head.detach()
    return head if head.is_cuda or head.dtype == torch.float32 else head.float()


def _logits(hidden_rows: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
    """``hidden_rows @ head.T`` in float32 (accumulated in float32, never rounded to bf16)."""
    return _mm_float32(hidden_rows.detach(), head.t())


def _mm_float32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` as float32: half-precision operands into a float32 result on CUDA, float32
    operands elsewhere."""
    if a.dtype == torch.float32 and b.dtype == torch.float32:
        return torch.mm(a, b)
    if a.is_cuda:
        return torch.mm(a, b, out_dtype=torch.float32)
    return torch.mm(a.float(), b.float())


def _mm_sliced(g: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
    """``g @ head`` as float32, the contraction over V cut into :data:`GRAD_H_SLICE_COLS`
    slices on CUDA whose products are summed in float32."""
    k, v = GRAD_H_SLICE_COLS, g.shape[1]
    if not g.is_cuda or k is None or v <= k:
        return _mm_float32(g, head)
    out = _mm_float32(g[:, :k], head[:k])
    for a in range(k, v, k):
        _addmm_float32(out, g[:, a : a + k], head[a : a + k])
    return out


def _addmm_float32(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """``out += a @ b`` into float32 ``out``, as :func:`_mm_float32` forms the product."""
    if a.dtype == torch.float32 and b.dtype == torch.float32:
        out.addmm_(a, b)
    elif a.is_cuda:
        torch.addmm(out, a, b, out_dtype=torch.float32, out=out)
    else:
        out.addmm_(a.float(), b.float())


def _splits(rows: int, vocab: int) -> int:
    """Column splits per row for the row kernels: enough programs to fill the GPU (a kernel of a
    few hundred rows, one program each, draws a fraction of the bandwidth), each split a whole
    divisor of V of at least :data:`_MIN_SPLIT_COLS` columns."""
    s = 1
    while (
        s < _MAX_SPLITS
        and vocab % (2 * s) == 0
        and vocab // (2 * s) >= _MIN_SPLIT_COLS
        and rows * s < 2048
    ):
        s *= 2
    return s


def _torch_chunk(x, y, valid, weight, plan: _Plan, out: torch.Tensor | None) -> torch.Tensor:
    """Statistics ``[7, C]`` of float32 logits rows; their gradient rows into ``out``, if
    given (the PyTorch path of :func:`~distill_guard.losses.distill_loss`)."""
    stats = _torch_forward(x, y, valid, plan.beta, plan.inv_temp, plan.mode, x.shape[0])
    if out is not None:
        _torch_backward(x, y, stats, weight, plan.beta, plan.inv_temp, plan.mode, x.shape[0], out)
    return stats


def _merged(split, rows: int, mode: int) -> torch.Tensor:
    """``[7, N]`` statistics of whole rows from the Triton path's sub-row partials."""
    stats = _merge_sub_rows(split.stats.view(7, rows, split.splits), mode)
    if mode == _MODES[LossKind.JSD]:
        stats[_LOSS], stats[_AUX] = split.jsd.view(2, rows, split.splits).sum(2)
    return stats


def _merge_sub_rows(sub: torch.Tensor, mode: int) -> torch.Tensor:
    """``[7, C]`` statistics of whole rows from those of their ``S`` sub-rows ``[7, C, S]``:
    each sub-row's share of a row's mass is exp(lse_i − lse)."""
    lse_s_i, lse_t_i, h_s_i, h_t_i, top1_i, loss_i = sub[0], sub[1], sub[2], sub[3], sub[4], sub[5]
    lse_s, lse_t = torch.logsumexp(lse_s_i, 1), torch.logsumexp(lse_t_i, 1)
    w_s, w_t = (lse_s_i - lse_s[:, None]).exp(), (lse_t_i - lse_t[:, None]).exp()

    def mean(w, x):  # Σ_i w_i·x_i, a sub-row of no mass counting 0
        return torch.where(w == 0, 0.0, w * x).sum(1)

    stats = torch.empty(sub.shape[:2], dtype=sub.dtype, device=sub.device)
    stats[_LSE_S], stats[_LSE_T] = lse_s, lse_t
    stats[_H_S] = lse_s - mean(w_s, lse_s_i - h_s_i)  # H = lse − E[x]
    stats[_H_T] = lse_t - mean(w_t, lse_t_i - h_t_i)
    max_t = torch.where(lse_t_i == -math.inf, -math.inf, top1_i + lse_t_i)  # a row's largest y
    stats[_TOP1_T] = max_t.amax(1) - lse_t
    stats[_LOSS] = stats[_AUX] = 0.0
    if mode == _MODES[LossKind.FORWARD_KL]:  # E_t[y − x] − lse_t + lse_s
        stats[_LOSS] = mean(w_t, loss_i + lse_t_i - lse_s_i) - lse_t + lse_s
    elif mode == _MODES[LossKind.REVERSE_KL]:  # E_s[x − y] − lse_s + lse_t
        stats[_LOSS] = mean(w_s, loss_i + lse_s_i - lse_t_i) - lse_s + lse_t
    if mode != _MODES[LossKind.JSD]:
        stats[_AUX] = stats[_LOSS]
    return stats


def _topk_chunk(x, logprobs, ids, valid, weight, plan: _Plan, out) -> torch.Tensor:
    """Statistics against a teacher known on K ids per row (its K logprobs renormalised at the
    loss's temperature, zero elsewhere); the gradient rows into ``out``, if given.

    Off the K ids the gradient is the student's probabilities times one factor per row (the
    JSD's tail, the forward KL's 1). On the Triton path
    (:func:`~distill_guard.kernels.topk.triton_topk_chunk`) that is one read of ``x`` for its
    statistics and one more for the gradient rows; here, PyTorch ops on a float32 copy.
    """
    if plan.triton:
        from distill_guard.kernels.topk import triton_topk_chunk

        return triton_topk_chunk(
            x, logprobs, ids, valid, weight, inv_temp=plan.inv_temp, beta=plan.beta,
            mode=plan.mode, splits=_splits(x.shape[0], x.shape[1]), out=out,
        )  # fmt: skip
    c = x.shape[0]
    x.mul_(plan.inv_temp)
    lse_s = torch.logsumexp(x, dim=-1)
    ls = x.sub_(lse_s[:, None])  # log p_student, in place of the logits
    ps = ls.exp()
    lt = torch.log_softmax(logprobs * plan.inv_temp, dim=-1)
    pt = lt.exp()
    ls_k = ls.gather(1, ids)
    ps_k = ls_k.exp()
    stats = torch.full((7, c), math.nan, dtype=torch.float32, device=x.device)
    stats[_LSE_S] = lse_s
    stats[_H_S] = torch.special.entr(ps).sum(-1)
    stats[_H_T] = torch.special.entr(pt).sum(-1)
    stats[_TOP1_T] = logprobs.amax(-1)
    if plan.mode == _MODES[LossKind.JSD]:
        beta = plan.beta
        tail = -math.log1p(-beta)  # log(p_s / m) where the teacher has no mass
        lm_k = torch.log((1.0 - beta) * ps_k + beta * pt)
        kl_s = torch.where(ps_k == 0, 0.0, ps_k * (ls_k - lm_k)).sum(-1)
        kl_s = kl_s + (1.0 - ps_k.sum(-1)).clamp_min(0.0) * tail
        kl_t = torch.where(pt == 0, 0.0, pt * (lt - lm_k)).sum(-1)
        stats[_LOSS] = (1.0 - beta) * kl_s + beta * kl_t
        stats[_AUX] = kl_s
        if out is None:
            return stats
        # ∂JSD/∂x_j = (1−β)·p_j·(log(p_j/m_j) − KL(s‖m)); (1−β)/τ is in the weight
        g = ps.mul_((tail - kl_s)[:, None])
        g.scatter_(1, ids, torch.where(ps_k == 0, 0.0, ps_k * (ls_k - lm_k - kl_s[:, None])))
    else:  # forward KL(t‖s) = Σ_k p_t,k·(log p_t,k − log p_s,k); ∂/∂x = p_s − p_t
        stats[_LOSS] = stats[_AUX] = torch.where(pt == 0, 0.0, pt * (lt - ls_k)).sum(-1)
        if out is None:
            return stats
        g = ps.scatter_add_(1, ids, -pt)
    out.copy_(g.mul_(weight[:, None]).masked_fill_(~valid[:, None], 0.0))
    return stats
