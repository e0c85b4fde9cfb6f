"""Token pairing: the teacher's scores belong to the student's tokens, position by position.

Three ways a healthy teacher's scores reach the loss unpaired, none of them loud:

- **vocabulary mismatch**: teacher and student vocabularies differ (151936 vs 152064 padding,
  another tokenizer), so the teacher ranks first ids the student does not have;
- **tokens mismatch**: the teacher was scored on ids from another tokenizer or template, so it
  reads noise and gives the student's sampled tokens far less than its own first choice at
  almost every position;
- **position shift**: teacher logprobs written at response positions instead of prediction
  positions, so row t holds the teacher's view of token t-1 (or t+1).

Public reports: huggingface/trl #4562, trl PR #6252 / #6457, ms-swift #9526, tinker-cookbook
#796 (tokenizers and templates); AReaL PR #1729, trl PR #6191, prime-rl PR #1525 (positions).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar, NamedTuple

import torch

from distill_guard import signals
from distill_guard.checks.base import Check, to_host
from distill_guard.findings import Code, Finding, Severity
from distill_guard.observations import RunSpec, TeacherScores


@dataclass
class TokenPairingCheck(Check):
    """Flags teacher scores that do not belong to the student's tokens at their positions.

    Needs more than logprobs: ``topk_ids`` (vocabulary, position), ``token_ids`` (position),
    ``token_logprobs`` with ``topk_logprobs`` (tokens). Each is critical but not the teacher's
    fault: a reload cannot help, so the policy skips the update and halts after three steps.
    """

    name: ClassVar[str] = "token_pairing"

    enabled: bool = True
    """Switch the check off without removing it from a preset."""
    max_foreign_top1_fraction: float = 0.0
    """Vocabulary: flag when more than this fraction of rows rank first an id at or beyond the
    student's vocabulary (``run.student_vocab_size``); a shared vocabulary has none."""
    max_median_gap: float = 5.0
    """Tokens: flag when the median of (teacher top-1 logprob − teacher logprob of the sampled
    token) is at or above this many nats: the teacher gives the student's own tokens e^-5 of
    its first choice at most positions. On-policy samples are plausible to a matched teacher."""
    min_positions: int = 32
    """Positions needed before the tokens and position tests judge (a few tokens prove nothing)."""
    shift_margin: float = 0.2
    """Position: flag when the teacher's first choice is the sampled token of a neighbouring
    position more often than its own, by at least this much (a fraction of positions). The
    first choice, not the top-k: where answers use a handful of tokens (A–D, a closing tag),
    all of them sit in every top-16 and membership tells nothing."""

    def on_teacher_scores(self, scores: TeacherScores, run: RunSpec) -> list[Finding]:
        if not self.enabled:
            return []
        ids, lagged, gaps = self._top1_ids(scores, run), self._lagged(scores), self._gaps(scores)
        got = to_host(  # the one sync of a paired step: each test reads its counts from it
            _vocabulary_parts(ids, run) | _positions_parts(lagged) | self._tokens_parts(gaps)
        )
        shifted = self._positions(lagged, got, scores.step)
        # a shift also makes the teacher disagree with every token: name the cause, not both
        vocabulary = self._vocabulary(ids, run, got, scores.step)
        return vocabulary + (shifted or self._tokens(gaps, got, scores.step))

    def _paired(
        self, per_token: torch.Tensor | None, rows: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Both views of the same positions, enough of them to judge; (None, None) otherwise."""
        if per_token is None or rows is None or per_token.numel() < self.min_positions:
            return None, None
        if rows.shape[0] != per_token.numel():
            return None, None  # not the same positions: nothing to pair
        return per_token, rows

    def _top1_ids(self, scores: TeacherScores, run: RunSpec) -> torch.Tensor | None:
        """The ids the teacher ranks first; None where the vocabulary test does not apply."""
        ids = scores.kept(scores.topk_ids)
        if ids is None or run.student_vocab_size is None or ids.numel() == 0:
            return None
        return ids.reshape(ids.shape[0], -1)[:, 0]

    def _vocabulary(
        self, top1: torch.Tensor | None, run: RunSpec, got: dict[str, float], step: int
    ) -> list[Finding]:
        if top1 is None:
            return []
        v, foreign, largest = run.student_vocab_size, int(got["foreign"]), int(got["max_top1_id"])
        frac = foreign / top1.numel()
        if frac <= self.max_foreign_top1_fraction:
            return []
        return [
            Finding(
                Code.TEACHER_VOCAB_MISMATCH,
                Severity.CRITICAL,
                f"{frac:.1%} of the teacher's first choices ({foreign} of {top1.numel()}) are "
                f"ids at or beyond the student's vocabulary of {v} (largest {largest}; "
                f"bound {self.max_foreign_top1_fraction:.0%}): teacher and student do not share "
                "a vocabulary, so the teacher's distribution is not over the student's tokens. "
                "Use a teacher with the student's tokenizer, or map and truncate the teacher's "
                "vocabulary to the student's before the loss.",
                step,
                {
                    "foreign_top1_fraction": frac,
                    "student_vocab_size": v,
                    "max_top1_id": largest,
                    "bound": self.max_foreign_top1_fraction,
                },
            )
        ]

    def _gaps(self, scores: TeacherScores) -> _Gaps | None:
        """The tokens test's tensors; None where it does not apply."""
        if not scores.topk_own:  # no row holds the teacher's own first choice
            return None
        tok, _ = self._paired(scores.kept(scores.token_logprobs), scores.kept(scores.topk_logprobs))
        if tok is None:
            return None
        return _Gaps(tok.reshape(-1).float(), scores.top1.float())

    def _tokens_parts(self, gaps: _Gaps | None) -> dict[str, torch.Tensor]:
        """The gaps' sum (finite iff every gap is) and how many are at or above the bound."""
        if gaps is None:
            return {}
        if signals.fusable_float32(gaps.top1, gaps.tok):  # one launch where PyTorch takes five
            from distill_guard.kernels.teacher_stats import triton_gap_parts

            both = triton_gap_parts(gaps.top1, gaps.tok, self.max_median_gap)
            return {"gap_sum": both[0], "far": both[1]}
        far = gaps.far(self.max_median_gap).sum(dtype=torch.float64)
        return {"gap_sum": gaps.gap.sum(dtype=torch.float64), "far": far}

    def _tokens(self, gaps: _Gaps | None, got: dict[str, float], step: int) -> list[Finding]:
        if gaps is None:
            return []
        n, far, finite = gaps.tok.numel(), got["far"], None
        if not math.isfinite(got["gap_sum"]):  # some are not: judge the finite ones (a sync)
            finite = torch.isfinite(gaps.tok) & torch.isfinite(gaps.top1)
            far_finite = finite & gaps.far(self.max_median_gap)
            counts = to_host({"n": finite.sum(dtype=torch.float64), "far": far_finite.sum()})
            n, far = int(counts["n"]), counts["far"]
        # the lower median of n values is at or above the bound iff n - (n-1)//2 of them are
        if n < self.min_positions or far < n - (n - 1) // 2:
            return []
        gap = gaps.gap if finite is None else gaps.gap[finite]
        median = float(gap.median())
        if median < self.max_median_gap:
            return []
        return [
            Finding(
                Code.TEACHER_TOKENS_MISMATCH,
                Severity.CRITICAL,
                f"The teacher gives the student's sampled tokens a median {median:.2f} nats less "
                f"than its own first choice, over {gap.numel()} positions (bound "
                f"{self.max_median_gap:g}): it is not reading the text the student wrote. A "
                "teacher scored on ids from another tokenizer or chat template does this. Score "
                "the teacher on text re-tokenized with its own tokenizer and template (or use a "
                "teacher with the student's), and compare a decoded sample from both sides.",
                step,
                {"median_gap": median, "positions": gap.numel(), "bound": self.max_median_gap},
            )
        ]

    def _lagged(self, scores: TeacherScores) -> _Lagged | None:
        """The position test's tensors; None where it does not apply."""
        tokens, ids = self._paired(scores.kept(scores.token_ids), scores.kept(scores.topk_ids))
        if tokens is None:
            return None
        ids = ids.reshape(tokens.numel(), -1)
        tokens = tokens.reshape(-1).to(ids.device)
        sample = scores.kept(scores.sample_index)
        same = (
            sample.reshape(-1)[1:] == sample.reshape(-1)[:-1]
            if sample is not None
            else torch.ones(tokens.numel() - 1, dtype=torch.bool, device=ids.device)
        )
        first = ids[:, 0]
        # row t holding the teacher's view of token t-1 (lag +1) or of token t+1 (lag -1)
        return _Lagged(first == tokens, first[1:] == tokens[:-1], first[:-1] == tokens[1:], same)

    def _positions(self, lagged: _Lagged | None, got: dict[str, float], step: int) -> list[Finding]:
        if lagged is None or got["pairs"] < self.min_positions:
            return []
        own = got["own"]
        hits, pairs = max(got["behind"], got["ahead"]), got["pairs"]
        # the float32 means below are hits / pairs to ~1e-7: only a near call needs them
        if pairs and hits / pairs < own + self.shift_margin - 1e-3:
            return []
        lags = {
            "+1": float(lagged.behind[lagged.same].float().mean()),
            "-1": float(lagged.ahead[lagged.same].float().mean()),
        }
        lag, best = max(lags.items(), key=lambda kv: kv[1])
        if best < own + self.shift_margin:
            return []
        return [
            Finding(
                Code.TEACHER_POSITION_SHIFT,
                Severity.CRITICAL,
                f"The teacher's first choice is the sampled token of the position {lag} away at "
                f"{best:.0%} of positions but its own position's token at only {own:.0%} "
                f"(bound: {self.shift_margin:.0%} more): the teacher's logprobs are shifted by "
                "one position against the student's tokens (written at response positions "
                "instead of prediction positions, or an extra logit shift). Align row t of the "
                "teacher with the prediction of token t; responses of one token lose all signal "
                "this way.",
                step,
                {"own_agreement": own, "shifted_agreement": best, "lag": lag},
            )
        ]


@dataclass
class _Gaps:
    """The sampled tokens' logprobs and the teacher's top-1 per position, and their gaps."""

    tok: torch.Tensor
    top1: torch.Tensor

    @cached_property
    def gap(self) -> torch.Tensor:
        """Teacher top-1 minus the sampled token's logprob per position (formed only where it
        is read: the fused path counts without it)."""
        return self.top1 - self.tok

    def far(self, bound: float) -> torch.Tensor:
        """Where the gap is at or above ``bound``, compared in float64 as the host would."""
        return self.gap.double() >= bound


class _Lagged(NamedTuple):
    """Where the teacher's first choice is the sampled token of its own position, of the one
    before (``behind``) and of the one after (``ahead``); ``same``: neighbours of one sample."""

    own: torch.Tensor
    behind: torch.Tensor
    ahead: torch.Tensor
    same: torch.Tensor


def _vocabulary_parts(top1: torch.Tensor | None, run: RunSpec) -> dict[str, torch.Tensor]:
    """First choices beyond the student's vocabulary, and the largest one."""
    if top1 is None:
        return {}
    foreign = (top1 >= run.student_vocab_size).sum(dtype=torch.float64)
    return {"foreign": foreign, "max_top1_id": top1.max()}


def _positions_parts(lagged: _Lagged | None) -> dict[str, torch.Tensor]:
    """The own agreement (as the finding states it) and the neighbours' hit counts."""
    if lagged is None:
        return {}
    return {
        "own": lagged.own.float().mean(),
        "pairs": lagged.same.sum(dtype=torch.float64),
        "behind": (lagged.behind & lagged.same).sum(dtype=torch.float64),
        "ahead": (lagged.ahead & lagged.same).sum(dtype=torch.float64),
    }
