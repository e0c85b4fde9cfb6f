"""Framework metric names → the guard's metric roles: the one resolver, for replay and every
integration, so a run's live guard and its replay read the same keys.

A name is a key (``train/loss``) or a pattern with ``*`` (``eval/*``). A pattern matches keys at
its own depth only and never a truncation ratio (``eval/<name>-truncated_ratio``,
``eval/<name>/sub-metric`` are not accuracies); of several matches the first in sorted order
wins, whatever order the framework logged them in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fnmatch import fnmatch
from typing import Any

import torch

from distill_guard.observations import Metric

RELAX_METRIC_NAMES: dict[str, str] = {
    Metric.LOSS: "train/loss",
    Metric.STUDENT_ENTROPY: "train/entropy_loss",
    Metric.TEACHER_LOGPROB: "rollout/teacher_log_probs",
    Metric.TRUNCATED_RATIO: "rollout/truncated_ratio",
    Metric.EVAL_ACCURACY: "eval/*",
}
"""Relax's metric names (``docs/relax.md`` §1.4); the replay default."""

HF_METRIC_NAMES: dict[str, str] = {
    Metric.LOSS: "loss",
    Metric.STUDENT_ENTROPY: "entropy",
    Metric.TRUNCATED_RATIO: "completions/clipped_ratio",
    Metric.EVAL_ACCURACY: "eval_accuracy",
}
"""transformers/TRL logs: the Trainer's ``loss``; TRL ``DistillationTrainer``'s ``entropy`` (the
student's mean per-token entropy, nats) and ``completions/clipped_ratio`` (the fraction of
on-policy completions cut at ``max_completion_length``), as trl 1.16 logs them (GKDTrainer
logs neither); an ``eval_accuracy`` from ``compute_metrics``."""

LIGHTNING_METRIC_NAMES: dict[str, str] = {
    Metric.LOSS: "train/loss",
    Metric.STUDENT_ENTROPY: "train/entropy",
    Metric.TRUNCATED_RATIO: "train/truncated_ratio",
    Metric.EVAL_ACCURACY: "val/acc",
}
"""Lightning ``self.log`` names, as lightning-hydra-template spells them."""


def resolve_key(pattern: str, available: Iterable[str]) -> str | None:
    """The key among ``available`` that ``pattern`` names, or None."""
    if not pattern:
        return None
    if "*" not in pattern:
        return pattern if pattern in set(available) else None
    depth = pattern.count("/")
    matches = sorted(
        k
        for k in available
        if fnmatch(k, pattern) and "truncated" not in k and k.count("/") == depth
    )
    return matches[0] if matches else None


def resolve_names(names: Mapping[str, str], available: Iterable[str]) -> dict[str, str]:
    """``{role: key}`` for every role whose name resolves among ``available``."""
    keys = list(available)
    found = {role: resolve_key(pattern, keys) for role, pattern in names.items()}
    return {role: key for role, key in found.items() if key is not None}


def pick_metrics(logs: Mapping[str, Any], names: Mapping[str, str]) -> dict[str, float]:
    """The roles' values out of one step's logs; values that are not numbers are left out."""
    out: dict[str, float] = {}
    for role, key in resolve_names(names, logs.keys()).items():
        value = logs[key]
        if value is None:
            continue
        try:
            out[role] = as_float(value)
        except (TypeError, ValueError):
            continue
    return out


def as_float(value: Any) -> float:
    """A logged value as a float: a tensor's mean, a number as is."""
    if isinstance(value, torch.Tensor):
        return float(value.detach().float().mean())
    return float(value)
