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


def token_batches(steps: int, size: int = 4) -> list[dict[str, torch.Tensor]]:
    """``steps`` batches of ``size`` :func:`token_rows`, as a loader yields them."""
    rows = token_rows(size * steps)
    return [
        {k: torch.tensor([r[k] for r in rows[i : i + size]]) for k in rows[0]}
        for i in range(0, size * steps, size)
    ]


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


CHAT_SPECIALS = ("<pad>", "<|im_start|>", "<|im_end|>", "user", "assistant")
"""The tiny chat tokenizer's first ids; every other id is a word ``w<i>``."""


def tiny_tokenizer(vocab: int = VOCAB):
    """A word-level fast tokenizer over exactly ``vocab`` ids with a ChatML-like template, built
    offline (no download): ``<pad>`` pads, ``<|im_end|>`` ends a turn and is the EOS, as in Qwen."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = [*CHAT_SPECIALS, *(f"w{i}" for i in range(vocab - len(CHAT_SPECIALS)))]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<|im_end|>", model_max_length=128
    )
    tok.chat_template = (
        "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> "
        "{% endfor %}{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
    )
    return tok


def chat_rows(
    n: int = 64, prompt_len: int = 6, completion_len: int = 6, vocab: int = VOCAB, seed: int = 0
) -> list[dict]:
    """Conversations of random words for the tiny tokenizer: a user turn, an assistant turn.

    The assistant turn is ``completion_len`` words and ``<|im_end|>``: ``completion_len + 1``
    completion tokens."""
    g = torch.Generator().manual_seed(seed)
    lo = len(CHAT_SPECIALS)
    ids = torch.randint(lo, vocab, (n, prompt_len + completion_len), generator=g)

    def text(row: torch.Tensor) -> str:
        return " ".join(f"w{int(i) - lo}" for i in row)

    return [
        {
            "messages": [
                {"role": "user", "content": text(r[:prompt_len])},
                {"role": "assistant", "content": text(r[prompt_len:])},
            ]
        }
        for r in ids
    ]


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
