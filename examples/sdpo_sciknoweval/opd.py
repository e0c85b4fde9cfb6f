"""The pieces of one on-policy distillation step, whoever supplies the teacher's log-probs.

Sampling, the student's logits at response positions, the tail-mode generalized JSD that Relax's
SDPO recipe trains on (``--opd-kl-type jsd --opd-norm-mode tail``), the student statistics a
guard watches (entropy, EOS probability, truncation), and greedy evaluation.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from transformers import PreTrainedModel

from distill_guard.losses import distill_loss
from distill_guard.signals import entropy_from_logits
from examples.sdpo_sciknoweval.data import MCQItem, score
from examples.sdpo_sciknoweval.tokenizer import WordTokenizer

_TAIL_EPS = 1e-6  # the top-k mass is clamped to 1 - eps so log(1 - sum p) stays finite


class Rollout(NamedTuple):
    """Sampled responses (EOS included when emitted, no padding) and which hit the length limit."""

    responses: list[list[int]]
    truncated: list[bool]

    @property
    def truncated_ratio(self) -> float:
        return sum(self.truncated) / max(len(self.truncated), 1)


@torch.no_grad()
def sample_responses(
    student: PreTrainedModel,
    prompts_ids: list[list[int]],
    max_new_tokens: int,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
) -> Rollout:
    """Batched sampling with a KV cache; ``temperature=0`` decodes greedily.

    Prompts are left-padded with explicit position ids, so each row sees exactly its own prompt.
    A row stops at the model's EOS id; a row that reaches ``max_new_tokens`` without it is
    truncated.
    """
    eos_id, pad_id = student.config.eos_token_id, student.config.pad_token_id
    width = max(len(p) for p in prompts_ids)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts_ids])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts_ids])
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    out = student(
        input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1
    )
    done = torch.zeros(len(prompts_ids), dtype=torch.bool)
    steps = []
    for _ in range(max_new_tokens):
        logits = out.logits[:, -1].float()
        if temperature > 0:
            probs = torch.softmax(logits / temperature, dim=-1)
            token = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        else:
            token = logits.argmax(-1)
        token = torch.where(done, pad_id, token)
        steps.append(token)
        done |= token == eos_id
        if done.all():
            break
        mask = torch.cat([mask, torch.ones(len(mask), 1, dtype=mask.dtype)], dim=1)
        positions = positions[:, -1:] + 1
        out = student(
            input_ids=token[:, None],
            attention_mask=mask,
            position_ids=positions,
            cache=out.cache,
            use_cache=True,
        )
    responses = []
    for row in torch.stack(steps, dim=1).tolist():
        end = row.index(eos_id) + 1 if eos_id in row else len(row)
        responses.append(row[:end])
    truncated = [r[-1] != eos_id for r in responses]
    return Rollout(responses, truncated)


def response_logits(
    model: PreTrainedModel, prompts_ids: list[list[int]], responses: list[list[int]]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits that predict each response token, as ``[B, T, V]`` float32, plus the ``[B, T]`` mask.

    Sequences are right-padded (causal attention never looks at the padding), and row ``b``'s
    token ``t`` is predicted at position ``len(prompt_b) - 1 + t``. Only those positions go
    through the output layer, the bulk of the compute at this size.
    """
    pad_id = model.config.pad_token_id
    seqs = [p + r for p, r in zip(prompts_ids, responses)]
    width = max(len(s) for s in seqs)
    ids = torch.tensor([s + [pad_id] * (width - len(s)) for s in seqs])
    hidden = model.get_decoder()(input_ids=ids).last_hidden_state
    t_max = max(len(r) for r in responses)
    steps = torch.arange(t_max)
    starts = torch.tensor([len(p) - 1 for p in prompts_ids])
    mask = steps[None, :] < torch.tensor([len(r) for r in responses])[:, None]
    index = (starts[:, None] + steps[None, :]).clamp(max=width - 1)
    gathered = hidden.gather(1, index[..., None].expand(-1, -1, hidden.shape[-1]))
    return model.get_output_embeddings()(gathered).float(), mask


def _masked_mean(values: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if mask is None:
        return values.mean()
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def _with_tail(topk_logprobs: torch.Tensor) -> torch.Tensor:
    """Append the tail bin log(1 - sum p) to ``[N, K]`` log-probs, giving ``[N, K + 1]``."""
    mass = topk_logprobs.exp().sum(-1, keepdim=True).clamp(max=1.0 - _TAIL_EPS)
    return torch.cat([topk_logprobs, torch.log1p(-mass)], dim=-1)


def jsd_topk_tail_loss(
    student_logits: torch.Tensor,
    teacher_topk_ids: torch.Tensor,
    teacher_topk_logprobs: torch.Tensor,
    beta: float = 0.5,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized JSD over K selected tokens plus one tail bin, per token and masked mean.

    ``student_logits`` is ``[N, V]`` at the response positions; ``teacher_topk_ids`` and
    ``teacher_topk_logprobs`` are ``[N, K]`` (the ids can be the teacher's or the student's
    top-k: the loss only needs the teacher's log-probs at them). With s, t the two K+1-bin
    distributions and m = (1-beta)*s + beta*t, JSD = (1-beta)*KL(s||m) + beta*KL(t||m), which lies
    in [0, H(beta)] (ln 2 at beta=0.5). The divergence of the two bin distributions goes through
    the package's fused loss (:func:`distill_guard.losses.distill_loss`, which takes any
    distributions as logits); the per-token value is 0 where ``mask`` is False.
    """
    if not 0.0 < beta < 1.0:
        raise ValueError(f"beta must lie in (0, 1), got {beta}")
    student_logp = torch.log_softmax(student_logits.float(), dim=-1)
    s = _with_tail(student_logp.gather(-1, teacher_topk_ids.long()))
    t = _with_tail(teacher_topk_logprobs.float().to(s.device))
    out = distill_loss(s, t, beta=beta, mask=mask)
    return out.per_token, out.loss


def student_stats(logits: torch.Tensor, mask: torch.Tensor, rollout: Rollout, eos_id: int) -> dict:
    """Entropy (masked mean over response tokens), EOS probability and truncation of a batch.

    ``eos_prob`` is the mean over responses of the largest probability the student gave EOS at
    any of its response positions: it falls toward 0 when the student stops wanting to stop.
    """
    with torch.no_grad():
        entropy = _masked_mean(entropy_from_logits(logits), mask)
        lse = torch.logsumexp(logits.float(), dim=-1)
        p_eos = (logits[..., eos_id].float() - lse).exp().masked_fill(~mask, 0.0)
    return {
        "student_entropy": entropy.item(),
        "eos_prob": p_eos.max(dim=1).values.mean().item(),
        "truncated_ratio": rollout.truncated_ratio,
    }


def prompt_ids(items: list[MCQItem], tokenizer: WordTokenizer) -> list[list[int]]:
    """BOS + the encoded prompt of each item; the response follows with no separator."""
    return [tokenizer.encode(item.prompt, add_bos=True) for item in items]


def evaluate(
    student: PreTrainedModel,
    eval_items: list[MCQItem],
    tokenizer: WordTokenizer,
    max_new_tokens: int = 8,
    batch_size: int = 64,
) -> float:
    """Mean ``score`` of greedy responses: the miniature's ``eval/sciknoweval-biology``."""
    total = 0.0
    for start in range(0, len(eval_items), batch_size):
        batch = eval_items[start : start + batch_size]
        rollout = sample_responses(
            student, prompt_ids(batch, tokenizer), max_new_tokens, temperature=0.0
        )
        total += sum(
            score(tokenizer.decode(r), item.answer) for r, item in zip(rollout.responses, batch)
        )
    return total / max(len(eval_items), 1)
