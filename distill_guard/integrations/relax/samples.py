"""Relax's ``Sample`` as the guard reads and edits it: teacher values, masks, the teacher's input.

Field names are Relax's (``docs/relax.md`` §1.2, §1.4): ``teacher_log_probs`` (student_sampled),
``opd_topk_teacher_log_probs`` / ``opd_topk_token_ids`` / ``opd_topk_ksz`` (top-K modes),
``opd_sample_mask`` (SDPO), ``loss_mask`` / ``remove_sample`` (every line), and the OPSD/SDPO
teacher input ``teacher_tokens`` + ``response_length``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from distill_guard.extras import needed

if TYPE_CHECKING:
    import numpy as np

TOKEN_FIELD = "teacher_log_probs"
TOPK_FIELD = "opd_topk_teacher_log_probs"
TOPK_IDS_FIELD = "opd_topk_token_ids"
TOPK_LEN_FIELD = "opd_topk_ksz"
SAMPLE_MASK_FIELD = "opd_sample_mask"


@dataclass
class TeacherValues:
    """One sample's teacher values under its loss mask: ``[R]`` token logprobs and/or ``[R, K]``
    top-K rows (entries past a union row's length are −inf)."""

    token: torch.Tensor | None
    topk: torch.Tensor | None
    topk_own: bool = True
    """Whether the top-K rows are the teacher's own top-K (:func:`as_judged`)."""

    @property
    def empty(self) -> bool:
        return (self.token is None or self.token.numel() == 0) and (
            self.topk is None or self.topk.numel() == 0
        )


def numeric(values: Any) -> np.ndarray:
    """A list, numpy array or tensor of numbers as float32 (``None`` entries as NaN)."""
    np = _numpy()
    if isinstance(values, torch.Tensor):
        return values.detach().float().cpu().numpy()
    try:
        return np.asarray(values, dtype=np.float32)
    except (TypeError, ValueError):
        return np.asarray([math.nan if v is None else float(v) for v in values], dtype=np.float32)


def _numpy():
    """numpy, which every Relax install has (distill_guard's core does not need it)."""
    with needed("the Relax integration", package="numpy"):
        import numpy
    return numpy


def topk_rows(values: Any, ksz: Any = None) -> torch.Tensor:
    """``[R, K]`` float32 top-K rows; entries past a row's valid length (union mode) become −inf."""
    rows = torch.as_tensor(numeric(values), dtype=torch.float32)
    if rows.dim() == 1:
        rows = rows.reshape(1, -1) if rows.numel() else rows.reshape(0, 0)
    if ksz is not None:
        valid = torch.as_tensor(numeric(ksz)).reshape(-1, 1)
        cols = torch.arange(rows.shape[1]).reshape(1, -1)
        if valid.shape[0] == rows.shape[0]:
            rows = torch.where(cols < valid, rows, torch.full_like(rows, -math.inf))
    return rows


MASKED_BY_GUARD = "_distill_guard_unmasked"
"""Set on a sample the guard masked: its ``(loss_mask, remove_sample, opd_sample_mask)`` before,
so a sample re-scored by a repaired teacher can be given back to the loss."""


def token_mask(sample: Any) -> torch.Tensor | None:
    """The positions the loss uses, as they were before the guard masked the sample."""
    saved = getattr(sample, MASKED_BY_GUARD, None)
    m = saved[0] if saved is not None else getattr(sample, "loss_mask", None)
    if m is None:
        return None
    return torch.as_tensor(numeric(m)).reshape(-1) > 0


def as_judged(values: TeacherValues, selection: str) -> TeacherValues:
    """The values as the teacher checks must read them. Under ``student_topk`` a top-K row is
    the teacher's logprobs of the *student's* ids, not its own top-K: a dead teacher still puts
    every entry at −ln V, but the row's best entry is no teacher top-1 (``topk_own``).
    ``teacher_topk`` and ``union`` rows hold the teacher's own top-K."""
    return dataclasses.replace(values, topk_own=selection != "student_topk")


def teacher_values(sample: Any, selection: str = "student_sampled") -> TeacherValues:
    """The sample's teacher values at the positions its loss mask keeps, as the checks read
    them under ``--opd-token-selection selection`` (:func:`as_judged`)."""
    return as_judged(_raw_values(sample), selection)


def _raw_values(sample: Any) -> TeacherValues:
    mask = token_mask(sample)
    token = getattr(sample, TOKEN_FIELD, None)
    t = None
    if token is not None and len(token):
        t = torch.as_tensor(numeric(token), dtype=torch.float32).reshape(-1)
        if mask is not None and mask.numel() == t.numel():
            t = t[mask]
    top = getattr(sample, TOPK_FIELD, None)
    rows = None
    if top is not None and len(top):
        rows = topk_rows(top, getattr(sample, TOPK_LEN_FIELD, None))
        if mask is not None and mask.numel() == rows.shape[0]:
            rows = rows[mask]
    return TeacherValues(t, rows)


def stack(values: Iterable[TeacherValues]) -> TeacherValues:
    """Several samples' values as one batch (top-K rows padded to the widest K with −inf)."""
    values = list(values)
    tokens = [v.token for v in values if v.token is not None]
    tops = [v.topk for v in values if v.topk is not None and v.topk.numel()]
    topk = None
    if tops:
        k = max(r.shape[1] for r in tops)
        topk = torch.cat(
            [torch.nn.functional.pad(r, (0, k - r.shape[1]), value=-math.inf) for r in tops]
        )
    own = all(v.topk_own for v in values)
    return TeacherValues(torch.cat(tokens) if tokens else None, topk, own)


def mask_out(samples: Iterable[Any]) -> int:
    """Keep samples out of every loss term of the step: ``remove_sample`` (Relax zeroes the
    ``loss_mask`` when it converts the sample), a zero ``loss_mask`` now, and
    ``opd_sample_mask = False`` where the sample has one (SDPO). Returns how many."""
    n = 0
    for s in samples:
        if getattr(s, MASKED_BY_GUARD, None) is None:
            lm = getattr(s, "loss_mask", None)
            saved = (
                list(lm) if lm is not None and not isinstance(lm, torch.Tensor) else lm,
                getattr(s, "remove_sample", None),
                getattr(s, SAMPLE_MASK_FIELD, None),
            )
            setattr(s, MASKED_BY_GUARD, saved)
        if hasattr(s, "remove_sample"):
            s.remove_sample = True
        lm = getattr(s, "loss_mask", None)
        if lm is not None:
            s.loss_mask = lm * 0 if isinstance(lm, torch.Tensor) else [0] * len(lm)
        if hasattr(s, SAMPLE_MASK_FIELD):
            setattr(s, SAMPLE_MASK_FIELD, False)
        n += 1
    return n


JUDGED_BY_GUARD = "_distill_guard_judged"
"""Set on every sample the gate judged: ``{"step", "dead", "rescored"}``."""


def mark_judged(sample: Any, step: int, *, dead: bool, rescored: bool) -> None:
    setattr(sample, JUDGED_BY_GUARD, {"step": step, "dead": dead, "rescored": rescored})


def judgement(sample: Any) -> dict[str, Any] | None:
    """What the gate found on the sample (None: it never passed the gate)."""
    return getattr(sample, JUDGED_BY_GUARD, None)


def masked_by_guard(sample: Any) -> bool:
    return getattr(sample, MASKED_BY_GUARD, None) is not None


def out_of_loss(sample: Any) -> bool:
    """Whether the sample adds nothing to the loss: removed, a zero loss mask, or (SDPO) its
    ``opd_sample_mask`` off."""
    if getattr(sample, "remove_sample", False) or getattr(sample, SAMPLE_MASK_FIELD, None) is False:
        return True
    lm = getattr(sample, "loss_mask", None)
    return lm is not None and not bool((torch.as_tensor(numeric(lm)) > 0).any())


def unmask(sample: Any) -> bool:
    """Give a sample the guard masked back to the loss, as it was; False if it was not masked."""
    saved = getattr(sample, MASKED_BY_GUARD, None)
    if saved is None:
        return False
    loss_mask, remove_sample, sample_mask = saved
    sample.loss_mask = loss_mask
    if remove_sample is not None:
        sample.remove_sample = remove_sample
    if hasattr(sample, SAMPLE_MASK_FIELD):
        setattr(sample, SAMPLE_MASK_FIELD, sample_mask)
    delattr(sample, MASKED_BY_GUARD)
    return True


def teacher_inputs(sample: Any) -> tuple[list[int], int]:
    """The ids the teacher scored and ``logprob_start_len``, as Relax built them
    (``OpdManager._teacher_prefill``): OPSD/SDPO score ``teacher_tokens`` (the teacher's own
    prompt + the response) from ``len(teacher_tokens) - response_length - 1``; plain OPD scores
    ``rollout_tokens or tokens`` from ``len(tokens) - response_length - 1``."""
    r = int(sample.response_length)
    teacher_tokens = getattr(sample, "teacher_tokens", None)
    if teacher_tokens:
        ids = [int(t) for t in teacher_tokens]
        return ids, max(len(ids) - r - 1, 0)
    ids = [int(t) for t in (getattr(sample, "rollout_tokens", None) or sample.tokens)]
    return ids, max(len(sample.tokens) - r - 1, 0)


def like(original: Any, values: torch.Tensor) -> Any:
    """``values`` in the container type of ``original`` (list, numpy array or tensor)."""
    if isinstance(original, torch.Tensor):
        return values.to(dtype=original.dtype, device=original.device)
    if type(original).__module__ == "numpy" and hasattr(original, "dtype"):
        return values.cpu().numpy().astype(original.dtype, copy=False)
    return values.tolist()


def put(sample: Any, name: str, values: torch.Tensor) -> None:
    """Write ``values`` into the sample's field ``name``, in the container type it has."""
    original = getattr(sample, name, None)
    setattr(sample, name, like(original, values) if original is not None else values.tolist())


def truncated_ratio(samples: Sequence[Any]) -> float | None:
    flags = []
    for s in samples:
        status = getattr(s, "status", None)
        if status is None:
            continue
        name = getattr(status, "name", None) or getattr(status, "value", None) or str(status)
        flags.append("truncat" in str(name).lower())
    return sum(flags) / len(flags) if flags else None
