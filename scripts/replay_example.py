"""Draw docs/img/replay_example.png: ``distill-guard replay --plot`` of a run whose teacher lost
its weights at a wake at step 40 and that trained on, unguarded, to step 120.

The story, one cause and its effects: the logged teacher logprob drops to −ln V at step 40 (a
uniform teacher), the loss jumps to the JSD ceiling with it, and the student then follows the dead
teacher: its entropy climbs, its answers stop ending (truncation) and its accuracy falls. The guard
finds it at step 40 (``teacher.uniform``, ``loss.jsd_ceiling``), would have rewoken the teacher
there, and halts at step 42; everything after the halt is greyed: what the guard would have
spared the run.

    .venv/bin/python scripts/replay_example.py [OUT.png]
"""

from __future__ import annotations

import math
import random
import sys
import tempfile
from pathlib import Path

from distill_guard.history import load_history
from distill_guard.replay import replay
from distill_guard.report import plot_replay
from distill_guard.testing.histories import QWEN3_VOCAB, healthy_history, write_jsonl

STEPS, DEATH = 120, 40
OUT = Path(__file__).resolve().parents[1] / "docs" / "img" / "replay_example.png"


def teacher_dies_at_a_wake(seed: int = 0):
    """The healthy run to step 40; from there a uniform teacher and a student following it."""
    rng = random.Random(seed)
    for row in healthy_history(STEPS, seed, spike_step=None):
        t = row["train/step"]
        if t >= DEATH:
            k = t - DEATH
            follow = 1 - math.exp(-k / 15)
            row["rollout/teacher_log_probs"] = -math.log(QWEN3_VOCAB)
            row["train/loss"] = 0.688 - 0.2 * follow + rng.gauss(0, 0.002)
            row["train/entropy_loss"] = 0.41 + 3.0 * follow + rng.gauss(0, 0.02)
            row["rollout/truncated_ratio"] = min(1.0, 0.04 + 0.9 * follow + rng.gauss(0, 0.01))
            if "eval/sciknoweval-biology" in row:
                row["eval/sciknoweval-biology"] = max(0.0, 0.43 * math.exp(-k / 12))
                row["eval/sciknoweval-biology-truncated_ratio"] = row["rollout/truncated_ratio"]
        yield row


def main(out: Path = OUT) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = write_jsonl(teacher_dies_at_a_wake(), Path(tmp) / "teacher_dies_at_step_40.jsonl")
        result = replay(load_history(path), "default", [f"run.vocab_size={QWEN3_VOCAB}"])
        plot_replay(result, out)
    print(f"{out}: first action {result.first_action}, halt at step {result.halt_step}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
