"""Tiny seeded models and data for the integration tests (CPU, a second or two per run): the
shipped stand-ins (:mod:`distill_guard.testing.standins`) under the names the tests use, and the
tests' own helpers."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from distill_guard.testing.standins import (  # noqa: F401 - the shipped stand-ins, named as here
    CHAT_SPECIALS,
    VOCAB,
    chat_rows,
    student_of,
    tiny_tokenizer,
    token_batches,
    token_rows,
)
from distill_guard.testing.standins import tiny_random_qwen3 as tiny_qwen3  # noqa: F401
from distill_guard.testing.standins import zero_weights as kill  # noqa: F401
from tests import _reference as reference


def jsd(student_logits, teacher_logits, mask, beta: float = 0.5) -> torch.Tensor:
    """Per-token generalized JSD, masked mean (TRL's GKD loss with ``beta``)."""
    per = reference.jsd(student_logits.float(), teacher_logits.float(), beta)
    m = mask.float()
    return (per * m).sum() / m.sum()


def params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(a[n], b[n]) for n in a)


def events(path: Path) -> list[dict]:
    if not Path(path).exists():
        return []
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def loud(records: list[logging.LogRecord]) -> list[str]:
    """WARNING-or-above records of the distill_guard logger."""
    return [
        r.getMessage()
        for r in records
        if r.name.startswith("distill_guard") and r.levelno >= logging.WARNING
    ]


def garble(teacher: torch.nn.Module, seed: int = 0) -> None:
    """Weights that are not the teacher's: every parameter replaced by Gaussian noise with that
    tensor's own mean and std. Statistically a teacher (still peaked, not uniform, finite), so
    only a comparison with the teacher's earlier outputs can tell."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in teacher.parameters():  # tied weights are one parameter: garbled once
            x = p.detach().float()
            std = float(x.std(correction=0)) if x.numel() > 1 else 0.0
            noise = torch.randn(p.shape, generator=g) * std + float(x.mean())
            p.copy_(noise.to(p.dtype))


class UpdateLedger:
    """Which optimizer steps changed the student, and which of those trained on a bad teacher.

    ``begin(step)`` at the start of each optimizer step (poisons the teacher at step ``at``, then
    snapshots the student), ``end(skipped)`` after the optimizer. A *poisoned update* is a step
    ``>= at`` (the teacher stays bad from ``at`` on) after which the student's parameters differ
    from the snapshot: an update taken on the bad teacher's scores."""

    def __init__(self, student: torch.nn.Module, teacher: torch.nn.Module, at=None, poison=None):
        self.student, self.teacher, self.at, self.poison = student, teacher, at, poison
        self.changed: dict[int, bool] = {}
        self.skipped: dict[int, bool] = {}
        self._step: int | None = None
        self._before: dict[str, torch.Tensor] = {}

    def begin(self, step: int) -> None:
        if self.at is not None and step == self.at and self.poison is not None:
            self.poison(self.teacher)
        self._step, self._before = step, params(self.student)

    def end(self, skipped: bool) -> None:
        assert self._step is not None, "end() without begin()"
        self.changed[self._step] = not same(self._before, params(self.student))
        self.skipped[self._step] = skipped
        self._step = None

    @property
    def poisoned(self) -> list[int]:
        """Steps whose update changed the student while the teacher was bad."""
        if self.at is None:
            return []
        return [s for s, c in sorted(self.changed.items()) if s >= self.at and c]
