"""Teacher collapse: the teacher's scores are uniform (−ln V everywhere) or not finite."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from distill_guard import signals
from distill_guard.checks.base import Check, to_host
from distill_guard.errors import GuardValueError
from distill_guard.findings import Code, Finding, Severity
from distill_guard.observations import Metric, RunSpec, StepMetrics, TeacherScores
from distill_guard.signals import infer_uniform_vocab_size, mean_spread, uniform_logprob

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
        self._vocab_said = False

    def on_teacher_scores(self, scores: TeacherScores, run: RunSpec) -> list[Finding]:
        if not self.enabled:
            return []
        views = [
            v
            for v in (
                _View.of(scores.topk_logprobs, scores, topk=True),
                _View.of(scores.token_logprobs, scores, topk=False),
            )
            if v is not None
        ]
        findings: list[Finding] = []
        for view, summary in zip(views, self._summaries(views, run)):
            findings += self._judge(view, summary, scores, run)
        return _dedupe(findings)

    def on_step_metrics(self, metrics: StepMetrics, run: RunSpec) -> list[Finding]:
        mean = metrics.get(Metric.TEACHER_LOGPROB)
        if not self.enabled or mean is None or not math.isfinite(mean):
            return []
        if run.vocab_size is None:
            return self._pinned(mean, metrics.step)
        target = uniform_logprob(run.vocab_size)
        if abs(mean - target) > self.mean_atol:
            return self._below_uniform(mean, target, metrics.step, run.vocab_size) + self._pinned(
                mean, metrics.step, run.vocab_size
            )
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

    def _pinned(self, mean: float, step: int, configured: int | None = None) -> list[Finding]:
        """A mean pinned at −ln V for ``flat_steps`` steps betrays both. V unknown: this is the
        uniform test; V ``configured`` but the level another V's: the teacher is uniform over
        that V and the configured one is wrong (the exact test compared with the wrong −ln V)."""
        recent = self._recent_means
        recent.append(mean)
        if len(recent) < self.flat_steps or max(recent) - min(recent) > self.mean_atol:
            return []
        level = sum(recent) / len(recent)
        guessed = infer_uniform_vocab_size(level)
        if guessed < self.min_inferred_vocab:
            return []
        if configured is None:
            how = "Set vocab_size (replay: --vocab-size) to make this test exact."
        else:
            how = (
                f"The configured vocab_size V = {configured} (−ln V = "
                f"{uniform_logprob(configured):.5f}) does not fit it: check run.vocab_size "
                "(replay: --vocab-size) against the teacher's config.json."
            )
        values: dict[str, Any] = {
            "teacher_logprob_mean": mean,
            "flat_level": level,
            "inferred_vocab_size": guessed,
            "flat_steps": self.flat_steps,
        }
        if configured is not None:
            values["vocab_size"] = configured
        return [
            Finding(
                Code.TEACHER_UNIFORM,
                Severity.CRITICAL,
                f"Mean teacher logprob has sat at {level:.5f} = −ln {guessed} for "
                f"{self.flat_steps} steps (spread ≤ {self.mean_atol:g}): a uniform teacher over "
                f"a vocabulary of about {guessed}. {how} {FIX}",
                step,
                values,
            )
        ]

    def _below_uniform(self, mean: float, target: float, step: int, vocab: int) -> list[Finding]:
        """A mean teacher logprob below −ln V: a teacher over V tokens does not score the
        student's typical token below uniform unless the student has left it, so V is likely
        wrong (too small), and the uniform test then compares with the wrong −ln V. Said once
        a run; a healthy run with the right V never sees it."""
        if self._vocab_said or mean >= target - self.mean_atol:
            return []
        self._vocab_said = True
        return [
            Finding(
                Code.CONFIG_VOCAB_SIZE,
                Severity.WARN,
                f"Mean teacher logprob {mean:.5f} is below −ln V = {target:.5f} (the configured "
                f"vocab_size V = {vocab}): a teacher over {vocab} tokens cannot put the tokens it "
                "is asked about below uniform on average unless the student has left it. Most "
                f"likely V is wrong (this level is −ln {infer_uniform_vocab_size(mean)}), and the "
                "uniform-teacher test compares with the wrong −ln V: check run.vocab_size "
                "(replay: --vocab-size) against the teacher's config.json.",
                step,
                {"teacher_logprob_mean": mean, "uniform_logprob": target, "vocab_size": vocab},
            )
        ]

    def state_dict(self) -> dict[str, Any]:
        return {"recent_means": list(self._recent_means), "vocab_said": self._vocab_said}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._recent_means = deque(
            (float(x) for x in state.get("recent_means", [])), maxlen=self.flat_steps
        )
        self._vocab_said = bool(state.get("vocab_said", False))

    def _summaries(self, views: list[_View], run: RunSpec) -> list[_Summary]:
        """Every view's statistics in one host transfer, read on the raw values: the step's only
        sync while healthy (on CUDA float32, one Triton launch a view: :meth:`_fused_parts`). A
        view with a value that is not finite (its sum says so) is read again with those values
        set aside, in one more."""
        if views and all(_fusable(view) for view in views):
            got = self._fused_parts(views, run)
        else:
            raw = {(i, k): t for i, v in enumerate(views) for k, t in self._parts(v, run).items()}
            host = to_host(raw)
            got = [{k: x for (j, k), x in host.items() if j == i} for i in range(len(views))]
        out = []
        for view, mine in zip(views, got):
            if not math.isfinite(mine["sum"]):
                mine = to_host(self._parts(view, run, clean=True))
            out.append(_Summary.of(view, mine))
        return out

    def _fused_parts(self, views: list[_View], run: RunSpec) -> list[dict[str, float]]:
        """What :meth:`_parts` reads on the raw values, by
        :func:`~distill_guard.kernels.teacher_stats.triton_view_parts`: the same counts and
        maxima, the float64 sums in another order (equal to ~1e-15 of themselves)."""
        from distill_guard.kernels.teacher_stats import combine_parts, triton_view_parts

        known = run.vocab_size is not None
        target = uniform_logprob(run.vocab_size) if known else math.nan
        partials = [
            triton_view_parts(  # bounds of -inf count nothing where _parts counts nothing
                view.values,
                view.x if view.many else None,
                target=target,
                atol=self.atol,
                low_bound=self._near_bound(run) if known and view.topk else -math.inf,
                flat_below=-math.log(view.x.shape[1]) if view.many and not known else -math.inf,
            )
            for view in views
        ]
        host = torch.cat(partials).numpy(force=True)  # the one transfer
        got, start = [], 0
        for part in partials:
            mine = combine_parts(host[start : start + part.shape[0]])
            start += part.shape[0]
            if not known:  # no uniform count without V, as _parts: its fraction is NaN
                del mine["uniform"]
            got.append(mine)
        return got

    def _parts(self, view: _View, run: RunSpec, *, clean: bool = False) -> dict[str, torch.Tensor]:
        """The 0-d device tensors :class:`_Summary` reads, without a sync. ``clean`` counts the
        finite values and sums only those; the sums are those of
        :func:`~distill_guard.signals.teacher_logprob_stats`, to the last bit. Raw, ``high`` and
        ``mass`` (without logsumexp's passes) can clear a healthy batch; :meth:`_bounds` gives
        the exact values wherever they do not."""
        v = view.values
        finite = torch.isfinite(v) if clean else None
        kept = torch.where(finite, v, 0.0) if clean else v
        wide = kept.double()
        parts = {"sum": kept.sum(dtype=torch.float64), "sum_sq": wide.square().sum()}
        if clean:
            parts["finite"] = finite.sum(dtype=torch.float64)
        else:
            parts["high"] = v.float().amax()
            if view.many:
                parts["mass"] = view.x.float().exp().sum(dim=1).amax()
        if run.vocab_size is not None:
            target = uniform_logprob(run.vocab_size)
            parts["uniform"] = ((v - target).abs() <= self.atol).sum(dtype=torch.float64)
            if view.topk:
                low = wide <= self._near_bound(run)
                parts["low"] = (low & finite if clean else low).sum(dtype=torch.float64)
        elif view.many:
            parts["flat"] = self._flat_rows(view).sum(dtype=torch.float64)
        return parts

    def _judge(
        self, view: _View, s: _Summary, scores: TeacherScores, run: RunSpec
    ) -> list[Finding]:
        """One view's findings from its summary; the detail behind a finding (non-finite counts,
        a median, per-sample quantiles, a flat level) is computed only where one may be."""
        findings = self._nonfinite(view, scores.step) if s.nonfinite else []
        if s.nonfinite == s.count:
            return findings
        if s.nonfinite or not self._possible(view, s):
            impossible = self._impossible(*self._bounds(view), view.kind, scores.step)
            if impossible:  # not log-probabilities: nothing below can be read from them
                return findings + impossible
        measured = {
            "input": view.kind,
            "count": int(view.x.shape[0]),
            "top1_mean" if view.topk else "mean": s.mean,
            "spread": s.spread,
            "vocab_size": run.vocab_size,
        }
        if run.vocab_size is not None:
            return self._uniform(view, s, scores, run, measured, findings)
        if view.many:
            findings += self._flat(view, s, scores.step, measured)
        return findings

    def _uniform(
        self,
        view: _View,
        s: _Summary,
        scores: TeacherScores,
        run: RunSpec,
        measured: dict,
        findings: list[Finding],
    ) -> list[Finding]:
        """V known: a fraction of values at −ln V; else (top-k) a near-uniform batch or part."""
        topk, target = view.topk, uniform_logprob(run.vocab_size)
        bound = self.min_row_fraction if topk else self.min_token_fraction
        frac = s.uniform_fraction
        if frac < bound and topk:
            if scores.topk_own and s.median_low:  # a top-1 rule: only for the teacher's own top-k
                findings = findings + self._near_uniform(view.values, scores.step, run, measured)
            if not findings and scores.sample_index is not None and self._partial_possible(s):
                findings = findings + self._partial(view.values, scores, run, measured)
        if frac >= bound:
            what = "top-k rows have their top-1" if topk else "sampled-token logprobs sit"
            findings = findings + [
                Finding(
                    Code.TEACHER_UNIFORM,
                    Severity.CRITICAL,
                    f"{frac:.1%} of teacher {what} within {self.atol:g} of −ln V = "
                    f"{target:.5f} (V={run.vocab_size}; bound {bound:.1%}); spread "
                    f"{s.spread:.2e}. The teacher's distribution is uniform, as after a "
                    f"colocated SGLang wake without weights backup. {FIX}",
                    scores.step,
                    {
                        **measured,
                        "uniform_fraction": frac,
                        "bound": bound,
                        "uniform_logprob": target,
                    },
                )
            ]
        return findings

    def _flat(self, view: _View, s: _Summary, step: int, measured: dict) -> list[Finding]:
        """Without V a uniform row shows as k equal values below −ln k. Judge the flat rows on
        their own: a mean over all rows is diluted by the healthy ones."""
        frac = s.flat / view.x.shape[0]
        if not s.flat or frac < self.min_row_fraction:
            return []
        level = float(view.values[self._flat_rows(view)].double().mean())
        guessed = infer_uniform_vocab_size(level)
        return [
            Finding(
                Code.TEACHER_UNIFORM,
                Severity.CRITICAL,
                f"{frac:.1%} of teacher top-k rows are flat (all k values within "
                f"{self.atol:g}) at {level:.5f} = −ln {guessed}: a uniform teacher over a "
                f"vocabulary of about {guessed}. Set vocab_size to make this test exact. "
                f"{FIX}",
                step,
                {
                    **measured,
                    "row_flat_fraction": frac,
                    "flat_row_logprob": level,
                    "inferred_vocab_size": guessed,
                },
            )
        ]

    def _flat_rows(self, view: _View) -> torch.Tensor:
        """Top-k rows whose k values are all within ``atol`` of their top-1, below −ln k."""
        top1, low = view.values, view.x.amin(dim=1)
        return (
            ((top1 - low) <= self.atol) & (top1 < -math.log(view.x.shape[1])) & torch.isfinite(top1)
        )

    def _near_bound(self, run: RunSpec) -> float:
        """The top-1 logprob at or below which a position is near uniform."""
        return -self.near_uniform_fraction * run.log_vocab

    def _partial_possible(self, s: _Summary) -> bool:
        """Whether :meth:`_partial` can find anything: a sample's upper quartile is at or below
        the bound only if one of its values is (or is not finite)."""
        return bool(s.low or s.nonfinite) or self.min_sample_fraction <= 0

    def _near_uniform(
        self, top1: torch.Tensor, step: int, run: RunSpec, measured: dict
    ) -> list[Finding]:
        finite = top1[torch.isfinite(top1)]
        if finite.numel() == 0:
            return []
        median = float(finite.double().median())
        bound = self._near_bound(run)
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
        bound = self._near_bound(run)
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

    def _possible(self, view: _View, s: _Summary) -> bool:
        """Whether the summary proves every value ≤ ``atol`` and every row's mass within
        ``exp(atol)``. Its mass is a float32 sum of k exps, off logsumexp by under ~k·1e-7
        nats: 1e-5·k of margin leaves no doubt; a row nearer the bound gets the exact test."""
        k = view.x.shape[1] if view.topk else 0
        return s.high <= self.atol and s.mass <= self.atol - 1e-5 * k

    def _bounds(self, view: _View) -> tuple[float, float]:
        """The largest finite value and the largest row log-mass over the finite entries (−inf
        for tokens), exactly: the summary's, read on raw values, are spoilt by a non-finite one."""
        worst = [torch.where(torch.isfinite(view.values), view.values, -math.inf).float().amax()]
        if view.many:
            rows = torch.where(torch.isfinite(view.x), view.x, -math.inf).float()
            worst.append(torch.logsumexp(rows, dim=1).amax())
        high, mass = [*torch.stack(worst).tolist(), -math.inf][:2]  # one host sync
        return high, mass

    def _impossible(self, high: float, mass: float, kind: str, step: int) -> list[Finding]:
        """Values no distribution has: a log-probability above 0, or a top-k row whose
        probabilities sum past 1 (distinct ids of one distribution never do), each beyond
        ``atol``. Logits, a sign error or a wrong reduction between the teacher and the guard."""
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

    def _nonfinite(self, view: _View, step: int) -> list[Finding]:
        x, kind = view.x, view.kind
        bad = torch.isnan(x) | (x == math.inf)
        if not view.topk:  # a sampled token cannot have probability zero under a sane teacher
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


def _fusable(view: _View) -> bool:
    """Whether a view's healthy-path statistics can take the Triton kernel: float32 on CUDA
    (other dtypes compare with −ln V in their own precision, which the kernel does not), top-k
    rows up to :data:`~distill_guard.kernels.teacher_stats.MAX_FUSED_K` wide."""
    if not view.topk:
        return signals.fusable_float32(view.values)
    from distill_guard.kernels.teacher_stats import MAX_FUSED_K

    return view.x.shape[1] <= MAX_FUSED_K and signals.fusable_float32(view.values, view.x)


@dataclass
class _View:
    """One view of a step's scores, detached and kept: top-k rows ``[N, K]`` or sampled tokens
    ``[N]``. ``values`` are what the uniform tests read: each row's top-1 (its maximum; a NaN or
    +inf anywhere in a row reaches it), or the tokens."""

    x: torch.Tensor
    topk: bool
    values: torch.Tensor

    @classmethod
    def of(cls, x: torch.Tensor | None, scores: TeacherScores, *, topk: bool) -> _View | None:
        """The view of ``x``; None when it is absent or empty."""
        if x is None:
            return None
        if x.dim() != (2 if topk else 1):
            what = "top-k logprobs must be [N, K]" if topk else "token logprobs must be [N]"
            raise GuardValueError(f"teacher {what}, got shape {tuple(x.shape)}")
        x = scores.kept(x.detach())
        if x.numel() == 0:
            return None
        return cls(x, topk, scores.top1 if topk else x)

    @property
    def many(self) -> bool:
        """Top-k rows of more than one entry: a row mass and a flat level to read."""
        return self.topk and self.x.shape[1] > 1

    @property
    def kind(self) -> str:
        return "top-k rows" if self.topk else "sampled-token logprobs"


@dataclass(frozen=True)
class _Summary:
    """What the check reads of one view on the healthy path, from the step's one transfer."""

    count: int
    """Values read: rows (top-k) or tokens."""
    nonfinite: int
    mean: float
    """Mean of the finite values (NaN if there are none)."""
    spread: float
    uniform_fraction: float
    """Fraction of finite values within ``atol`` of −ln V (NaN when V is unknown)."""
    high: float
    """Largest value; +inf where not read (a clean summary: :meth:`TeacherCollapseCheck._bounds`
    then gives it)."""
    mass: float
    """Largest row log-mass, to ~k·1e-7 (top-k with k > 1 and all values finite; else −inf)."""
    low: int
    """Top-k with V: finite top-1 values at or below the near-uniform bound."""
    flat: int
    """Top-k without V: flat rows (:meth:`TeacherCollapseCheck._flat_rows`)."""

    @classmethod
    def of(cls, view: _View, got: dict[str, float]) -> _Summary:
        """From :meth:`TeacherCollapseCheck._parts`: raw (all values finite) or clean."""
        count = view.values.numel()
        n_fin, nan = got.get("finite", count), float("nan")
        mean, spread = mean_spread(n_fin, got["sum"], got["sum_sq"]) if n_fin else (nan, nan)
        return cls(
            count=count,
            nonfinite=int(count - n_fin),
            mean=mean,
            spread=spread,
            uniform_fraction=got["uniform"] / n_fin if "uniform" in got and n_fin else nan,
            high=got.get("high", math.inf),
            mass=math.log(got["mass"]) if got.get("mass", 0.0) > 0 else -math.inf,
            low=int(got.get("low", 0)),
            flat=int(got.get("flat", 0)),
        )

    @property
    def median_low(self) -> bool:
        """Whether the finite values' lower median is at or below the near-uniform bound: it is
        iff more than (n − 1) // 2 of the n finite values are."""
        return self.low > (self.count - self.nonfinite - 1) // 2


def _dedupe(findings: list[Finding]) -> list[Finding]:
    """One finding per code per call: top-k and token views of one batch describe one fault."""
    seen: dict[str, Finding] = {}
    for f in findings:
        seen.setdefault(f.code, f)
    return list(seen.values())
