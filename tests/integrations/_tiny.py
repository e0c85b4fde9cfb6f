"""Tiny seeded models and data for the integration tests (CPU, a second or two per run)."""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path

import torch

from tests import _reference as reference

VOCAB = 128


def tiny_qwen3(seed: int = 0, vocab: int = VOCAB, embed_std: float = 0.3) -> torch.nn.Module:
    """A 2-layer Qwen3 built from a config (no download), peaked like a trained teacher."""
    from distill_guard.testing.tiny import tiny_qwen3 as build

    return build(vocab_size=vocab, seed=seed, embed_std=embed_std, max_positions=128)


def student_of(teacher: torch.nn.Module, noise: float = 0.02, seed: int = 1) -> torch.nn.Module:
    """A student that starts near the teacher, as after SFT: a healthy JSD is far below ln 2."""
    student = copy.deepcopy(teacher)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in student.parameters():
            p.add_(torch.randn(p.shape, generator=g) * noise)
    return student.train()


def kill(teacher: torch.nn.Module) -> None:
    """What a colocated wake without weights backup leaves: every weight zero, a uniform output."""
    with torch.no_grad():
        for p in teacher.parameters():
            p.zero_()


def token_rows(n: int = 64, length: int = 12, vocab: int = VOCAB, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (n, length), generator=g)
    return [{"input_ids": r.tolist(), "attention_mask": [1] * length} for r in ids]


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
