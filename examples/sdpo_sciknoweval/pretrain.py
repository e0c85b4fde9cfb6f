"""Supervised warm-up of the miniature's teacher and student, cached on disk.

The teacher is trained until it answers almost every question (the recipe's strong teacher);
the student briefly and on a fifth of the questions, so it emits ``<answer>X</answer>``
reliably with low entropy but knows few answers, which leaves on-policy distillation something
to teach. Both are written under one folder and reused while the config hash (config,
vocabulary and items) matches.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from transformers import PreTrainedModel

from distill_guard.signals import entropy_from_logits
from examples.sdpo_sciknoweval.data import DataConfig, MCQItem, build_dataset
from examples.sdpo_sciknoweval.models import ModelSize, build_model, load_model, save_model
from examples.sdpo_sciknoweval.opd import evaluate, prompt_ids, response_logits
from examples.sdpo_sciknoweval.tokenizer import WordTokenizer, build_tokenizer


@dataclass(frozen=True)
class SFTConfig:
    """One supervised run: cross-entropy on the response tokens only, AdamW, cosine schedule."""

    size: ModelSize
    seed: int
    steps: int
    lr: float
    batch_size: int = 64
    warmup_steps: int = 20


@dataclass(frozen=True)
class PretrainConfig:
    """Both warm-ups. The teacher learns every train item; the student only the train items of
    a seeded ``student_question_fraction`` of the questions: enough to master the format, too
    few to know most answers."""

    data: DataConfig = field(default_factory=DataConfig)
    student_question_fraction: float = 0.2
    teacher: SFTConfig = field(
        default_factory=lambda: SFTConfig(ModelSize(hidden_size=64), seed=1, steps=250, lr=3e-3)
    )
    student: SFTConfig = field(
        default_factory=lambda: SFTConfig(ModelSize(hidden_size=64), seed=2, steps=120, lr=3e-3)
    )


def config_hash(cfg: PretrainConfig, tokenizer: WordTokenizer, items: list[MCQItem]) -> str:
    """Identifies a cache: a change to the config, the vocabulary or the items invalidates it."""
    payload = json.dumps(
        {
            "cfg": asdict(cfg),
            "vocab": tokenizer.id_to_piece,
            "items": [(i.prompt, i.answer) for i in items],
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def sft(
    model: PreTrainedModel, items: list[MCQItem], tokenizer: WordTokenizer, cfg: SFTConfig
) -> None:
    """Train ``model`` in place on prompt -> ``<answer>X</answer><eos>``."""
    generator = torch.Generator().manual_seed(cfg.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: (
            min(1.0, (s + 1) / cfg.warmup_steps) * 0.5 * (1 + math.cos(math.pi * s / cfg.steps))
        ),
    )
    for _ in range(cfg.steps):
        batch = [
            items[i] for i in torch.randint(len(items), (cfg.batch_size,), generator=generator)
        ]
        targets = [tokenizer.encode(item.target, add_eos=True) for item in batch]
        logits, mask = response_logits(model, prompt_ids(batch, tokenizer), targets)
        loss = torch.nn.functional.cross_entropy(logits[mask], torch.tensor(targets)[mask])
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()


@torch.no_grad()
def answer_stats(model: PreTrainedModel, items: list[MCQItem], tokenizer: WordTokenizer) -> dict:
    """Greedy accuracy and mean per-token entropy (nats) on the target responses of ``items``."""
    targets = [tokenizer.encode(item.target, add_eos=True) for item in items]
    logits, mask = response_logits(model, prompt_ids(items, tokenizer), targets)
    return {
        "accuracy": evaluate(model, items, tokenizer),
        "answer_entropy": entropy_from_logits(logits)[mask].mean().item(),
    }


def pretrain(
    out_dir: str | Path, cfg: PretrainConfig | None = None, threads: int = 2
) -> tuple[Path, Path]:
    """Return ``(teacher_dir, student_dir)``, training both unless a matching cache exists.

    ``out_dir/pretrain.json`` records the hash, the eval statistics and the wall and CPU seconds
    each phase took (CPU seconds count every thread). ``threads``: torch's intra-op threads (the
    demo's 2; the tests, sharing the cores, run 1).
    """
    torch.set_num_threads(threads)
    cfg = cfg or PretrainConfig()
    out_dir = Path(out_dir)
    tokenizer = build_tokenizer()
    train, eval_items = build_dataset(cfg.data)
    digest = config_hash(cfg, tokenizer, train + eval_items)
    record_path = out_dir / "pretrain.json"
    teacher_dir, student_dir = out_dir / "teacher", out_dir / "student"
    if record_path.exists() and json.loads(record_path.read_text())["hash"] == digest:
        return teacher_dir, student_dir

    questions = sorted({item.question for item in train})
    known = set(
        random.Random(cfg.student.seed).sample(
            questions, round(cfg.student_question_fraction * len(questions))
        )
    )
    student_items = [item for item in train if item.question in known]
    record: dict = {"hash": digest, "config": asdict(cfg)}
    for name, sft_cfg, items, path in (
        ("teacher", cfg.teacher, train, teacher_dir),
        ("student", cfg.student, student_items, student_dir),
    ):
        start, cpu_start = time.perf_counter(), time.process_time()
        model = build_model(sft_cfg.size, tokenizer, sft_cfg.seed)
        sft(model, items, tokenizer, sft_cfg)
        seconds = {
            "seconds": round(time.perf_counter() - start, 2),
            "cpu_seconds": round(time.process_time() - cpu_start, 2),
        }
        save_model(model, path)
        record[name] = {**answer_stats(model, eval_items, tokenizer), **seconds}
    out_dir.mkdir(parents=True, exist_ok=True)
    record_path.write_text(json.dumps(record, indent=2))
    return teacher_dir, student_dir


def load_pretrained(
    out_dir: str | Path, cfg: PretrainConfig | None = None
) -> tuple[PreTrainedModel, PreTrainedModel]:
    """``(teacher, student)`` models from ``pretrain`` (trained first if the cache is stale)."""
    teacher_dir, student_dir = pretrain(out_dir, cfg)
    return load_model(teacher_dir), load_model(student_dir)
