"""The seed run's shape (docs/invariants.md §1.5), written out for the student-signal checks:
a teacher dead from step 0, so every step the run produces is already the failure's."""

from __future__ import annotations

import math
import random

STEPS = 190
LN2 = math.log(2)


def seed_loss(t: int) -> float:
    """0.688 at step 0 (the JSD ceiling's critical), below 95 % of ln 2 from step 1, → 1e-4."""
    return 0.688 * math.exp(-t / 12.0) + 1e-4


def seed_entropy(shape: str, steps: int = STEPS, noise: float = 0.0, seed: int = 0) -> list:
    """0.42 → 3.49 nats over 190 steps: ``saturating`` (as ``collapsed_history``) or ``line``."""
    rng = random.Random(seed)
    out = []
    for t in range(steps):
        u = t / (STEPS - 1)
        frac = (1 - math.exp(-4 * u)) / (1 - math.exp(-4)) if shape == "saturating" else u
        out.append(0.42 + (3.49 - 0.42) * frac + (rng.gauss(0, noise) if noise else 0.0))
    return out


def seed_truncation(t: int) -> float:
    """0.06 → 1.0 over the first half of the run."""
    return min(1.0, 0.06 + 0.94 * t / 95)


SEED_EVALS = {0: 0.361, 10: 0.011, 20: 0.0, 30: 0.0, 40: 0.0}
"""Evaluations every 10 steps: 0.361, 0.011, 0.0, ..."""
