"""Stand-ins for the teachers layer (Teacher, canary, repair) while it is not merged.

Used only where the real ones are absent; the tests that need the real reference server skip
until it lands. They follow the names the guard codes against: ``score(..., top_k=,
logprob_start_len=) -> ScoreResult``, ``release``/``resume``/``reload_weights``/``flush_cache``,
``vocab_size``, ``asleep``, ``sleep_state.mark_*``; ``canary.fingerprint/verify``;
``distill_guard.repair.repair_teacher``.
"""

from __future__ import annotations

import math
import sys
import types
from dataclasses import dataclass

import torch

from distill_guard.findings import Code, Finding, Severity


@dataclass(frozen=True)
class ScoreResult:
    token_logprobs: list
    topk_logprobs: list | None = None
    topk_ids: list | None = None


class _Sleep:
    def __init__(self):
        self.released = False

    def mark_released(self, tags):
        self.released = True

    def mark_resumed(self, tags):
        self.released = False


class StandInTeacher:
    """A tiny torch model; a wake without backup leaves every weight zero (a uniform teacher)."""

    def __init__(self, model):
        self.model = model.eval()
        self.saved = {n: p.detach().clone() for n, p in model.named_parameters()}
        self.sleep_state = _Sleep()
        self.reloads = 0

    @property
    def vocab_size(self):
        return self.model.config.vocab_size

    @property
    def asleep(self):
        return self.sleep_state.released

    def score(self, sequences, *, top_k=0, logprob_start_len=0):
        toks, tops, ids = [], [], []
        with torch.no_grad():
            for seq in sequences:
                x = torch.tensor([seq])
                lp = torch.log_softmax(self.model(input_ids=x).logits[0].float(), -1)
                lp = lp[logprob_start_len:-1]
                toks.append(lp.gather(-1, x[0, logprob_start_len + 1 :, None]).squeeze(-1))
                if top_k:
                    v, i = lp.topk(top_k, -1)
                    tops.append(v)
                    ids.append(i)
        return ScoreResult(toks, tops or None, ids or None)

    def die(self):
        """What release + resume without CPU backup does to the weights."""
        with torch.no_grad():
            for p in self.model.parameters():
                p.zero_()

    def release(self, tags=None):
        self.die()
        self.sleep_state.mark_released(tags)

    def resume(self, tags=None):
        self.sleep_state.mark_resumed(tags)

    def reload_weights(self, model_path=None):
        self.reloads += 1
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for n, t in self.saved.items():
                params[n].copy_(t)

    def flush_cache(self):
        pass

    def server_info(self):
        return {"enable_weights_cpu_backup": False}


class StandInCanary:
    """Fingerprint before sleep, compare after wake; without a fingerprint, test uniformity."""

    tokens = list(range(1, 17))

    def __init__(self):
        self.ref = None

    def _lp(self, teacher):
        return teacher.score([self.tokens]).token_logprobs[0]

    def fingerprint(self, teacher, step=None):
        self.ref = self._lp(teacher)
        return self.ref

    def verify(self, teacher, step=None):
        cur = self._lp(teacher)
        if self.ref is not None:
            delta = float((cur - self.ref).abs().max())
            if delta > 0.1:
                return [
                    Finding(
                        Code.TEACHER_FINGERPRINT_MISMATCH,
                        Severity.CRITICAL,
                        f"canary moved {delta:.3f}",
                        step,
                    )
                ]
            return []
        uniform = -math.log(teacher.vocab_size)
        if bool(((cur - uniform).abs() < 1e-3).all()):
            return [Finding(Code.TEACHER_UNIFORM, Severity.CRITICAL, "canary uniform", step)]
        return []


@dataclass
class Outcome:
    ok: bool
    attempts: int


def standin_repair_teacher(
    teacher, canary, *, reloader=None, max_attempts=3, backoff_s=0.0, on_event=None
):
    for attempt in range(1, max_attempts + 1):
        if teacher.asleep:
            teacher.resume()
        (reloader or (lambda t: t.reload_weights()))(teacher)
        teacher.flush_cache()
        bad = [f for f in canary.verify(teacher) if f.severity is Severity.CRITICAL]
        if on_event is not None:
            on_event("repair_attempt", {"attempt": attempt, "ok": not bad})
        if not bad:
            return Outcome(True, attempt)
    return Outcome(False, max_attempts)


def install_standin_repair(monkeypatch):
    """Provide ``distill_guard.repair`` for the guard's rewake when the real one is absent."""
    try:
        import distill_guard.repair  # noqa: F401
    except ImportError:
        mod = types.ModuleType("distill_guard.repair")
        mod.repair_teacher = standin_repair_teacher
        monkeypatch.setitem(sys.modules, "distill_guard.repair", mod)
