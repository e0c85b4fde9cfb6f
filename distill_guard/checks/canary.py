"""Canary judgement: is a teacher's canary measurement after a wake the one it gave before sleep?

Pure: this module never calls a teacher. :class:`~distill_guard.live.canary.Canary` measures the
teacher (before sleep, after wake) and hands both measurements here.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch

from distill_guard.errors import GuardValueError
from distill_guard.findings import Code, Finding, Severity
from distill_guard.signals import infer_uniform_vocab_size, uniform_logprob

FIX = (
    "Rewake the teacher (resume, reload its weights, flush, verify) now, and relaunch it with the "
    "weights CPU backup: SGLang --enable-weights-cpu-backup (Relax: "
    "--teacher-sglang-enable-weights-cpu-backup)."
)
FALLBACK_TOKEN_RANGE = 256
"""Ids drawn when V is unknown: every real vocabulary has its byte tokens below 256."""


@dataclass
class CanaryMeasurement:
    """What one canary scoring call returned; the one before sleep is the reference after wake."""

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
    def from_dict(cls, data: dict[str, Any]) -> CanaryMeasurement:
        return cls(**data)


def _deltas(
    measured: CanaryMeasurement, reference: CanaryMeasurement
) -> tuple[float | None, float | None]:
    """(mean |Δ| over the token logprobs, max |Δ| over token and top-k values) of two
    measurements of the same tokens; (None, None) when either is not finite. Top-k rows are
    compared position by position over the width both have (values are sorted, so a swap of
    two near-equal ids moves nothing)."""
    tok = torch.tensor(measured.token_logprobs, dtype=torch.float64)
    ref = torch.tensor(reference.token_logprobs, dtype=torch.float64)
    if tok.shape != ref.shape or not bool(torch.isfinite(tok).all() and torch.isfinite(ref).all()):
        return None, None
    d_tok = (tok - ref).abs()
    mean_d = float(d_tok.mean()) if d_tok.numel() else 0.0
    max_d = float(d_tok.max()) if d_tok.numel() else 0.0
    if measured.topk_logprobs and reference.topk_logprobs:
        a = torch.tensor(measured.topk_logprobs, dtype=torch.float64)
        b = torch.tensor(reference.topk_logprobs, dtype=torch.float64)
        k = min(a.shape[-1], b.shape[-1])
        if a.shape[0] == b.shape[0] and k:
            d_top = (a[:, :k] - b[:, :k]).abs()
            if not bool(torch.isfinite(d_top).all()):
                return None, None
            max_d = max(max_d, float(d_top.max()))
    return mean_d, max_d


@dataclass
class CanaryComparison:
    """The numbers behind one judgement, for tables (``distill-guard probe``) and the event log."""

    step: int | None
    max_abs_delta: float | None
    """Largest |Δ logprob| against the reference over token and top-k values (None: no reference)."""
    mean_abs_delta: float | None
    """Mean |Δ logprob| over the canary's token logprobs (None: no reference)."""
    top1_logprob: float
    """Mean over positions of the top-1 logprob (NaN without top-k); −ln V when uniform."""
    uniform: bool
    nonfinite: int
    vocab_size: int | None
    """V as known to the judgement, or as inferred from a flat response (``vocab_inferred``)."""
    vocab_inferred: bool
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
    long as the fingerprint is taken after each update, just before the sleep.
    """

    tokens: list[int] | None = None
    """The canary sequence. ``None``: ``length`` ids drawn with ``seed`` from [0, V) (or from
    [0, 256) when V is unknown), fixed at first use and kept in the guard's state."""
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
    module_every_steps: int = 16
    """An in-process teacher module's canary (:mod:`distill_guard.live.module_canary`): before
    each update its weights fingerprint is taken, and the canary forward is skipped while the
    module is bit for bit the one last scored clean; it runs anyway at least every this many
    steps, for what the fingerprint cannot see (a sign flip or a permutation inside a tensor, a
    patched forward). 1: the forward at every check, no fingerprint."""

    def __post_init__(self) -> None:
        if self.module_every_steps < 1:
            raise GuardValueError(
                f"checks.canary.module_every_steps must be at least 1 (1: the canary forward "
                f"at every check), got {self.module_every_steps}"
            )

    def draw_tokens(self, vocab_size: int | None) -> list[int]:
        """The canary sequence: ``tokens`` if set, else ``length`` seeded ids below V (or 256)."""
        if self.tokens is not None:
            tokens = [int(t) for t in self.tokens]
        else:
            gen = torch.Generator().manual_seed(self.seed)
            high = vocab_size or FALLBACK_TOKEN_RANGE
            tokens = torch.randint(0, high, (self.length,), generator=gen).tolist()
        if len(tokens) < 2:
            raise GuardValueError(f"a canary needs at least 2 tokens, got {len(tokens)}")
        return tokens

    def judge(
        self,
        measured: CanaryMeasurement,
        reference: CanaryMeasurement | None,
        *,
        vocab_size: int | None,
        deterministic: bool,
    ) -> tuple[list[Finding], CanaryComparison]:
        """Findings for one measurement against the reference taken before sleep (if any)."""
        step = measured.step
        tok = torch.tensor(measured.token_logprobs, dtype=torch.float64)
        topk = (
            torch.tensor(measured.topk_logprobs, dtype=torch.float64)
            if measured.topk_logprobs
            else None
        )
        everything = torch.cat([tok, topk.reshape(-1)]) if topk is not None else tok
        nonfinite = int((~torch.isfinite(everything)).sum())
        top1 = float(topk[:, 0].mean()) if topk is not None and topk.numel() else math.nan
        ref = reference if reference is not None and reference.tokens == measured.tokens else None
        max_d = mean_d = None
        if ref is not None and nonfinite == 0:
            mean_d, max_d = _deltas(measured, ref)
        uniform_v, inferred = (
            self._uniform_vocab(tok, topk, vocab_size) if nonfinite == 0 else (None, False)
        )
        common = {"canary_tokens": len(measured.tokens), "top_k": self.top_k}
        findings: list[Finding] = []
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
        elif impossible := _impossible(everything, topk):
            findings.append(
                Finding(
                    Code.TEACHER_IMPOSSIBLE,
                    Severity.CRITICAL,
                    f"Canary: the teacher's answer is not log-probabilities: {impossible} "
                    f"(bound {IMPOSSIBLE_ATOL:g}). Its weights, its numerics or what answers at its "
                    f"URL is wrong. {FIX}",
                    step,
                    common,
                )
            )
        elif uniform_v is not None:
            findings.append(self._uniform_finding(tok, topk, uniform_v, inferred, top1, step))
        elif (
            max_d is not None
            and mean_d is not None
            and self._mismatch(mean_d, max_d, deterministic)
        ):
            findings.append(self._mismatch_finding(mean_d, max_d, deterministic, ref, step))
        comparison = CanaryComparison(
            step=step,
            max_abs_delta=max_d,
            mean_abs_delta=mean_d,
            top1_logprob=top1,
            uniform=uniform_v is not None,
            nonfinite=nonfinite,
            vocab_size=uniform_v if inferred else vocab_size,
            vocab_inferred=inferred,
            tolerance_mean=self.deterministic_tolerance if deterministic else self.tolerance_mean,
            tolerance_max=self.deterministic_tolerance if deterministic else self.tolerance_max,
            deterministic=deterministic,
            seconds=measured.seconds,
        )
        return findings, comparison

    def judge_reference(
        self,
        measured: CanaryMeasurement,
        reference: CanaryMeasurement,
        *,
        tolerance_mean: float,
        tolerance_max: float,
        source: str,
        temperature: float,
    ) -> tuple[Finding | None, dict[str, Any]]:
        """Is the live teacher the checkpoint it should be? The measurement against a reference
        taken outside the run (:mod:`distill_guard.live.teacher_reference`), with the kernel
        tolerance of that reference: a teacher wrong from its first wake (garbage, another
        checkpoint, another temperature, a copy of the student) is whole nats off."""
        values: dict[str, Any] = {
            "reference_source": source,
            "temperature": temperature,
            "tolerance_mean": tolerance_mean,
            "tolerance_max": tolerance_max,
        }
        if measured.tokens != reference.tokens:
            return None, values  # never compared: the canary adopts the reference's tokens
        mean_d, max_d = _deltas(measured, reference)
        if mean_d is None or max_d is None:
            return None, values  # non-finite: the judgement against the fingerprint says so
        values |= {"mean_abs_delta": mean_d, "max_abs_delta": max_d}
        if mean_d <= tolerance_mean and max_d <= tolerance_max:
            return None, values
        finding = Finding(
            Code.TEACHER_REFERENCE_MISMATCH,
            Severity.CRITICAL,
            f"Canary: the teacher's logprobs differ from its checkpoint's reference ({source}, "
            f"temperature {temperature:g}): mean |Δ| {mean_d:.4g} nats, max |Δ| {max_d:.4g} "
            f"(bounds mean {tolerance_mean:g}, max {tolerance_max:g}: kernel noise against the "
            "reference forward). The teacher scoring this run is not that checkpoint at that "
            "temperature: garbage or lost weights, another checkpoint, another temperature, or "
            "a copy of the student. Its scores must not train the student; reload it from the "
            "checkpoint, and check the teacher's launch (model path, temperature, weights CPU "
            "backup: SGLang --enable-weights-cpu-backup).",
            measured.step,
            {**values, "canary_tokens": len(measured.tokens), "top_k": self.top_k},
        )
        return finding, values

    def _uniform_finding(
        self,
        tok: torch.Tensor,
        topk: torch.Tensor | None,
        vocab: int,
        inferred: bool,
        top1: float,
        step: int | None,
    ) -> Finding:
        u = uniform_logprob(vocab)
        what = f"all {tok.numel()} token logprobs" + (
            f" and all {topk.shape[0]}×{topk.shape[1]} top-{topk.shape[1]} logprobs"
            if topk is not None
            else ""
        )
        return Finding(
            Code.TEACHER_UNIFORM,
            Severity.CRITICAL,
            f"Canary: {what} are within {self.uniform_atol:g} of −ln V = {u:.5f} "
            f"(V={vocab}{', inferred from the response' if inferred else ''}): the teacher's "
            f"distribution is uniform, its weights are gone (typically a wake with the "
            f"memory saver on and no weights CPU backup). {FIX}",
            step,
            {
                "canary_tokens": tok.numel() + 1,
                "top_k": self.top_k,
                "top1_logprob": top1,
                "uniform_logprob": u,
                "vocab_size": vocab,
                "vocab_inferred": inferred,
                "atol": self.uniform_atol,
            },
        )

    def _mismatch_finding(
        self,
        mean_d: float,
        max_d: float,
        det: bool,
        ref: CanaryMeasurement | None,
        step: int | None,
    ) -> Finding:
        bound = (
            f"bound {self.deterministic_tolerance:g}, deterministic inference"
            if det
            else f"bounds mean {self.tolerance_mean:g}, max {self.tolerance_max:g}"
        )
        return Finding(
            Code.TEACHER_FINGERPRINT_MISMATCH,
            Severity.CRITICAL,
            f"Canary: logprobs differ from the fingerprint taken before sleep (step "
            f"{ref.step if ref else None}): mean |Δ| {mean_d:.4g} nats, max |Δ| "
            f"{max_d:.4g} ({bound}). The weights changed across sleep and wake (garbage "
            f"or partly lost weights, e.g. RoPE buffers). {FIX} If this is benign noise, "
            f"raise tolerance_mean / tolerance_max.",
            step,
            {
                "canary_tokens": len(ref.tokens) if ref else None,
                "top_k": self.top_k,
                "mean_abs_delta": mean_d,
                "max_abs_delta": max_d,
                "tolerance_mean": self.tolerance_mean,
                "tolerance_max": self.tolerance_max,
                "deterministic": det,
                "deterministic_tolerance": self.deterministic_tolerance,
                "fingerprint_step": ref.step if ref else None,
            },
        )

    def _mismatch(self, mean_d: float, max_d: float, det: bool) -> bool:
        if det:
            return max_d > self.deterministic_tolerance
        return mean_d > self.tolerance_mean or max_d > self.tolerance_max

    def _uniform_vocab(
        self, tok: torch.Tensor, topk: torch.Tensor | None, vocab: int | None
    ) -> tuple[int | None, bool]:
        """(V, inferred) when the measurement has the uniform signature, else (None, False).

        Repeated values are not the signature: every value must sit at −ln V. With V unknown, a
        top-k response that is flat across every position at one common value v is uniform only
        if that v is −ln V for a V of at least the top-k width; V is then inferred from v.
        """
        if tok.numel() == 0:
            return None, False
        values = torch.cat([tok, topk.reshape(-1)]) if topk is not None else tok
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
        return guess, True


IMPOSSIBLE_ATOL = 1e-3
"""How far past 0 a log-probability, or past 1 a top-k row's mass, may read before it is
impossible (fp32 rounding stays far inside it)."""


def _impossible(everything: torch.Tensor, topk: torch.Tensor | None) -> str | None:
    """What no distribution gives (all values finite): a logprob above 0, a top-k row (distinct
    ids) whose probabilities sum past 1."""
    high = float(everything.max()) if everything.numel() else 0.0
    if high > IMPOSSIBLE_ATOL:
        return f"a logprob of {high:+.4g} (a log-probability is ≤ 0)"
    if topk is not None and topk.numel() and topk.shape[-1] > 1:
        mass = float(torch.logsumexp(topk, dim=-1).max())
        if mass > IMPOSSIBLE_ATOL:
            return f"a top-k row whose probabilities sum to {math.exp(mass):.4g} (at most 1)"
    return None
