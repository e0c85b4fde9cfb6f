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

from dataclasses import dataclass
from typing import ClassVar

import torch

from distill_guard.checks.base import Check
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
        shifted = self._positions(scores)
        # a shift also makes the teacher disagree with every token: name the cause, not both
        return self._vocabulary(scores, run) + (shifted or self._tokens(scores))

    def _paired(
        self, per_token: torch.Tensor | None, rows: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Both views of the same positions, enough of them to judge; (None, None) otherwise."""
        if per_token is None or rows is None or per_token.numel() < self.min_positions:
            return None, None
        if rows.shape[0] != per_token.numel():
            return None, None  # not the same positions: nothing to pair
        return per_token, rows

    def _vocabulary(self, scores: TeacherScores, run: RunSpec) -> list[Finding]:
        ids = scores.kept(scores.topk_ids)
        v = run.student_vocab_size
        if ids is None or v is None or ids.numel() == 0:
            return []
        top1 = ids.reshape(ids.shape[0], -1)[:, 0]
        foreign = int((top1 >= v).sum())
        frac = foreign / top1.numel()
        if frac <= self.max_foreign_top1_fraction:
            return []
        return [
            Finding(
                Code.TEACHER_VOCAB_MISMATCH,
                Severity.CRITICAL,
                f"{frac:.1%} of the teacher's first choices ({foreign} of {top1.numel()}) are "
                f"ids at or beyond the student's vocabulary of {v} (largest {int(top1.max())}; "
                f"bound {self.max_foreign_top1_fraction:.0%}): teacher and student do not share "
                "a vocabulary, so the teacher's distribution is not over the student's tokens. "
                "Use a teacher with the student's tokenizer, or map and truncate the teacher's "
                "vocabulary to the student's before the loss.",
                scores.step,
                {
                    "foreign_top1_fraction": frac,
                    "student_vocab_size": v,
                    "max_top1_id": int(top1.max()),
                    "bound": self.max_foreign_top1_fraction,
                },
            )
        ]

    def _tokens(self, scores: TeacherScores) -> list[Finding]:
        if not scores.topk_own:  # no row holds the teacher's own first choice
            return []
        tok, top = self._paired(
            scores.kept(scores.token_logprobs), scores.kept(scores.topk_logprobs)
        )
        if tok is None:
            return []
        tok, top1 = tok.reshape(-1).float(), top.reshape(tok.numel(), -1).float().amax(dim=1)
        finite = torch.isfinite(tok) & torch.isfinite(top1)
        if int(finite.sum()) < self.min_positions:
            return []
        gap = (top1 - tok)[finite]
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
                scores.step,
                {"median_gap": median, "positions": gap.numel(), "bound": self.max_median_gap},
            )
        ]

    def _positions(self, scores: TeacherScores) -> list[Finding]:
        tokens, ids = self._paired(scores.kept(scores.token_ids), scores.kept(scores.topk_ids))
        if tokens is None:
            return []
        ids = ids.reshape(tokens.numel(), -1)
        tokens = tokens.reshape(-1).to(ids.device)
        sample = scores.kept(scores.sample_index)
        same = (
            sample.reshape(-1)[1:] == sample.reshape(-1)[:-1]
            if sample is not None
            else torch.ones(tokens.numel() - 1, dtype=torch.bool, device=ids.device)
        )
        first = ids[:, 0]
        own = (first == tokens).float().mean()
        # row t holding the teacher's view of token t-1 (lag +1) or of token t+1 (lag -1)
        behind = (first[1:] == tokens[:-1])[same].float()
        ahead = (first[:-1] == tokens[1:])[same].float()
        if behind.numel() < self.min_positions:
            return []
        lags = {"+1": float(behind.mean()), "-1": float(ahead.mean())}
        lag, best = max(lags.items(), key=lambda kv: kv[1])
        own = float(own)
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
                scores.step,
                {"own_agreement": own, "shifted_agreement": best, "lag": lag},
            )
        ]
