"""Replay streams its history: peak memory grows with steps × roles, not with the file."""

from __future__ import annotations

import json
import tracemalloc

from distill_guard.history import load_history


def test_a_wide_history_is_read_in_far_less_memory_than_its_size(tmp_path):
    path = tmp_path / "wide.jsonl"
    with path.open("w") as fh:  # a wandb-style export: many columns, a few the guard reads
        for step in range(1500):
            row = {"_step": step, "train/loss": 0.1, "rollout/entropy": 0.5}
            row.update({f"extra/metric_{k}": k * 0.001 + step for k in range(150)})
            fh.write(json.dumps(row) + "\n")
    size = path.stat().st_size
    tracemalloc.start()
    try:
        history = load_history(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(history.steps) == 1500
    assert history.steps[-1] == (1499, {"loss": 0.1})
    assert peak < size / 4, f"peak {peak / 2**20:.1f} MiB for a {size / 2**20:.1f} MiB file"
