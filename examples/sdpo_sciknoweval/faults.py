"""Reproducible failures of on-policy distillation that the demo can inject (``fault=<name>``).

Each fault replaces the colocated sleep/wake weight loss of the default demo: every arm keeps its
teacher's weights across sleep, and the fault sits between the teacher and the trainer (or in the
loss), where real runs have met it:

- ``vocab_mismatch``: the teacher is scored on the student's tokens re-mapped through a fixed
  random permutation of the vocabulary, as if they came from another tokenizer: it reads noise;
- ``off_by_one``: the teacher's per-position scores (top-k ids and log-probs, token log-probs)
  reach the loss one position late within each sample (written at the response positions instead
  of the prediction positions), so row t holds the teacher's view of token t-1;
- ``partial``: one sample in 4 is scored by a copy of the teacher whose weights are noise at each
  tensor's own mean and std, as if one of 4 teacher replicas served garbage;
- ``beta_end``: the JSD's β is 1e-6 (in the loss and in the guard's run spec), so the loss is
  bounded by H(β) = 1.5e-5 nats and carries almost no signal. (AdamW normalizes the gradient's
  scale: the student still learns, from β·KL(teacher‖student), the KL the JSD tends to.)

"Poisoned" updates are the updates taken under the fault: on faulted teacher scores, or with
``beta_end`` on the signal-less loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from distill_guard.teachers import Teacher, TorchTeacher
from distill_guard.teachers.base import ScoreResult
from examples.sdpo_sciknoweval.models import load_model

FAULTS = {
    "none": "",
    "vocab_mismatch": "the teacher scores the student's tokens re-mapped through another "
    "vocabulary (a fixed random permutation)",
    "off_by_one": "the teacher's per-position scores reach the loss one position late",
    "partial": "1 sample in 4 is scored by a teacher replica whose weights are noise",
    "beta_end": "JSD beta = 1e-6 in the loss (and in the guard's run spec)",
}
"""Every fault the demo knows, with the line the summary table's title gives it."""

BETA_AT_END = 1e-6
"""β of ``beta_end``: GKD's ``beta: 1.0`` clamped to 1 - 1e-6 is the same loss mirrored."""

REPLICAS = 4
"""``partial``: samples are routed round-robin to 4 teacher replicas; the last serves garbage."""


def check_fault(name: str) -> str:
    if name not in FAULTS:
        raise ValueError(f"unknown fault {name!r}; faults are {', '.join(FAULTS)}")
    return name


def garble(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Replace every parameter by Gaussian noise with that tensor's own mean and std: weights
    that are statistically a model's (finite, peaked, not uniform) but not the teacher's."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            x = p.detach().float()
            std = float(x.std(correction=0)) if x.numel() > 1 else 0.0
            p.copy_((torch.randn(p.shape, generator=gen) * std + float(x.mean())).to(p.dtype))
    return model


def garbage_replica(teacher_dir: str | Path, seed: int) -> TorchTeacher:
    """The teacher's checkpoint with garbled weights, in process and never slept: the replica
    that serves garbage, whatever kind of teacher serves the others."""
    model = garble(load_model(teacher_dir), seed)
    return TorchTeacher(model, enable_memory_saver=False)


Starts = int | Sequence[int]
"""``logprob_start_len``: one for every sequence, or one per sequence (SGLang's is per request)."""


def score_each(
    teacher: Teacher, sequences: Sequence[Sequence[int]], top_k: int, starts: Starts
) -> ScoreResult:
    """``teacher.score`` with each sequence scored from its own start: one call per distinct
    start (the requests of one batch, each with its own ``logprob_start_len``), the rows given
    back in input order. A trainer that needs only the response positions asks for just those."""
    seqs = [list(s) for s in sequences]
    if isinstance(starts, int):
        return teacher.score(seqs, top_k=top_k, logprob_start_len=starts)
    if len(starts) != len(seqs):
        raise ValueError(f"{len(starts)} starts for {len(seqs)} sequences")
    groups: dict[int, list[int]] = {}
    for i, start in enumerate(starts):
        groups.setdefault(int(start), []).append(i)
    if len(groups) == 1:
        return teacher.score(seqs, top_k=top_k, logprob_start_len=int(starts[0]))
    rows: dict[int, tuple] = {}
    for start, idx in groups.items():
        r = teacher.score([seqs[i] for i in idx], top_k=top_k, logprob_start_len=start)
        rows |= {i: _row(r, j) for j, i in enumerate(idx)}
    return _join([rows[i] for i in range(len(seqs))])


class FaultyScorer:
    """The teacher's scores as the trainer receives them under ``fault``: a drop-in for
    ``teacher.score(sequences, top_k=..., logprob_start_len=...)`` whose start may also be one
    per sequence (:func:`score_each`).

    ``vocab_size`` is the tokenizer's for ``vocab_mismatch``: its ids are permuted, the ids of
    the model's padded logits beyond it (which a sampling student can emit) are left as they are;
    ``replica`` is the garbage replica of ``partial``.
    """

    def __init__(
        self,
        fault: str,
        teacher: Teacher,
        *,
        vocab_size: int | None = None,
        replica: Teacher | None = None,
        seed: int = 0,
    ) -> None:
        self.fault = check_fault(fault)
        self.teacher = teacher
        self.replica = replica
        self.permutation: torch.Tensor | None = None
        if fault == "vocab_mismatch":
            if vocab_size is None:
                raise ValueError("vocab_mismatch needs the tokenizer's vocab_size")
            gen = torch.Generator().manual_seed(seed)
            self.permutation = torch.randperm(vocab_size, generator=gen)
        if fault == "partial" and replica is None:
            raise ValueError("partial needs the garbage replica")

    def garbage_rows(self, n: int) -> list[int]:
        """``partial``: the samples the garbage replica scores (every 4th, round-robin)."""
        return [i for i in range(n) if i % REPLICAS == REPLICAS - 1]

    def __call__(
        self, sequences: Sequence[Sequence[int]], top_k: int, logprob_start_len: Starts
    ) -> ScoreResult:
        seqs = [list(s) for s in sequences]
        starts = (
            [logprob_start_len] * len(seqs)
            if isinstance(logprob_start_len, int)
            else [int(s) for s in logprob_start_len]
        )
        if self.fault == "vocab_mismatch":
            assert self.permutation is not None
            perm, v = self.permutation.tolist(), len(self.permutation)
            mapped = [[perm[i] if i < v else i for i in s] for s in seqs]
            return score_each(self.teacher, mapped, top_k, starts)
        if self.fault == "off_by_one":
            # One more row at the front, the last one dropped: row j is the teacher's view of the
            # token before the one it is paired with.
            r = score_each(self.teacher, seqs, top_k, [s - 1 for s in starts])
            return _map_rows(r, lambda t: t[:-1])
        if self.fault == "partial":
            assert self.replica is not None
            bad = set(self.garbage_rows(len(seqs)))
            good = [i for i in range(len(seqs)) if i not in bad]
            parts = {}
            for who, rows in ((self.teacher, good), (self.replica, sorted(bad))):
                if rows:
                    r = score_each(who, [seqs[i] for i in rows], top_k, [starts[i] for i in rows])
                    parts |= {i: _row(r, j) for j, i in enumerate(rows)}
            return _join([parts[i] for i in range(len(seqs))])
        return score_each(self.teacher, seqs, top_k, starts)


def _map_rows(r: ScoreResult, fn: Any) -> ScoreResult:
    return ScoreResult(
        [fn(t) for t in r.token_logprobs],
        [fn(t) for t in r.topk_logprobs] if r.topk_logprobs is not None else None,
        [fn(t) for t in r.topk_ids] if r.topk_ids is not None else None,
    )


def _row(r: ScoreResult, j: int) -> tuple:
    return (
        r.token_logprobs[j],
        r.topk_logprobs[j] if r.topk_logprobs is not None else None,
        r.topk_ids[j] if r.topk_ids is not None else None,
    )


def _join(rows: list[tuple]) -> ScoreResult:
    tok, lps, ids = zip(*rows)
    return ScoreResult(
        list(tok),
        None if lps[0] is None else list(lps),
        None if ids[0] is None else list(ids),
    )
