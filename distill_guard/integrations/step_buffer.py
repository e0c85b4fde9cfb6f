"""What the micro-batches of one optimizer step handed the guard, until the step is judged."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from distill_guard.errors import GuardValueError
from distill_guard.observations import TeacherScores


@dataclass
class StepScores:
    """One optimizer step's teacher scores and raw losses, joined over its micro-batches."""

    teacher: TeacherScores
    """The teacher's logprobs of every observed position (ids and samples where every
    micro-batch gave them), as :meth:`DistillGuard.on_teacher_scores` takes them."""
    losses: torch.Tensor | None = None
    """Raw micro-batch losses ``[b]``, as computed (before any filter or scaling)."""
    student_entropy: float | None = None
    """The student's mean entropy over the step's valid positions (fused loss only)."""


@dataclass
class _Rows:
    """Rows of one view (``[n]`` or ``[n, k]``) from several micro-batches."""

    parts: list[torch.Tensor] = field(default_factory=list)

    def add(self, rows: torch.Tensor | None) -> None:
        if rows is not None:
            self.parts.append(rows)

    @property
    def count(self) -> int:
        return sum(p.shape[0] for p in self.parts)

    def joined(self, rows: int) -> torch.Tensor | None:
        """All parts as one tensor; None when some micro-batch did not give this view (the
        positions of the others would not line up with the logprobs)."""
        if not self.parts:
            return None
        joined = torch.cat(self.parts)
        return joined if joined.shape[0] == rows else None


class StepBuffer:
    """Collects per micro-batch, hands one :class:`StepScores` per step (:meth:`joined`)."""

    def __init__(self) -> None:
        self.topk, self.topk_ids, self.samples = _Rows(), _Rows(), _Rows()
        """Top-k rows, their ids and their samples: one row per position."""
        self.token, self.token_ids = _Rows(), _Rows()
        """Sampled-token logprobs and the tokens: one entry per position."""
        self.losses: list[torch.Tensor] = []
        self.entropy: list[torch.Tensor] = []
        """``[sum, count]`` of the student's entropy per micro-batch (one host transfer when joined)."""

    @property
    def topk_width(self) -> int | None:
        """k of the top-k rows collected this step; None before any."""
        return int(self.topk.parts[0].shape[-1]) if self.topk.parts else None

    def add_scores(
        self,
        *,
        topk: torch.Tensor | None,
        topk_ids: torch.Tensor | None,
        token: torch.Tensor | None,
        token_ids: torch.Tensor | None,
        sample_index: torch.Tensor | None,
    ) -> None:
        """One micro-batch's rows (already masked); its samples are numbered after the step's last."""
        width = self.topk_width
        if topk is not None and width is not None and width != topk.shape[-1]:
            raise GuardValueError(
                f"top-k width changed within a step: {width} then {topk.shape[-1]}"
            )
        self.topk.add(topk)
        self.topk_ids.add(topk_ids)
        self.token.add(token)
        self.token_ids.add(token_ids)
        if sample_index is not None:
            last = self.samples.parts[-1] if self.samples.parts else None
            offset = int(last.max()) + 1 if last is not None and last.numel() else 0
            self.samples.add(sample_index + offset)

    def add_loss(self, loss: torch.Tensor) -> None:
        self.losses.append(loss)

    def add_entropy(self, total: torch.Tensor, count: torch.Tensor) -> None:
        self.entropy.append(torch.stack([total, count]))

    def joined(self, step: int) -> StepScores:
        """The step's scores, each view joined over the micro-batches."""
        topk_rows, token_rows = self.topk.count, self.token.count
        teacher = TeacherScores(
            step,
            token_logprobs=self.token.joined(token_rows),
            topk_logprobs=self.topk.joined(topk_rows),
            topk_ids=self.topk_ids.joined(topk_rows),
            token_ids=self.token_ids.joined(token_rows),
            sample_index=self.samples.joined(topk_rows),
        )
        return StepScores(
            teacher,
            losses=torch.stack(self.losses) if self.losses else None,
            student_entropy=_mean(self.entropy),
        )


def _mean(parts: list[torch.Tensor]) -> float | None:
    if not parts:
        return None
    total, count = torch.stack(parts).sum(dim=0).tolist()
    return total / count if count else None
