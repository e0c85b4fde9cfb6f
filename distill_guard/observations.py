"""What the guard is shown each step, in trainer-neutral form, and what it knows of the run."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property

import torch

from distill_guard.errors import GuardValueError
from distill_guard.signals import jsd_ceiling, row_max


class Metric:
    """Canonical metric roles. Adapters map their framework's names onto these."""

    LOSS = "loss"
    STUDENT_ENTROPY = "student_entropy"
    TRUNCATED_RATIO = "truncated_ratio"
    TEACHER_LOGPROB = "teacher_logprob"
    EVAL_ACCURACY = "eval_accuracy"
    TOPK_CLAMP_FRACTION = "topk_clamp_fraction"
    """Fraction of tokens at which a top-k loss's clamp (``clamp_min(0)``) was active."""
    STUDENT_TOPK_MASS = "student_topk_mass"
    """Mean student probability mass inside the teacher's top-k."""

    ALL = (
        LOSS,
        STUDENT_ENTROPY,
        TRUNCATED_RATIO,
        TEACHER_LOGPROB,
        EVAL_ACCURACY,
        TOPK_CLAMP_FRACTION,
        STUDENT_TOPK_MASS,
    )


class LossKind(str, Enum):
    """Which distillation loss the trainer optimises."""

    JSD = "jsd"
    REVERSE_KL = "reverse_kl"
    FORWARD_KL = "forward_kl"


@dataclass
class RunSpec:
    """Facts of the run that every check may need, set once by the user or learnt from the teacher.

    Also the Hydra node ``run`` of :class:`~distill_guard.config.GuardConfig`. Treat it as a
    value: the guard replaces it (``dataclasses.replace``), it never mutates a shared one.

    β is the weight of the *teacher* in the JSD mixture m = (1−β)·student + β·teacher (Relax's
    ``--opd-jsd-alpha``, TRL's ``beta``). Its ceiling H(β) is symmetric, so the check does not
    depend on the convention; at β ∈ {0, 1} the loss is a KL and has no ceiling.
    """

    vocab_size: int | None = None
    """Teacher vocabulary size V (``config.json`` ``vocab_size``); None disables the −ln V tests."""
    loss: LossKind = LossKind.JSD
    """The distillation loss in ``train/loss``."""
    beta: float = 0.5
    """JSD mixture weight of the teacher."""
    loss_scale: float = 1.0
    """Factor the trainer applies to the per-token loss (coefficients, temperature²); undone
    before comparing with a bound."""
    student_vocab_size: int | None = None
    """The student's vocabulary size, when it differs or may differ from the teacher's
    (151936 vs 152064 padding): teacher ids at or beyond it cannot be the student's tokens."""
    teacher_temperature: float | None = None
    """The temperature the teacher's distribution is meant to be consumed at; None: not
    declared, the trainer's own where an adapter can read it (TRL's ``temperature``), else 1
    (the model's own). The teacher's reference from its checkpoint is taken at it, so a teacher
    that is hotter or colder than that is caught at its first step."""

    def __post_init__(self) -> None:
        try:
            self.loss = LossKind(self.loss)
        except ValueError:
            choices = ", ".join(k.value for k in LossKind)
            raise GuardValueError(f"loss must be one of {choices}, got {self.loss!r}") from None
        for name in ("vocab_size", "student_vocab_size"):
            v = getattr(self, name)
            if v is not None and v < 2:
                raise GuardValueError(f"{name} must be >= 2, got {v}")
        if not 0.0 <= self.beta <= 1.0:
            raise GuardValueError(f"beta must lie in [0, 1], got {self.beta}")
        if not self.loss_scale > 0:
            raise GuardValueError(f"loss_scale must be > 0, got {self.loss_scale}")
        t = self.teacher_temperature
        if t is not None and (
            isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0
        ):
            raise GuardValueError(
                f"teacher_temperature must be a finite number > 0 (1: the model's own), got {t!r}"
            )

    @property
    def loss_ceiling(self) -> float | None:
        """The bound on the unscaled per-token loss, or None where the loss has none."""
        return jsd_ceiling(self.beta) if self.loss is LossKind.JSD else None

    @property
    def temperature(self) -> float:
        """The teacher temperature the run is judged at: the declared one, else 1."""
        return float(self.teacher_temperature) if self.teacher_temperature is not None else 1.0

    @property
    def log_vocab(self) -> float | None:
        return math.log(self.vocab_size) if self.vocab_size else None


@dataclass
class TeacherScores:
    """The teacher's logprobs for this step's batch, as scored (rollout side, before the update)."""

    step: int
    token_logprobs: torch.Tensor | None = None
    """Logprobs of the sampled tokens, ``[N]`` (flattened over the batch)."""
    topk_logprobs: torch.Tensor | None = None
    """Top-k logprobs per position, ``[N, K]``."""
    mask: torch.Tensor | None = None
    """``[N]`` bool: which positions count (response tokens, SDPO sample mask)."""
    topk_ids: torch.Tensor | None = None
    """``[N, K]`` token ids of ``topk_logprobs``: which tokens the teacher ranks first."""
    token_ids: torch.Tensor | None = None
    """``[N]`` ids of the sampled tokens, in sequence order within each sample."""
    sample_index: torch.Tensor | None = None
    """``[N]`` which sample each position belongs to (per-sample statistics; sequence
    boundaries for position checks)."""
    topk_own: bool = True
    """Whether ``topk_logprobs`` rows are the teacher's own top-k (so a row's best entry is its
    top-1). False for its logprobs of ids chosen elsewhere (Relax's ``student_topk``: the
    student's top-K): every entry is still −ln V on a dead teacher, but no entry is its top-1."""

    def kept(self, x: torch.Tensor | None) -> torch.Tensor | None:
        """``x`` (any of the per-position tensors) at the positions the mask keeps."""
        if x is None or self.mask is None:
            return x
        return x[self.mask.reshape(-1).to(device=x.device, dtype=torch.bool)]

    @cached_property
    def top1(self) -> torch.Tensor | None:
        """Each kept top-k row's maximum (its top-1 where the rows are the teacher's own),
        computed once for all the checks that read it; None without top-k rows."""
        x = self.kept(self.topk_logprobs)
        return None if x is None else row_max(x.detach().reshape(x.shape[0], -1))


@dataclass
class StepMetrics:
    """Scalar metrics of one step, keyed by :class:`Metric` roles; absent roles are skipped."""

    step: int
    values: Mapping[str, float] = field(default_factory=dict)
    teacher_healthy: bool | None = None
    """The teacher's own evidence for this step: True when its scores (or its canary at wake)
    were checked this step and showed nothing, False when they showed a fault, None when the
    guard saw none. Checks use it to blame the teacher only when its evidence supports it."""
    open_incident: int | None = None
    """The step of a teacher-attributed critical finding that nothing could act on (no live
    teacher to reload, the update already taken) and that is still open: no repair verified
    and no healthy teacher evidence since. The student-signal checks then apply their follow-up
    bounds: a student moving the way a dead teacher moves it confirms the incident
    (``student.follows_dead_teacher``), and the policy halts."""

    def get(self, role: str) -> float | None:
        value = self.values.get(role)
        return None if value is None else float(value)
