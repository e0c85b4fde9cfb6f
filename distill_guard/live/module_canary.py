"""The canary for a teacher that lives in the trainer's own process (an ``nn.Module``).

In-process trainers (TRL's GKD, a plain loop, Lightning) have no sleep and wake, and a teacher
whose weights turn to noise is not uniform: its scores look like any teacher's. What does tell is
the teacher itself: the same fixed sequence, scored again, no longer gives what it gave at the
last step. :class:`ModuleCanary` scores the canary with one small forward before each update
and holds it against the previous step's measurement, so a teacher that changed is caught before
the update that would use it. The reference moves with each clean step, so a teacher updated on
purpose (EMA, a few percent a step) stays clean.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from distill_guard.checks.canary import FIX, CanaryCheck
from distill_guard.findings import Finding, Severity
from distill_guard.live.canary import Canary, teacher_error_finding
from distill_guard.teachers.base import ScoreResult, TeacherError

IN_PROCESS_FIX = (
    "Something wrote into the teacher module's weights: an optimizer or a shared module holding "
    "its parameters, an EMA update with its rate inverted (a teacher keeping a few % of itself "
    "per step becomes a copy of the student), a failed load, a device fault. The guard skips "
    "the updates that would use the changed teacher; reload its weights from its checkpoint, or "
    "stop and find the writer."
)
WORDING = (
    ("the fingerprint taken before sleep", "the teacher's previous clean step"),
    (
        "The weights changed across sleep and wake (garbage or partly lost weights, e.g. RoPE "
        "buffers).",
        "The teacher moved more in one step than its canary tolerance allows.",
    ),
    (FIX, IN_PROCESS_FIX),
)
"""The wake canary's words, said of a teacher that never sleeps."""


def in_process(message: str) -> str:
    for wake, here in WORDING:
        message = message.replace(wake, here)
    return message


class ModuleScorer:
    """Scores token sequences with a module's forward, without changing the module: gradients
    off, eval mode for the call only (dropout would make the canary noisy), mode restored.

    ``temperature``: the temperature the trainer consumes the teacher's distribution at (TRL
    GKD's ``temperature``): the canary is scored as the loss sees the teacher, so a teacher
    consumed at another temperature than its reference's is caught."""

    def __init__(self, module: torch.nn.Module, *, temperature: float = 1.0) -> None:
        self.module = module
        self.temperature = float(temperature)

    @property
    def vocab_size(self) -> int | None:
        config = getattr(self.module, "config", None)
        v = getattr(config, "vocab_size", None)
        return int(v) if v is not None else None

    def server_info(self) -> dict[str, Any]:
        first = next(iter(self.module.parameters()), None)
        dtype = str(first.dtype).removeprefix("torch.") if first is not None else None
        return {"enable_deterministic_inference": False, "dtype": dtype}

    def score(
        self, sequences: list[list[int]], top_k: int = 0, logprob_start_len: int = 0
    ) -> ScoreResult:
        first = next(iter(self.module.parameters()), None)
        device = first.device if first is not None else torch.device("cpu")
        ids = torch.tensor(sequences, device=device)
        was_training = self.module.training
        try:
            self.module.eval()
            with torch.no_grad():
                out = self.module(input_ids=ids)
        except Exception as exc:  # noqa: BLE001 - any failure of the forward is the teacher's
            raise TeacherError(f"canary forward failed: {type(exc).__name__}: {exc}") from exc
        finally:
            self.module.train(was_training)
        logits = getattr(out, "logits", out[0] if isinstance(out, (tuple, list)) else out)
        logits = logits[:, logprob_start_len:-1].float()
        if self.temperature != 1.0:
            logits = logits / self.temperature
        logp = torch.log_softmax(logits, dim=-1)
        token = logp.gather(-1, ids[:, logprob_start_len + 1 :].unsqueeze(-1)).squeeze(-1)
        tops = logp.topk(min(top_k, logp.shape[-1]), dim=-1) if top_k > 0 else None
        return ScoreResult(
            [t.cpu() for t in token],
            [t.cpu() for t in tops.values] if tops is not None else None,
            [t.cpu() for t in tops.indices] if tops is not None else None,
        )


class ModuleCanary:
    """Checks an in-process teacher module on the canary, against its previous clean step.

    Args:
        module: the teacher.
        canary: the canary (``checks.canary`` of the guard's configuration by default).
        vocab_size: V, when the module's config does not say it.
        temperature: the temperature the trainer consumes the teacher at (see
            :class:`ModuleScorer`); set it later through ``scorer.temperature``.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        canary: Canary | CanaryCheck | None = None,
        *,
        vocab_size: int | None = None,
        temperature: float = 1.0,
    ) -> None:
        self.scorer = ModuleScorer(module, temperature=temperature)
        self.canary = canary if isinstance(canary, Canary) else Canary(canary)
        if self.canary.vocab_size is None:
            self.canary.vocab_size = vocab_size or self.scorer.vocab_size
        self.running = False
        """True during the canary's own forward (so forward hooks on the teacher skip it)."""

    def check(self, step: int) -> list[Finding]:
        """Score the canary now; findings if the teacher changed since its last clean step (a
        warning if its forward failed: the guard could not check it this step)."""
        self.running = True
        try:
            measured = self.canary.measure(self.scorer, step)  # type: ignore[arg-type]
        except TeacherError as e:
            return [teacher_error_finding(e, step, during="canary", severity=Severity.WARN)]
        finally:
            self.running = False
        findings = self.canary.judge(measured, teacher=self.scorer)  # type: ignore[arg-type]
        if not findings:
            self.canary.accept(measured)
        return [dataclasses.replace(f, message=in_process(f.message)) for f in findings]

    def state_dict(self) -> dict[str, Any]:
        return self.canary.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.canary.load_state_dict(state)
