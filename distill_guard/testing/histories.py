"""Seeded metric histories shaped like the runs of ``docs/invariants.md`` §1.5, under Relax's metric names.

For the demo, the docs and tests: a way to see what the guard says about a run without a run.
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Iterator
from pathlib import Path

QWEN3_VOCAB = 151936


def healthy_history(
    steps: int = 400, seed: int = 0, spike_step: int | None = 200
) -> Iterator[dict]:
    """Loss about 0.02 and slowly falling, entropy steady near 0.41, eval 0.347 → 0.51, one
    isolated one-step loss spike (a hard batch), truncation low."""
    rng = random.Random(seed)
    for t in range(steps):
        frac = t / max(steps - 1, 1)
        row = {
            "train/step": t,
            "train/loss": max(1e-4, 0.026 - 0.012 * frac + rng.gauss(0, 0.002)),
            "train/entropy_loss": 0.41 + rng.gauss(0, 0.015),
            "rollout/truncated_ratio": min(1.0, max(0.0, 0.04 + rng.gauss(0, 0.01))),
            "rollout/teacher_log_probs": -0.35 + rng.gauss(0, 0.02),
        }
        if t == spike_step:
            row["train/loss"] = 0.3
        if t % 5 == 0:
            row["eval/sciknoweval-biology"] = 0.347 + (0.51 - 0.347) * frac + rng.gauss(0, 0.005)
            row["eval/sciknoweval-biology-truncated_ratio"] = row["rollout/truncated_ratio"]
        yield row


def collapsed_history(steps: int = 189, seed: int = 0) -> Iterator[dict]:
    """The failed run: teacher uniform from step 0 (top-k mode, so no teacher metric is logged),
    loss 0.688 ≈ ln 2 falling to 1e-4 as the student turns uniform, entropy 0.41 → 3.56,
    truncation → 1, eval 0.361 → 0.011 → 0."""
    rng = random.Random(seed)
    for t in range(steps):
        frac = t / max(steps - 1, 1)
        row = {
            "train/step": t,
            "train/loss": 0.688 * math.exp(-t / 20.0) + 1e-4 * (1 + 0.1 * rng.random()),
            "train/entropy_loss": 0.41
            + (3.56 - 0.41) * (1 - math.exp(-4 * frac)) / (1 - math.exp(-4))
            + rng.gauss(0, 0.01),
            "rollout/truncated_ratio": min(
                1.0, 0.05 + 0.95 * min(1.0, 2 * frac) + rng.gauss(0, 0.01)
            ),
        }
        if t % 5 == 0:
            row["eval/sciknoweval-biology"] = max(0.0, 0.361 * math.exp(-t / 12.0))
        yield row


def uniform_teacher_history(
    steps: int = 50, seed: int = 0, vocab_size: int = QWEN3_VOCAB
) -> Iterator[dict]:
    """A student-sampled (per-token) run whose teacher is uniform from step 1: the logged mean
    teacher logprob is exactly −ln V."""
    for row in healthy_history(steps, seed, spike_step=None):
        if row["train/step"] >= 1:
            row["rollout/teacher_log_probs"] = -math.log(vocab_size)
        yield row


def write_jsonl(rows: Iterator[dict], path: str | os.PathLike[str]) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with p.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    return p
