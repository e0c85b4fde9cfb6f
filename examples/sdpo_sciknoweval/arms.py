"""The three arms of the demo, each an OPD run with a colocated teacher slept and woken every step.

- ``healthy``: the teacher keeps its weights across sleep (weights CPU backup on);
- ``unguarded``: no backup, so every wake brings the teacher back with zeroed weights; the guard
  only watches (``monitor_only``), so the run is exactly what happens without one;
- ``guarded``: no backup, the guard acts (``default`` preset): the canary after each wake sees the
  dead teacher and the guard reloads and verifies it before it scores anything.

With a fault (``fault=<name>``, :mod:`examples.sdpo_sciknoweval.faults`) the fault replaces the
weight loss: every arm keeps its teacher's weights, ``healthy`` runs without the fault,
``unguarded`` (``monitor_only``) and ``guarded`` (``default``) with it.

The loop is the one a colocated trainer runs (``docs/architecture.md``); the guard owns the
teacher's sleep and wake::

    guard.wake (resume, canary, repair) → score → on_teacher_scores → update → on_step_metrics
    → guard.sleep (fingerprint, release)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from distill_guard import DistillGuard
from distill_guard.alerts import Alerter
from distill_guard.config import build_guard
from distill_guard.observations import Metric
from distill_guard.teachers import Teacher
from examples.sdpo_sciknoweval.faults import FaultyScorer, Starts, check_fault, score_each
from examples.sdpo_sciknoweval.run_arm import ArmConfig, run_arm

ARMS = ("healthy", "unguarded", "guarded")


@dataclass(frozen=True)
class ArmSpec:
    """What distinguishes one arm."""

    name: str
    backup: bool
    """The teacher's weights CPU backup (SGLang ``--enable-weights-cpu-backup``)."""
    preset: str
    """The guard preset the demo's config gives this arm (``conf/sdpo_sciknoweval.yaml``)."""
    fault: str = "none"
    """The fault this arm runs with (``faults.FAULTS``)."""

    @classmethod
    def named(cls, name: str, fault: str = "none") -> ArmSpec:
        check_fault(fault)
        if fault == "none":
            specs = {
                "healthy": cls("healthy", backup=True, preset="monitor_only"),
                "unguarded": cls("unguarded", backup=False, preset="monitor_only"),
                "guarded": cls("guarded", backup=False, preset="default"),
            }
        else:  # the fault replaces the weight loss: every teacher keeps its weights
            specs = {
                "healthy": cls("healthy", backup=True, preset="monitor_only"),
                "unguarded": cls("unguarded", backup=True, preset="monitor_only", fault=fault),
                "guarded": cls("guarded", backup=True, preset="default", fault=fault),
            }
        if name not in specs:
            raise ValueError(f"unknown arm {name!r}; arms are {', '.join(ARMS)}")
        return specs[name]


@dataclass
class ArmTrace:
    """What the arm's summary is built from, gathered as the run goes."""

    records: list[dict] = field(default_factory=list)
    uniform_rows: int = 0
    scored_rows: int = 0
    poisoned_updates: int = 0
    """Optimizer steps taken on teacher scores that are not the healthy teacher's (a teacher dead
    at that step, or a fault between it and the trainer), or with ``beta_end`` on the signal-less
    loss: see :func:`scores_differ`."""
    first_finding: dict | None = None
    halted: bool = False


POISON_TOL = 0.1
"""Nats: a sample's teacher scores are poisoned when they stray from the healthy teacher's by
more than this on average (a dead teacher is nats away; numerics, even bf16 over HTTP, are not)."""


def scores_differ(
    reference: Teacher,
    sequences: list[list[int]],
    logprob_start_len: Starts,
    top: torch.Tensor,
    tokens: torch.Tensor | None,
    sample_index: torch.Tensor,
) -> bool:
    """Ground truth for the demo's bookkeeping (not a check the guard uses): whether what the
    trainer consumed (``top`` ``[N, k]`` sorted teacher log-probs and ``tokens`` ``[N]``, at the
    response positions of each sample in ``sample_index``) strays from what ``reference``, the
    healthy teacher checkpoint in process, gives on the same sequences. One definition for every
    kind of teacher: it reads the numbers, never the teacher object."""
    ref = score_each(reference, sequences, top.shape[1], logprob_start_len)
    assert ref.topk_logprobs is not None
    for b in range(len(sequences)):
        rows = sample_index == b
        n = int(rows.sum())
        if n == 0:
            continue
        gap = (top[rows].float() - ref.topk_logprobs[b][-n:]).abs().mean()
        if tokens is not None:
            gap = torch.maximum(
                gap, (tokens[rows].float() - ref.token_logprobs[b][-n:]).abs().mean()
            )
        if float(gap) > POISON_TOL:
            return True
    return False


def make_guard(guard_cfg: Any, teacher: Teacher, events: Path, wandb_run: Any) -> DistillGuard:
    """The arm's guard from its composed preset; alerts go to the logger, the event file and wandb."""
    return build_guard(guard_cfg, teacher=teacher, events=events, alerter=Alerter(run=wandb_run))


class _Halted(Exception):
    """The guard halted the run: leave the training loop."""


def run_guarded_arm(
    spec: ArmSpec,
    teacher: Teacher,
    student: torch.nn.Module,
    tokenizer: Any,
    train: list,
    eval_items: list,
    cfg: ArmConfig,
    guard: DistillGuard,
    on_record: Callable[[dict], None],
    checkpoint_dir: Path,
    reference: Teacher,
    scorer: FaultyScorer | None = None,
) -> ArmTrace:
    """One arm: the student trains on the teacher's scores; the guard sees every stage.

    ``scorer`` stands between the teacher and the trainer under a fault (``spec.fault``).
    ``reference`` is the healthy teacher checkpoint, in process and never slept: an update the
    optimizer took on scores that stray from its (:func:`scores_differ`) is counted as poisoned,
    whatever kind of teacher the arm runs on. A halt stops the arm after saving the student to
    ``checkpoint_dir`` (the event file says why).
    """
    trace = ArmTrace()
    uniform = -math.log(teacher.vocab_size)
    scored: dict[str, Any] = {}  # the step's scoring call and what the trainer consumed of it
    if scorer is None:
        scorer = FaultyScorer("none", teacher)

    def note() -> None:
        if trace.first_finding is None and guard.summary.first:
            code, step = min(guard.summary.first.items(), key=lambda kv: kv[1])
            trace.first_finding = {"step": step, "code": code}
        if guard.halted:
            raise _Halted

    def wake(step: int) -> None:
        guard.wake(step)
        note()

    def score(seqs: list[list[int]], top_k: int, start: Starts):
        scored.clear()
        scored.update(sequences=seqs, logprob_start_len=start)
        result = scorer(seqs, top_k, start)
        return result.topk_ids, result.topk_logprobs, result.token_logprobs

    def check(step: int, top: torch.Tensor, tokens: torch.Tensor | None, **ids: Any) -> bool:
        trace.scored_rows += top.shape[0]
        trace.uniform_rows += int(((top[:, 0] - uniform).abs() <= 1e-3).sum())
        scored.update(top=top, tokens=tokens, sample_index=ids["sample_index"])
        decision = guard.on_teacher_scores(step, token_logprobs=tokens, topk_logprobs=top, **ids)
        note()
        return not decision.acts

    def poisoned() -> bool:
        """The update just taken: on the signal-less loss, or on scores not the healthy teacher's."""
        return spec.fault == "beta_end" or scores_differ(reference, **scored)

    def sleep(step: int) -> None:
        guard.sleep(step)

    def on_step(record: dict) -> None:
        if "loss" in record:
            record["poisoned"] = bool(record["trained"] and poisoned())
            trace.poisoned_updates += record["poisoned"]
            if not record["trained"]:
                guard.summary.add_skipped_update()  # the loop dropped it: guard/skipped_updates
            metrics = {role: record.get(role) for role in Metric.ALL}
            record["guard_action"] = guard.on_step_metrics(record["step"], metrics).action.value
        record["repairs"] = guard.repairs
        trace.records.append(record)
        on_record(record)
        note()

    guard.sleep(-1)  # the launch sleep: the trainer takes the memory first
    try:
        run_arm(student, tokenizer, train, eval_items, score, cfg, wake, on_step, check, sleep)
    except _Halted:
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
        torch.save(student.state_dict(), checkpoint_dir / "student.pt")
        torch.save(guard.state_dict(), checkpoint_dir / "guard.pt")
    finally:
        if teacher.asleep:
            teacher.resume()
        guard.close()
    trace.halted = guard.halted
    return trace
