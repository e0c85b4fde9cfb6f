"""Pictures of what the guard saw: the replay timeline with its findings marked."""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING

from distill_guard.observations import Metric

if TYPE_CHECKING:
    from distill_guard.replay import ReplayResult

PANELS = (
    (Metric.LOSS, "loss"),
    (Metric.STUDENT_ENTROPY, "student entropy (nats)"),
    (Metric.TEACHER_LOGPROB, "teacher logprob"),
    (Metric.TRUNCATED_RATIO, "truncated ratio"),
    (Metric.EVAL_ACCURACY, "eval accuracy"),
)


def plot_replay(result: ReplayResult, path: str | os.PathLike[str]) -> None:
    """One panel per metric present, the loss ceiling and −ln V drawn, first findings marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(r, label) for r, label in PANELS if r in result.history.keys]
    fig, axes = plt.subplots(
        len(panels), 1, figsize=(9, 2.0 * len(panels) + 0.6), sharex=True, squeeze=False
    )
    first = result.first
    for ax, (role, label) in zip(axes[:, 0], panels):
        pts = [
            (s, v[role]) for s, v in result.history.steps if role in v and math.isfinite(v[role])
        ]
        if pts:
            ax.plot(*zip(*pts), lw=1.2, marker="." if len(pts) < 60 else None)
        ax.set_ylabel(label, fontsize=8)
        ax.grid(alpha=0.3)
        for step in set(first.values()) - {None}:
            ax.axvline(step, color="tab:red", alpha=0.5, lw=0.8)
    top = axes[0, 0]
    for code, step in sorted(first.items(), key=lambda kv: kv[1] or 0):
        if step is not None:
            top.annotate(
                code,
                (step, 1.0),
                xycoords=("data", "axes fraction"),
                rotation=60,
                fontsize=7,
                color="tab:red",
                va="bottom",
            )
    if result.halt_step is not None:
        for ax in axes[:, 0]:
            ax.axvline(result.halt_step, color="black", ls="--", lw=1.0)
    axes[-1, 0].set_xlabel("step")
    fig.suptitle(
        f"distill_guard replay: {os.path.basename(result.history.path)}", y=0.995, fontsize=10
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
