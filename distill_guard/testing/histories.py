"""Seeded metric histories shaped like the runs of ``docs/invariants.md`` §1.5, under Relax's metric names
(:func:`renamed` gives them under any other known convention's).

For the demo, the docs and tests: a way to see what the guard says about a run without a run.
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Iterable, Iterator
from pathlib import Path

from distill_guard.errors import GuardValueError
from distill_guard.metric_names import CONVENTIONS, RELAX, resolve_key
from distill_guard.observations import Metric

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


SEED_SHAPES = ("saturating", "linear")
"""How :func:`seed_history`'s entropy rises."""


def seed_history(steps: int = 190, seed: int = 0, shape: str = "saturating") -> Iterator[dict]:
    """The failed run of issue 23, under Relax's names: ``train/loss`` 0.688 at step 0, then
    falling fast (below 0.95·ln 2 = 0.6585 from step 1) toward 1e-4; ``train/entropy_loss``
    0.42 → 3.49 (``shape`` "saturating": :func:`collapsed_history`'s curve; "linear": a straight
    line); ``rollout/truncated_ratio`` 0.06 → 1.0; ``eval/sciknoweval-biology`` every 10 steps,
    0.361 at step 0, 0.011 at step 10 and 0.0 after; no teacher logprob column (top-k mode).
    Small seeded noise on the loss, entropy and truncation; step 0's loss is exact."""
    if shape not in SEED_SHAPES:
        raise GuardValueError(f"shape must be one of {', '.join(SEED_SHAPES)}, got {shape!r}")
    rng = random.Random(seed)
    for t in range(steps):
        frac = t / max(steps - 1, 1)
        rise = (1 - math.exp(-4 * frac)) / (1 - math.exp(-4)) if shape == "saturating" else frac
        loss = 0.688 * math.exp(-t / 12.0) + 1e-4
        row = {
            "train/step": t,
            "train/loss": 0.688 if t == 0 else max(1e-5, loss * (1 + rng.gauss(0, 0.005))),
            "train/entropy_loss": 0.42 + (3.49 - 0.42) * rise + rng.gauss(0, 0.01),
            "rollout/truncated_ratio": min(
                1.0, max(0.0, 0.06 + 0.94 * min(1.0, 2 * frac) + rng.gauss(0, 0.005))
            ),
        }
        if t % 10 == 0:
            row["eval/sciknoweval-biology"] = {0: 0.361, 10: 0.011}.get(t, 0.0)
        yield row


def renamed(rows: Iterable[dict], convention: str) -> Iterator[dict]:
    """The same rows under another convention's names (a key of
    :data:`~distill_guard.metric_names.CONVENTIONS`: "trl" for TRL as wandb records it, "hf"
    for its raw logs, "lightning", "demo", "slime", "miles", "relax"), for tests of every
    convention: each Relax column becomes the convention's first name for its role, the step
    column its step key; a column the convention has no name for (TRL's teacher logprob, an
    eval truncation ratio) is left out, and a pattern (slime's ``eval/*``) keeps the key."""
    target = CONVENTIONS[convention]
    step_key = RELAX.step_key
    keeps_eval = "*" in target.names.get(Metric.EVAL_ACCURACY, ("",))[0]
    for row in rows:
        out: dict = {}
        for key, value in row.items():
            if key == step_key:
                out[target.step_key] = value
                continue
            role = next(
                (r for r, names in RELAX.names.items() if resolve_key(names[0], [key])), None
            )
            if role is None:
                if keeps_eval or not key.startswith("eval/"):
                    out[key] = value  # the eval truncation ratio only where eval/* is read
            elif role in target.names:
                name = target.names[role][0]
                out[key if "*" in name else name] = value
        yield out


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
