"""Teacher collapse: the teacher's scores are uniform (−ln V everywhere) or not finite."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from distill_guard.checks.base import Check
from distill_guard.findings import Code, Finding, Severity
from distill_guard.observations import Metric, RunSpec, StepMetrics, TeacherScores
from distill_guard.signals import infer_uniform_vocab_size, teacher_logprob_stats, uniform_logprob

FIX = (
    "Re-load the teacher's weights now (the guard's rewake does this), and relaunch the teacher "
    "with its weights CPU backup on: SGLang --enable-weights-cpu-backup "
    "(Relax: --teacher-sglang-enable-weights-cpu-backup)."
)


@dataclass
class TeacherCollapseCheck(Check):
    """Flags a teacher whose distribution is uniform, or whose logprobs are NaN/+inf.

    Uniformity is an invariant, not a statistic: if a row's top-1 logprob is −ln V the whole row
    is uniform. Repeated values alone are not collapse (a confident teacher repeats 0.0); the
    values must sit at −ln V. Sampled-token logprobs need a fraction of tokens at −ln V, since a
    healthy teacher may give one rare token that value by chance.
    """

    name: ClassVar[str] = "teacher_collapse"

    enabled: bool = True
    """Switch the check off without removing it from a preset."""
    atol: float = 1e-3
    """Distance from −ln V (nats) within which a logprob counts as uniform."""
    min_row_fraction: float = 0.01
    """Top-k input: flag when at least this fraction of rows is uniform (1 % catches one dead
    replica among many; a healthy teacher has none)."""
    near_uniform_fraction: float = 0.5
    """Top-k input: flag a teacher whose median top-1 logprob over the batch is at or below this
    × (−ln V), i.e. whose typical top choice has a probability under V^-0.5 (1/390 at V = 151936):
    garbage weights in a real architecture spread the distribution without making it exactly
    uniform (a teacher with noise weights measured −7.86 at V = 151936). A healthy teacher's
    median top-1 is above −2 nats."""
    min_sample_fraction: float = 0.05
    """With ``sample_index``: flag when at least this fraction of samples is near uniform
    throughout: even the upper quartile of its top-1 logprobs (its most confident quarter of
    positions) is at or below the near-uniform bound. One replica or tensor-parallel rank of
    several serving garbage leaves a bimodal batch whose overall median looks healthy (1 of 4
    is 25 %); a healthy sample with many uncertain positions still has confident ones."""
    min_token_fraction: float = 0.05
    """Sampled-token input: flag when at least this fraction of tokens sits at −ln V."""
    mean_atol: float = 1e-3
    """Scalar metric (``teacher_logprob``, a batch mean): flag when within this of −ln V."""
    flat_steps: int = 3
    """Without V: flag a ``teacher_logprob`` metric pinned (within ``mean_atol``) for this many
    steps at −ln V of some V ≥ ``min_inferred_vocab``, and name that V. A healthy teacher's batch
    mean moves from step to step; a uniform one sits on −ln V to the last digit."""
    min_inferred_vocab: int = 256
    """Smallest V a pinned level may be read as (−ln 256 = −5.55): every real vocabulary is
    larger, and a healthy batch mean is far above."""

    def __post_init__(self) -> None:
        self._recent_means: deque[float] = deque(maxlen=self.flat_steps)

    def on_teacher_scores(self, scores: TeacherScores, run: RunSpec) -> list[Finding]:
        if not self.enabled:
            return []
        findings: list[Finding] = []
        if scores.topk_logprobs is not None:
            findings += self._judge(scores.topk_logprobs, scores, run, topk=True)
        if scores.token_logprobs is not None:
            findings += self._judge(scores.token_logprobs, scores, run, topk=False)
        return _dedupe(findings)

    def on_step_metrics(self, metrics: StepMetrics, run: RunSpec) -> list[Finding]:
        mean = metrics.get(Metric.TEACHER_LOGPROB)
        if not self.enabled or mean is None or not math.isfinite(mean):
            return []
        if run.vocab_size is None:
            return self._pinned(mean, metrics.step)
        target = uniform_logprob(run.vocab_size)
        if abs(mean - target) > self.mean_atol:
            return []
        return [
            Finding(
                Code.TEACHER_UNIFORM,
                Severity.CRITICAL,
                f"Mean teacher logprob {mean:.5f} is within {self.mean_atol:g} of −ln V = "
                f"{target:.5f} (V={run.vocab_size}): the teacher is scoring with a uniform "
                f"distribution. {FIX}",
                metrics.step,
                {
                    "teacher_logprob_mean": mean,
                    "uniform_logprob": target,
                    "vocab_size": run.vocab_size,
                },
            )
        ]

    def _pinned(self, mean: float, step: int) -> list[Finding]:
        """V unknown: a mean pinned at −ln V for ``flat_steps`` steps betrays both."""
        recent = self._recent_means
        recent.append(mean)
        if len(recent) < self.flat_steps or max(recent) - min(recent) > self.mean_atol:
            return []
        level = sum(recent) / len(recent)
        guessed = infer_uniform_vocab_size(level)
        if guessed < self.min_inferred_vocab:
            return []
        return [
            Finding(
                Code.TEACHER_UNIFORM,
                Severity.CRITICAL,
                f"Mean teacher logprob has sat at {level:.5f} = −ln {guessed} for "
                f"{self.flat_steps} steps (spread ≤ {self.mean_atol:g}): a uniform teacher over "
                f"a vocabulary of about {guessed}. Set vocab_size (replay: --vocab-size) to make "
                f"this test exact. {FIX}",
                step,
                {
                    "teacher_logprob_mean": mean,
                    "flat_level": level,
                    "inferred_vocab_size": guessed,
                    "flat_steps": self.flat_steps,
                },
            )
        ]

    def state_dict(self) -> dict[str, Any]:
        return {"recent_means": list(self._recent_means)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._recent_means = deque(
            (float(x) for x in state.get("recent_means", [])), maxlen=self.flat_steps
        )

    def _judge(
        self, x: torch.Tensor, scores: TeacherScores, run: RunSpec, *, topk: bool
    ) -> list[Finding]:
        kind = "top-k rows" if topk else "sampled-token logprobs"
        x = x.detach()
        x = scores.kept(x)
        if x.numel() == 0:
            return []
        # Top-k: a row is uniform iff its top-1 is −ln V, so only the N row maxima matter. A NaN
        # or +inf anywhere in a row reaches its maximum, so the maxima also tell whether the
        # slower element-wise count is needed.
        values = x.amax(dim=1) if topk else x
        stats = teacher_logprob_stats(values, run.vocab_size, atol=self.atol)
        findings = self._nonfinite(x, kind, scores.step, topk=topk) if stats.nonfinite else []
        if stats.nonfinite == stats.count:
            return findings
        impossible = self._impossible(x, values, kind, scores.step, topk=topk)
        if impossible:  # not log-probabilities: nothing below can be read from them
            return findings + impossible
        measured = {
            "input": kind,
            "count": int(x.shape[0]),
            "top1_mean" if topk else "mean": stats.mean,
            "spread": stats.spread,
            "vocab_size": run.vocab_size,
        }
        if run.vocab_size is not None:
            target = uniform_logprob(run.vocab_size)
            bound = self.min_row_fraction if topk else self.min_token_fraction
            frac = stats.uniform_fraction
            if frac < bound and topk:
                if scores.topk_own:  # a top-1 rule: only for the teacher's own top-k
                    findings += self._near_uniform(values, scores.step, run, measured)
                if not findings and scores.sample_index is not None:
                    findings += self._partial(values, scores, run, measured)
            if frac >= bound:
                what = "top-k rows have their top-1" if topk else "sampled-token logprobs sit"
                findings.append(
                    Finding(
                        Code.TEACHER_UNIFORM,
                        Severity.CRITICAL,
                        f"{frac:.1%} of teacher {what} within {self.atol:g} of −ln V = "
                        f"{target:.5f} (V={run.vocab_size}; bound {bound:.1%}); spread "
                        f"{stats.spread:.2e}. The teacher's distribution is uniform, as after a "
                        f"colocated SGLang wake without weights backup. {FIX}",
                        scores.step,
                        {
                            **measured,
                            "uniform_fraction": frac,
                            "bound": bound,
                            "uniform_logprob": target,
                        },
                    )
                )
        elif topk and x.shape[1] > 1:
            # Without V a uniform row shows as k equal values below −ln k. Judge the flat rows
            # on their own: a mean over all rows is diluted by the healthy ones.
            top1, low = x.amax(dim=1), x.amin(dim=1)
            flat = (
                ((top1 - low) <= self.atol) & (top1 < -math.log(x.shape[1])) & torch.isfinite(top1)
            )
            n_flat = int(flat.sum())
            frac = n_flat / x.shape[0]
            if n_flat and frac >= self.min_row_fraction:
                level = float(top1[flat].double().mean())
                guessed = infer_uniform_vocab_size(level)
                findings.append(
                    Finding(
                        Code.TEACHER_UNIFORM,
                        Severity.CRITICAL,
                        f"{frac:.1%} of teacher top-k rows are flat (all k values within "
                        f"{self.atol:g}) at {level:.5f} = −ln {guessed}: a uniform teacher over a "
                        f"vocabulary of about {guessed}. Set vocab_size to make this test exact. "
                        f"{FIX}",
                        scores.step,
                        {
                            **measured,
                            "row_flat_fraction": frac,
                            "flat_row_logprob": level,
                            "inferred_vocab_size": guessed,
                        },
                    )
                )
        return findings

    def _near_uniform(
        self, top1: torch.Tensor, step: int, run: RunSpec, measured: dict
    ) -> list[Finding]:
        finite = top1[torch.isfinite(top1)]
        if finite.numel() == 0:
            return []
        median = float(finite.double().median())
        bound = -self.near_uniform_fraction * run.log_vocab
        if median > bound:
            return []
        return [
            Finding(
                Code.TEACHER_NEAR_UNIFORM,
                Severity.CRITICAL,
                f"The teacher's median top-1 logprob over {finite.numel()} positions is "
                f"{median:.3f}, at or below {bound:.3f} = {self.near_uniform_fraction:g} × "
                f"(−ln V = {-run.log_vocab:.3f}): its typical top choice has a probability of "
                f"{math.exp(median):.2e}. Not exactly uniform, but spread like a model whose "
                f"weights are noise (a garbage wake, a half-applied reload). {FIX}",
                step,
                {**measured, "top1_median": median, "bound": bound},
            )
        ]

    def _partial(
        self, top1: torch.Tensor, scores: TeacherScores, run: RunSpec, measured: dict
    ) -> list[Finding]:
        """Per-sample medians of the top-1: a fraction of samples near uniform."""
        sample = scores.kept(scores.sample_index.reshape(-1)).to(top1.device)
        if sample.numel() != top1.numel():
            return []
        bound = -self.near_uniform_fraction * run.log_vocab
        ids = sample.unique()
        upper = torch.stack([top1[sample == i].double().quantile(0.75) for i in ids])
        bad = int((upper <= bound).sum())
        frac = bad / ids.numel()
        if frac < self.min_sample_fraction:
            return []
        return [
            Finding(
                Code.TEACHER_NEAR_UNIFORM,
                Severity.CRITICAL,
                f"{bad} of {ids.numel()} samples ({frac:.0%}; bound {self.min_sample_fraction:.0%}) "
                f"have even their most confident quarter of teacher top-1 logprobs at or below "
                f"{bound:.3f} = "
                f"{self.near_uniform_fraction:g} × (−ln V), while the batch as a whole looks "
                "healthy: part of the teacher (one replica, one tensor-parallel rank) is serving "
                f"a near-uniform distribution. Find and restart that part. {FIX}",
                scores.step,
                {**measured, "sample_fraction": frac, "samples": int(ids.numel()), "bound": bound},
            )
        ]

    def _impossible(
        self, x: torch.Tensor, values: torch.Tensor, kind: str, step: int, *, topk: bool
    ) -> list[Finding]:
        """Values no distribution has: a log-probability above 0, or a top-k row whose
        probabilities sum past 1 (distinct ids of one distribution never do), each beyond
        ``atol``. Logits, a sign error or a wrong reduction between the teacher and the guard."""
        worst = [torch.where(torch.isfinite(values), values, -math.inf).float().amax()]
        if topk and x.shape[1] > 1:
            rows = torch.where(torch.isfinite(x), x, -math.inf).float()
            worst.append(torch.logsumexp(rows, dim=1).amax())
        high, mass = [*torch.stack(worst).tolist(), -math.inf][:2]  # one host sync
        if high <= self.atol and mass <= self.atol:
            return []
        what = (
            f"the largest is {high:+.4g} (a log-probability is ≤ 0)"
            if high > self.atol
            else f"a row's probabilities sum to {math.exp(mass):.4g} (at most 1)"
        )
        return [
            Finding(
                Code.TEACHER_IMPOSSIBLE,
                Severity.CRITICAL,
                f"The teacher {kind} are not log-probabilities: {what}, beyond {self.atol:g}. "
                "A loss built on them trains toward nothing the teacher said. Check what reaches "
                "the guard and the loss: logits where log-softmax was meant, a sign flipped, "
                "or the wrong tensor.",
                step,
                {"input": kind, "max_logprob": high, "max_row_logmass": mass, "atol": self.atol},
            )
        ]

    def _nonfinite(self, x: torch.Tensor, kind: str, step: int, *, topk: bool) -> list[Finding]:
        bad = torch.isnan(x) | (x == math.inf)
        if not topk:  # a sampled token cannot have probability zero under a sane teacher
            bad |= x == -math.inf
        else:  # −inf inside a row is a masked vocabulary entry; a row of only −inf has no mass
            bad |= (x.amax(dim=1, keepdim=True) == -math.inf).expand_as(x)
        n_bad = int(bad.sum())
        if not n_bad:
            return []
        return [
            Finding(
                Code.TEACHER_NONFINITE,
                Severity.CRITICAL,
                f"{n_bad} of {bad.numel()} teacher {kind} values are NaN or infinite (bound: 0). "
                "The loss built on them is meaningless. Check the teacher's weights (a rewake "
                "reloads them) and its dtype/attention backend.",
                step,
                {"nonfinite": n_bad, "count": bad.numel(), "input": kind},
            )
        ]


def _dedupe(findings: list[Finding]) -> list[Finding]:
    """One finding per code per call: top-k and token views of one batch describe one fault."""
    seen: dict[str, Finding] = {}
    for f in findings:
        seen.setdefault(f.code, f)
    return list(seen.values())
