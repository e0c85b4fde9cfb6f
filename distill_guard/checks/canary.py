"""Canary: score a fixed sequence before sleep and after wake; a teacher that lost its weights differs."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from distill_guard.findings import Code, Finding, Severity
from distill_guard.signals import infer_uniform_vocab_size, uniform_logprob
from distill_guard.teachers.base import Teacher, TeacherError

FIX = (
    "Rewake the teacher (resume, reload its weights, flush, verify) now, and relaunch it with the "
    "weights CPU backup: SGLang --enable-weights-cpu-backup (Relax: "
    "--teacher-sglang-enable-weights-cpu-backup)."
)
FALLBACK_TOKEN_RANGE = 256
"""Ids drawn when V is unknown: every real vocabulary has its byte tokens below 256."""


@dataclass
class CanaryFingerprint:
    """What one canary scoring call returned: the reference a later call is held against."""

    tokens: list[int]
    token_logprobs: list[float]
    """``len(tokens) - 1`` logprobs, of ``tokens[1:]``."""
    topk_logprobs: list[list[float]] | None
    topk_ids: list[list[int]] | None
    step: int | None = None
    seconds: float = 0.0
    """How long the scoring call took."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CanaryFingerprint:
        return cls(**data)


@dataclass
class CanaryComparison:
    """The numbers behind the last verify, for tables (``distill-guard probe``) and the event log."""

    step: int | None
    max_abs_delta: float | None
    """Largest |Δ logprob| against the fingerprint over token and top-k values (None: no reference)."""
    mean_abs_delta: float | None
    """Mean |Δ logprob| over the canary's token logprobs (None: no reference)."""
    top1_logprob: float
    """Mean over positions of the top-1 logprob (NaN without top-k); −ln V when uniform."""
    uniform: bool
    nonfinite: int
    vocab_size: int | None
    tolerance_mean: float
    tolerance_max: float
    deterministic: bool
    seconds: float


@dataclass
class CanaryCheck:
    """Fingerprint a teacher on a fixed sequence before sleep; verify it after wake.

    Catches what the teacher-batch checks cannot see before the damage is done: a teacher that
    woke uniform (zeroed weights), one that woke with garbage, and partial damage (buffers lost,
    a half-applied reload) that is not uniform at all. The comparison is across one sleep
    boundary only, so teachers whose weights move between steps (EMA) are judged correctly as
    long as ``fingerprint`` runs after each update, just before the sleep.
    """

    tokens: list[int] | None = None
    """The canary sequence. ``None``: ``length`` ids drawn with ``seed`` from [0, V) (or from
    [0, 256) when V is unknown), fixed at first use and kept in ``state_dict``."""
    seed: int = 0
    """Seed of the drawn sequence."""
    length: int = 64
    """Length of the drawn sequence (it scores ``length - 1`` tokens)."""
    top_k: int = 16
    """Top-k logprobs per position; the uniform signature needs them (flat at −ln V). 0 turns it off."""
    tolerance_mean: float = 0.1
    """Without deterministic inference: largest mean |Δ logprob| (nats) that is still noise. bf16
    dense models typically wobble 0.01–0.05; a lost or garbage weight moves it by whole nats."""
    tolerance_max: float = 1.0
    """Without deterministic inference: largest single |Δ logprob| (nats) that is still noise."""
    deterministic: bool | None = None
    """Whether the teacher runs deterministic inference (then the comparison is exact). ``None``:
    read ``enable_deterministic_inference`` from the teacher's server info."""
    deterministic_tolerance: float = 0.0
    """With deterministic inference: largest |Δ logprob| allowed (0.0 = bit-exact)."""
    uniform_atol: float = 1e-3
    """Distance from −ln V (nats) within which a logprob counts as uniform."""
    vocab_size: int | None = None
    """V; ``None`` asks the teacher (``config.json`` at its ``model_path``), else infers it from
    a flat response."""

    def __post_init__(self) -> None:
        # Runtime state, not configuration: kept out of the dataclass fields so the check is
        # also its own Hydra schema.
        self._fingerprint: CanaryFingerprint | None = None
        self._tokens: list[int] | None = None
        self._deterministic: bool | None = None
        self.last_comparison: CanaryComparison | None = None
        """What the last ``verify`` measured."""

    # -- measuring -------------------------------------------------------------------------

    def resolve_vocab_size(self, teacher: Teacher | None) -> int | None:
        """V from this check, else from the teacher; None if neither can tell."""
        if self.vocab_size is None and teacher is not None:
            try:
                self.vocab_size = teacher.vocab_size
            except TeacherError:
                return None
        return self.vocab_size

    def canary_tokens(self, teacher: Teacher | None = None) -> list[int]:
        """The sequence, drawn on first use and then fixed."""
        if self._tokens is None:
            if self.tokens is not None:
                self._tokens = [int(t) for t in self.tokens]
            else:
                high = self.resolve_vocab_size(teacher) or FALLBACK_TOKEN_RANGE
                gen = torch.Generator().manual_seed(self.seed)
                self._tokens = torch.randint(0, high, (self.length,), generator=gen).tolist()
            if len(self._tokens) < 2:
                raise ValueError(f"a canary needs at least 2 tokens, got {len(self._tokens)}")
        return list(self._tokens)

    def is_deterministic(self, teacher: Teacher | None) -> bool:
        """The configured flag, else the teacher's ``enable_deterministic_inference``."""
        if self.deterministic is not None:
            return self.deterministic
        if self._deterministic is None:
            try:
                info = teacher.server_info() if teacher is not None else {}
            except TeacherError:
                return False  # unknown: the wider tolerance, not a false alarm; ask again later
            self._deterministic = bool(info.get("enable_deterministic_inference", False))
        return self._deterministic

    def measure(self, teacher: Teacher, step: int | None = None) -> CanaryFingerprint:
        """One scoring call on the canary. Raises :class:`TeacherError` if the teacher fails."""
        tokens = self.canary_tokens(teacher)
        t0 = time.perf_counter()
        res = teacher.score([tokens], top_k=self.top_k, logprob_start_len=0)
        seconds = time.perf_counter() - t0
        return CanaryFingerprint(
            tokens=tokens,
            token_logprobs=res.token_logprobs[0].tolist(),
            topk_logprobs=res.topk_logprobs[0].tolist() if res.topk_logprobs else None,
            topk_ids=res.topk_ids[0].tolist() if res.topk_ids else None,
            step=step,
            seconds=seconds,
        )

    def fingerprint(self, teacher: Teacher, step: int | None = None) -> CanaryFingerprint:
        """Score the canary and keep it as the reference for the next ``verify`` (before sleep)."""
        self.is_deterministic(teacher)
        fp = self.measure(teacher, step)
        self._fingerprint = fp
        return fp

    @property
    def last_fingerprint(self) -> CanaryFingerprint | None:
        return self._fingerprint

    def verify(self, teacher: Teacher, step: int | None = None) -> list[Finding]:
        """Score the canary after wake and judge it; empty when the teacher is as it was.

        Raises :class:`TeacherError` when the teacher cannot be scored (the guard turns that into
        ``teacher.unreachable`` with :func:`teacher_error_finding`).
        """
        fp = self.measure(teacher, step)
        return self.judge(fp, step=step, teacher=teacher)

    # -- judging ---------------------------------------------------------------------------

    def judge(
        self, fp: CanaryFingerprint, *, step: int | None = None, teacher: Teacher | None = None
    ) -> list[Finding]:
        """Findings for one measurement against the stored fingerprint (pure but for caching V)."""
        tok = torch.tensor(fp.token_logprobs, dtype=torch.float64)
        topk = torch.tensor(fp.topk_logprobs, dtype=torch.float64) if fp.topk_logprobs else None
        everything = torch.cat([tok, topk.reshape(-1)]) if topk is not None else tok
        nonfinite = int((~torch.isfinite(everything)).sum())
        top1 = float(topk[:, 0].mean()) if topk is not None and topk.numel() else math.nan
        det = self.is_deterministic(teacher)
        ref = (
            self._fingerprint
            if self._fingerprint and self._fingerprint.tokens == fp.tokens
            else None
        )
        max_d = mean_d = None
        if ref is not None and nonfinite == 0:
            d_tok = (tok - torch.tensor(ref.token_logprobs, dtype=torch.float64)).abs()
            mean_d = float(d_tok.mean()) if d_tok.numel() else 0.0
            max_d = float(d_tok.max()) if d_tok.numel() else 0.0
            if topk is not None and ref.topk_logprobs:
                d_top = (topk - torch.tensor(ref.topk_logprobs, dtype=torch.float64)).abs()
                max_d = max(max_d, float(d_top.max()) if d_top.numel() else 0.0)
        vocab, inferred = (
            self._uniform_vocab(tok, topk, teacher) if nonfinite == 0 else (None, False)
        )
        findings: list[Finding] = []
        common = {"canary_tokens": len(fp.tokens), "top_k": self.top_k}
        if nonfinite:
            findings.append(
                Finding(
                    Code.TEACHER_NONFINITE,
                    Severity.CRITICAL,
                    f"Canary: {nonfinite} of {everything.numel()} teacher logprobs are NaN or ±inf "
                    f"(bound: none). The teacher's weights or its numerics are broken. {FIX}",
                    step,
                    {**common, "nonfinite": nonfinite, "count": everything.numel()},
                )
            )
        elif vocab is not None:
            u = uniform_logprob(vocab)
            what = f"all {tok.numel()} token logprobs" + (
                f" and all {topk.shape[0]}×{topk.shape[1]} top-{topk.shape[1]} logprobs"
                if topk is not None
                else ""
            )
            findings.append(
                Finding(
                    Code.TEACHER_UNIFORM,
                    Severity.CRITICAL,
                    f"Canary: {what} are within {self.uniform_atol:g} of −ln V = {u:.5f} "
                    f"(V={vocab}{', inferred from the response' if inferred else ''}): the teacher's "
                    f"distribution is uniform, its weights are gone (typically a wake with the "
                    f"memory saver on and no weights CPU backup). {FIX}",
                    step,
                    {
                        **common,
                        "top1_logprob": top1,
                        "uniform_logprob": u,
                        "vocab_size": vocab,
                        "vocab_inferred": inferred,
                        "atol": self.uniform_atol,
                    },
                )
            )
        elif max_d is not None and mean_d is not None and self._mismatch(mean_d, max_d, det):
            bound = (
                f"bound {self.deterministic_tolerance:g}, deterministic inference"
                if det
                else f"bounds mean {self.tolerance_mean:g}, max {self.tolerance_max:g}"
            )
            findings.append(
                Finding(
                    Code.TEACHER_FINGERPRINT_MISMATCH,
                    Severity.CRITICAL,
                    f"Canary: logprobs differ from the fingerprint taken before sleep (step "
                    f"{ref.step if ref else None}): mean |Δ| {mean_d:.4g} nats, max |Δ| "
                    f"{max_d:.4g} ({bound}). The weights changed across sleep and wake (garbage "
                    f"or partly lost weights, e.g. RoPE buffers). {FIX} If this is benign noise, "
                    f"raise tolerance_mean / tolerance_max.",
                    step,
                    {
                        **common,
                        "mean_abs_delta": mean_d,
                        "max_abs_delta": max_d,
                        "tolerance_mean": self.tolerance_mean,
                        "tolerance_max": self.tolerance_max,
                        "deterministic": det,
                        "deterministic_tolerance": self.deterministic_tolerance,
                        "fingerprint_step": ref.step if ref else None,
                    },
                )
            )
        self.last_comparison = CanaryComparison(
            step=step,
            max_abs_delta=max_d,
            mean_abs_delta=mean_d,
            top1_logprob=top1,
            uniform=vocab is not None,
            nonfinite=nonfinite,
            vocab_size=self.vocab_size,
            tolerance_mean=self.deterministic_tolerance if det else self.tolerance_mean,
            tolerance_max=self.deterministic_tolerance if det else self.tolerance_max,
            deterministic=det,
            seconds=fp.seconds,
        )
        return findings

    def _mismatch(self, mean_d: float, max_d: float, det: bool) -> bool:
        if det:
            return max_d > self.deterministic_tolerance
        return mean_d > self.tolerance_mean or max_d > self.tolerance_max

    def _uniform_vocab(
        self, tok: torch.Tensor, topk: torch.Tensor | None, teacher: Teacher | None
    ) -> tuple[int | None, bool]:
        """(V, inferred) when the measurement has the uniform signature, else (None, False).

        Repeated values are not the signature: every value must sit at −ln V. With V unknown, a
        top-k response that is flat across every position at one common value v is uniform only
        if that v is −ln V for a V of at least the top-k width; V is then inferred from v.
        """
        if tok.numel() == 0:
            return None, False
        values = torch.cat([tok, topk.reshape(-1)]) if topk is not None else tok
        vocab = self.resolve_vocab_size(teacher)
        if vocab is not None:
            if bool(((values - uniform_logprob(vocab)).abs() <= self.uniform_atol).all()):
                return vocab, False
            return None, False
        if topk is None or topk.shape[1] < 2 or topk.shape[0] < 2:
            return None, False  # a flat row alone proves nothing without V
        v = float(values.mean())
        if float((values - v).abs().max()) > self.uniform_atol or v >= 0:
            return None, False
        guess = infer_uniform_vocab_size(v)
        if guess < max(topk.shape[1], 2) or abs(uniform_logprob(guess) - v) > self.uniform_atol:
            return None, False
        self.vocab_size = guess
        return guess, True

    # -- state -----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "tokens": self._tokens,
            "vocab_size": self.vocab_size,
            "fingerprint": self._fingerprint.to_dict() if self._fingerprint else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._tokens = list(state["tokens"]) if state.get("tokens") is not None else None
        if state.get("vocab_size") is not None:
            self.vocab_size = int(state["vocab_size"])
        fp = state.get("fingerprint")
        self._fingerprint = CanaryFingerprint.from_dict(fp) if fp else None


def teacher_error_finding(
    error: TeacherError, step: int | None = None, *, during: str = ""
) -> Finding:
    """``teacher.unreachable`` for a teacher call that failed, naming the call and the error."""
    where = f" during {during}" if during else ""
    return Finding(
        Code.TEACHER_UNREACHABLE,
        Severity.CRITICAL,
        f"Teacher call failed{where}: {error}. The teacher cannot be checked or used until it "
        "answers; check that the server is up and reachable (and its API key).",
        step,
        {"error": str(error), "error_type": type(error).__name__, "during": during},
    )
