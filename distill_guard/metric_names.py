"""Framework metric names → the guard's metric roles: the one resolver, for replay and every
integration, so a run's live guard and its replay read the same keys.

One table of conventions (:data:`CONVENTIONS`, each with the source its names were read from;
``docs/metric-names.md`` is the same table for people) and one ordered list of candidate names per
role across all of them (:data:`METRIC_CANDIDATES`): of a role's candidates the first that resolves
among the available keys wins. An explicit mapping (replay's ``--key ROLE=NAME``, an adapter's
``metric_keys``) replaces a role's candidates (:func:`candidates`).

A name is a key (``train/loss``) or a pattern with ``*`` (``eval/*``). A pattern matches keys at
its own depth only and never a truncation ratio (``eval/<name>-truncated_ratio``,
``eval/<name>/sub-metric`` are not accuracies), a step counter (slime's ``eval/step``) or the
bookkeeping and losses an evaluation logs beside its accuracy (transformers' ``eval/loss``,
``eval/runtime``, ``eval/samples_per_second``; TRL's ``eval/entropy``); of several matches the
first in sorted order wins, whatever order the framework logged them in.

A key that resolves to no role but looks like one by its name (:func:`looks_like`) is named, never
silently dropped: :func:`lookalikes` lists those that look like a role that did not resolve.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatch
from typing import Any

import torch

from distill_guard.observations import Metric

Names = Mapping[str, str | Sequence[str]]
"""``{role: name}`` or ``{role: (name, ...)}``: a role's name, or its candidates in order."""


@dataclass(frozen=True)
class Convention:
    """One framework's metric names: per role the names it logs, preferred first."""

    name: str
    names: Mapping[str, tuple[str, ...]]
    source: str
    """Where each name was read (repository@commit or package==version, file)."""
    step_key: str = "_step"
    """The step column of its histories (for :func:`~distill_guard.testing.histories.renamed`)."""


RELAX = Convention(
    "relax",
    {
        Metric.LOSS: ("train/loss",),
        Metric.STUDENT_ENTROPY: ("train/entropy_loss",),
        Metric.TEACHER_LOGPROB: ("rollout/teacher_log_probs",),
        Metric.TRUNCATED_RATIO: ("rollout/truncated_ratio",),
        Metric.EVAL_ACCURACY: ("eval/*",),
    },
    "redai-infra/Relax@6bc26c5 as read in docs/relax.md §1.4: relax/backends/megatron/model.py "
    "train (train/<reported_loss key>: loss, entropy_loss; loss.py@05b60b9), data.py "
    "log_rollout_data (rollout/teacher_log_probs), train_metric_utils.py (rollout/truncated_ratio), "
    "_log_eval_rollout_data (eval/<dataset>)",
    step_key="train/step",
)
"""Relax's names (``docs/relax.md`` §1.4)."""

SLIME = Convention(
    "slime",
    dict(RELAX.names),
    "THUDM/slime@624b824: slime/backends/megatron_utils/model.py (train/{key} of loss.py's "
    "reported_loss: loss, entropy_loss), slime/observability/train_metric_utils.py "
    'gather_log_data("rollout", ...) (rollout/teacher_log_probs), '
    "slime/observability/rollout_metrics.py (rollout/truncated_ratio; eval/{dataset}, "
    "eval/{dataset}-truncated_ratio, eval/{dataset}/..., eval/step); radixark/miles@31f1ca9, the "
    "same names: miles/backends/training_utils/log_utils.py, loss_hub/losses.py, "
    "miles/ray/rollout/metrics.py (also eval/{dataset}-none_reward_ratio, eval/skipped_{reason})",
    step_key="train/step",
)
"""slime and miles: Relax's names (Relax is of the slime lineage), read in their own source."""

HF = Convention(
    "hf",
    {
        Metric.LOSS: ("loss",),
        Metric.STUDENT_ENTROPY: ("entropy",),
        Metric.TRUNCATED_RATIO: ("completions/clipped_ratio", "completions/truncated_fraction"),
        Metric.EVAL_ACCURACY: ("eval_accuracy", "eval_*_accuracy"),
    },
    "transformers==5.24.0 transformers/trainer.py (the Trainer's loss; evaluate() prefixes "
    "compute_metrics keys with eval_, eval_<dataset>_ with several eval sets); trl==1.16.0 "
    "trl/trainer/distillation_trainer.py (DistillationTrainer: entropy, "
    "completions/clipped_ratio); huggingface/trl v1.1.0@3179965 to v1.9.0@35def3e and "
    "1.10.0.dev0@f2cd577 trl/experimental/distillation/distillation_trainer.py (the experimental "
    "DistillationTrainer: completions/truncated_fraction, no entropy), as trl==1.16.0's "
    "experimental IW-OPD trainer still logs it (trl/experimental/iw_opd/iw_opd_trainer.py)",
    step_key="step",
)
"""transformers/TRL raw logs (``on_log``'s ``logs``, ``state.log_history``)."""

TRL_WANDB = Convention(
    "trl",
    {
        Metric.LOSS: ("train/loss",),
        Metric.STUDENT_ENTROPY: ("train/entropy",),
        Metric.TRUNCATED_RATIO: (
            "train/completions/clipped_ratio",
            "train/completions/truncated_fraction",
        ),
        Metric.EVAL_ACCURACY: ("eval/accuracy", "eval/*_accuracy"),
    },
    "transformers==5.24.0 transformers/integrations/integration_utils.py: WandbCallback.on_log "
    "logs rewrite_logs(logs), which turns eval_x into eval/x and prefixes every other key with "
    "train/, with train/global_step as the step (the raw names are HF's)",
    step_key="train/global_step",
)
"""TRL's (and the transformers Trainer's) logs as wandb records them."""

LIGHTNING = Convention(
    "lightning",
    {
        Metric.LOSS: ("train/loss",),
        Metric.STUDENT_ENTROPY: ("train/entropy",),
        Metric.TRUNCATED_RATIO: ("train/truncated_ratio",),
        Metric.EVAL_ACCURACY: ("val/acc",),
    },
    "ashleve/lightning-hydra-template@01f010a src/models/mnist_module.py (self.log of train/loss "
    "and val/acc); train/entropy and train/truncated_ratio are this package's names in that "
    "style (docs/integrations.md, Lightning): Lightning itself logs neither",
)
"""Lightning ``self.log`` names, as lightning-hydra-template spells them."""

DEMO = Convention(
    "demo",
    {
        Metric.LOSS: ("train/loss",),
        Metric.STUDENT_ENTROPY: ("train/entropy",),
        Metric.TRUNCATED_RATIO: ("train/truncated_ratio",),
        Metric.TEACHER_LOGPROB: ("train/teacher_logprob",),
        Metric.EVAL_ACCURACY: ("eval/accuracy",),
    },
    "this repository: examples/sdpo_sciknoweval/app.py WANDB_KEYS",
)
"""The demo's wandb keys."""

CONVENTIONS: dict[str, Convention] = {
    c.name: c for c in (RELAX, SLIME, TRL_WANDB, HF, LIGHTNING, DEMO)
}
"""Every known convention by name; ``miles`` is slime's."""
CONVENTIONS["miles"] = SLIME

METRIC_CANDIDATES: dict[str, tuple[str, ...]] = {
    Metric.LOSS: ("train/loss", "loss"),
    Metric.STUDENT_ENTROPY: ("train/entropy_loss", "train/entropy", "entropy"),
    Metric.TRUNCATED_RATIO: (
        "rollout/truncated_ratio",
        "train/truncated_ratio",
        "train/completions/clipped_ratio",
        "train/completions/truncated_fraction",
        "completions/clipped_ratio",
        "completions/truncated_fraction",
    ),
    Metric.TEACHER_LOGPROB: ("rollout/teacher_log_probs", "train/teacher_logprob"),
    Metric.EVAL_ACCURACY: (
        "eval/accuracy",
        "eval_accuracy",
        "val/acc",
        "eval/*_accuracy",
        "eval_*_accuracy",
        "eval/*",
    ),
}
"""Per role, every convention's names in the order they are tried; the first that resolves wins.

The order, and why:

1. Relax's (and slime's, miles') names first: the guard's first framework and the old replay
   default, so a history that replayed before reads the same columns now. Its
   ``train/entropy_loss`` also comes before ``train/entropy`` because it is the more specific
   name: in the slime lineage it is always the student's token entropy, while ``train/entropy``
   is what Lightning, the demo and TRL-through-wandb all call theirs.
2. The ``train/``-prefixed names (Lightning, the demo, TRL as wandb records it) before the bare
   ones: a bare ``loss`` or ``entropy`` is the likeliest to mean something else in a file that
   also has the prefixed name.
3. Of TRL's two truncation names, trl 1.16's ``completions/clipped_ratio`` before the
   experimental trainer's ``completions/truncated_fraction`` (trl 1.1 to 1.10): a run logs one.
4. For the eval accuracy, exact names before patterns, and ``eval/*`` last: it matches any
   depth-one eval column, so it may only answer when no framework's own accuracy name is there.
"""


def candidates(overrides: Mapping[str, str] | None = None) -> dict[str, tuple[str, ...]]:
    """Every role's candidates, with each role in ``overrides`` mapped to that one name only:
    an explicit mapping is the exception to the order and wins for its role."""
    out = dict(METRIC_CANDIDATES)
    for role, name in (overrides or {}).items():
        out[role] = (name,)
    return out


def _names_of(names: str | Sequence[str]) -> tuple[str, ...]:
    return (names,) if isinstance(names, str) else tuple(names)


def role_names(convention: Convention) -> dict[str, str]:
    """``{role: name}``: the convention's preferred name of each role (for adapters' defaults)."""
    return {role: names[0] for role, names in convention.names.items()}


RELAX_METRIC_NAMES: dict[str, str] = role_names(RELAX)
"""Relax's metric names (``docs/relax.md`` §1.4), one per role."""

HF_METRIC_NAMES: dict[str, str | tuple[str, ...]] = {
    Metric.LOSS: "loss",
    Metric.STUDENT_ENTROPY: "entropy",
    Metric.TRUNCATED_RATIO: HF.names[Metric.TRUNCATED_RATIO],
    Metric.EVAL_ACCURACY: HF.names[Metric.EVAL_ACCURACY],
}
"""transformers/TRL logs (:data:`HF`): the Trainer's ``loss``; TRL ``DistillationTrainer``'s
``entropy`` (the student's mean per-token entropy, nats) and the fraction of on-policy
completions cut at ``max_completion_length``, ``completions/clipped_ratio`` as trl 1.16 logs it or
``completions/truncated_fraction`` as the experimental trainer of trl 1.1 to 1.10 did (GKDTrainer
logs neither); an ``eval_accuracy`` (``eval_<dataset>_accuracy``) from ``compute_metrics``."""

LIGHTNING_METRIC_NAMES: dict[str, str] = role_names(LIGHTNING)
"""Lightning ``self.log`` names, as lightning-hydra-template spells them (:data:`LIGHTNING`)."""

_NOT_AN_ACCURACY = re.compile(
    r"(^|[/_\-])(step|global_step|epoch|runtime|loss|entropy|num_tokens|skipped_\w*)$"
    r"|_per_second$|_time$|none_reward_ratio$"
)
"""Last path segments a pattern never matches: step counters, timings, throughput, losses and
entropies (what an evaluation logs beside its accuracy)."""


def _pattern_may_match(key: str) -> bool:
    return "truncated" not in key and not _NOT_AN_ACCURACY.search(key.rsplit("/", 1)[-1])


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
        if fnmatch(k, pattern) and k.count("/") == depth and _pattern_may_match(k)
    )
    return matches[0] if matches else None


def resolve_first(names: str | Sequence[str], available: Iterable[str]) -> str | None:
    """The key the first of ``names`` that resolves among ``available`` names, or None."""
    keys = available if isinstance(available, (set, frozenset)) else set(available)
    for name in _names_of(names):
        key = resolve_key(name, keys)
        if key is not None:
            return key
    return None


def resolve_names(names: Names, available: Iterable[str]) -> dict[str, str]:
    """``{role: key}`` for every role whose name (or one of its candidates) resolves."""
    keys = set(available)
    found = {role: resolve_first(pattern, keys) for role, pattern in names.items()}
    return {role: key for role, key in found.items() if key is not None}


def pick_resolved(logs: Mapping[str, Any], keys: Mapping[str, str]) -> dict[str, float]:
    """The roles' values out of one step's logs, by resolved ``{role: key}``; values that are not
    numbers are left out."""
    out: dict[str, float] = {}
    for role, key in keys.items():
        value = logs[key]
        if value is None:
            continue
        try:
            out[role] = as_float(value)
        except (TypeError, ValueError):
            continue
    return out


def pick_metrics(logs: Mapping[str, Any], names: Names) -> dict[str, float]:
    """The roles' values out of one step's logs; values that are not numbers are left out."""
    return pick_resolved(logs, resolve_names(names, logs.keys()))


def as_float(value: Any) -> float:
    """A logged value as a float: a tensor's mean, a number as is."""
    if isinstance(value, torch.Tensor):
        return float(value.detach().float().mean())
    return float(value)


# ---------------------------------------------------------------------- look-alikes

_EVAL_MODE = re.compile(r"^(eval|val|valid|validation|test)[/_]")
"""An evaluation's copy of a training metric (transformers' ``eval_loss``, Lightning's
``val/loss``, slime's ``eval/<dataset>-truncated_ratio``): never a training role's look-alike."""
_ACCURACY = re.compile(r"accuracy|(^|[/_\-.])acc($|[/_\-.@0-9])")
_STEP_NAMES = {"_step", "step", "train/step", "global_step", "train/global_step", "rollout/step"}


def looks_like(key: str) -> str | None:
    """The role ``key`` looks like by its name, or None. By words in the name, most specific
    first: teacher + logprob/log_prob → teacher_logprob; trunc or clipped → truncated_ratio (a
    loss's ``clipfrac``/``clip_frac`` is PPO or IS clipping, not a cut completion); acc/accuracy →
    eval_accuracy; entropy (not the teacher's) → student_entropy; loss → loss. An evaluation's
    copy of a training metric (``eval_loss``, ``val/entropy``) looks like none of the training
    roles, and a step counter like nothing."""
    k = key.lower()
    if k in _STEP_NAMES or k.startswith("guard/"):
        return None
    if "teacher" in k and re.search(r"log_?probs?|logp\b", k):
        return Metric.TEACHER_LOGPROB
    if _ACCURACY.search(k):
        return Metric.EVAL_ACCURACY
    if _EVAL_MODE.match(k):
        return None
    if "trunc" in k or "clipped" in k:
        return Metric.TRUNCATED_RATIO
    if "entropy" in k and "teacher" not in k:
        return Metric.STUDENT_ENTROPY
    if "loss" in k:
        return Metric.LOSS
    return None


def lookalikes(keys: Iterable[str], unresolved: Iterable[str]) -> dict[str, str]:
    """``{key: role}`` for the keys that look like one of the ``unresolved`` roles, in sorted
    order. Only roles that did not resolve get look-alikes: a ``train/pg_loss`` beside a
    resolved ``train/loss`` is not news."""
    wanted = set(unresolved)
    found = {k: looks_like(k) for k in sorted(keys)}
    return {k: role for k, role in found.items() if role is not None and role in wanted}
