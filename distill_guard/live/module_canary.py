"""The canary for a teacher that lives in the trainer's own process (an ``nn.Module``).

In-process trainers (TRL's GKD, a plain loop, Lightning) have no sleep and wake, and a teacher
whose weights turn to noise is not uniform: its scores look like any teacher's. What does tell is
the teacher itself: the same fixed sequence, scored again, no longer gives what it gave at the
last step. :class:`ModuleCanary` checks the teacher before each update and holds its canary
against the last clean measurement, so a teacher that changed is caught before the update that
would use it. The reference moves with each clean step, so a teacher updated on purpose (EMA, a
few percent a step) stays clean.

The check is cheap where the teacher did not change: a weights fingerprint
(:mod:`distill_guard.live.weights_fingerprint`) is taken first, and while it is bit for bit the
one of the last clean forward the forward is skipped. The forward runs on the first check, after
``load_state_dict`` or :meth:`ModuleCanary.weights_changed`, whenever the fingerprint changed or
cannot be taken, and at least every ``checks.canary.module_every_steps`` steps.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

import torch

from distill_guard.checks.canary import FIX, CanaryCheck, CanaryMeasurement
from distill_guard.findings import Finding, Severity
from distill_guard.live.canary import Canary, teacher_error_finding
from distill_guard.live.weights_fingerprint import WeightsFingerprint, take_fingerprint
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


@dataclass(frozen=True)
class CleanForward:
    """The last canary forward judged clean: what it scored, and what it was held against."""

    step: int
    fingerprint: WeightsFingerprint
    measured: CanaryMeasurement
    """The measurement it accepted as the canary's reference."""
    reference: object
    """The canary's reference from outside the run at the time (compared by identity)."""
    temperature: float


class ModuleCanary:
    """Checks an in-process teacher module on the canary, against its last clean measurement.

    Args:
        module: the teacher.
        canary: the canary (``checks.canary`` of the guard's configuration by default; its
            ``module_every_steps`` is the forward's schedule while the fingerprint is unchanged).
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
        self.forwards = 0
        """Checks that ran the canary forward."""
        self.checked_by_fingerprint = 0
        """Checks that skipped it: the weights were bit for bit those of the last clean one."""
        self.last_checked_by: Literal["forward", "fingerprint"] | None = None
        self._clean: CleanForward | None = None

    @property
    def every_steps(self) -> int:
        return self.canary.check.module_every_steps

    def check(self, step: int) -> list[Finding]:
        """Check the teacher now; findings if it changed since its last clean measurement (a
        warning if its forward failed: the guard could not check it this step).

        The forward is skipped when the weights fingerprint is the last clean forward's, that
        forward is fewer than ``module_every_steps`` steps back, and the canary's reference and
        temperature are those it was held against; otherwise the canary is scored."""
        fingerprint = take_fingerprint(self.scorer.module) if self.every_steps > 1 else None
        if fingerprint is not None and self._unchanged(fingerprint, step):
            self.checked_by_fingerprint += 1
            self.last_checked_by = "fingerprint"
            return []
        return self._forward(step, fingerprint)

    def weights_changed(self) -> None:
        """Say the teacher's weights changed or may have (a reload, an update the host made):
        the next check runs the canary forward whatever the fingerprint says."""
        self._clean = None

    def _unchanged(self, fingerprint: WeightsFingerprint, step: int) -> bool:
        """The teacher cannot score otherwise than at the last clean forward, which is recent."""
        clean = self._clean
        return (
            clean is not None
            and 0 <= step - clean.step < self.every_steps
            and clean.fingerprint == fingerprint
            and clean.measured is self.canary.last_fingerprint
            and clean.reference is self.canary.reference
            and clean.temperature == self.scorer.temperature
        )

    def _forward(self, step: int, fingerprint: WeightsFingerprint | None) -> list[Finding]:
        """Score the canary and judge it. A clean one with a fingerprint is what later checks
        may skip against; anything else leaves nothing to skip against."""
        self._clean = None
        self.forwards += 1
        self.last_checked_by = "forward"
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
            if fingerprint is not None:
                self._clean = CleanForward(
                    step, fingerprint, measured, self.canary.reference, self.scorer.temperature
                )
        return [dataclasses.replace(f, message=in_process(f.message)) for f in findings]

    def state_dict(self) -> dict[str, Any]:
        return self.canary.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take a saved canary; the next check runs the forward (no fingerprint is saved: the
        module it was taken of may not be the one loaded)."""
        self.canary.load_state_dict(state)
        self._clean = None
