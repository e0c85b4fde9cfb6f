"""One arm of the miniature SDPO run: N on-policy distillation steps, no guard.

Each step samples responses from the student, has the teacher score prompt + response, and
updates the student with the tail-mode JSD (beta=0.5, 16 tokens + tail), as the SciKnowEval
recipe does. ``wake`` runs before every scoring, where a colocated trainer wakes its teacher;
``--corrupt`` makes that wake zero the teacher's parameters and buffers, which is what a wake
without CPU backup does, so the teacher turns uniform and the student collapses.

Run: ``python -m examples.sdpo_sciknoweval.run_arm --out outputs/sdpo_mini [--corrupt]``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import transformers
from transformers import PreTrainedModel

from examples.sdpo_sciknoweval import data
from examples.sdpo_sciknoweval.data import MCQItem, build_dataset
from examples.sdpo_sciknoweval.opd import (
    evaluate,
    jsd_topk_tail_loss,
    prompt_ids,
    response_logits,
    sample_responses,
    student_stats,
)
from examples.sdpo_sciknoweval.pretrain import PretrainConfig, load_pretrained
from examples.sdpo_sciknoweval.tokenizer import WordTokenizer, build_tokenizer

Scorer = Callable[[list[list[int]], int, int | list[int]], tuple[list[torch.Tensor], ...]]
"""``score(sequences, top_k, logprob_start_len)`` → per sequence ``[n, top_k]`` top-k ids and
log-probs, optionally followed by ``[n]`` log-probs of the tokens there (``ScoreResult`` order:
``topk_ids, topk_logprobs[, token_logprobs]``). ``logprob_start_len`` is one for all sequences
or one per sequence (SGLang's is per request)."""
Check = Callable[..., bool]
"""``check(step, teacher_top16_logprobs [N, k], teacher_token_logprobs [N] or None, *,
topk_ids [N, k], token_ids [N], sample_index [N])`` after scoring and before the update, over the
response positions in sequence order within each sample: False drops this batch's update (a
guard's skip_batch / rewake)."""


@dataclass(frozen=True)
class ArmConfig:
    """One arm: AdamW with a linear warm-up, then a constant learning rate.

    ``token_selection`` picks the K ids the JSD runs over. ``student_topk`` is the recipe's
    (``--opd-token-selection student_topk``): the teacher is asked for its whole distribution
    and read at the student's top-k, and a uniform teacher puts the loss at ln 2 - O(K/V).
    ``teacher_topk`` uses the teacher's own top-k; a uniform teacher's top-k ids are arbitrary
    tie-breaks, so there the step-0 loss stays far below ln 2 (measured 0.16) although the
    student still collapses.
    """

    steps: int = 60
    batch_size: int = 64
    lr: float = 3e-3
    warmup_steps: int = 5
    max_new_tokens: int = 8
    temperature: float = 1.0
    top_k: int = 16
    beta: float = 0.5
    token_selection: str = "student_topk"
    eval_every: int = 5
    seed: int = 0
    threads: int = 2
    """torch's intra-op threads while the arm runs (the demo is sized for 2 cores)."""

    def __post_init__(self):
        if self.token_selection not in ("student_topk", "teacher_topk"):
            raise ValueError(f"unknown token_selection {self.token_selection!r}")


class HFTeacherScorer:
    """Scores token sequences with a local HF causal LM, like SGLang ``/generate`` with
    ``max_new_tokens=0``, ``return_logprob`` and ``top_logprobs_num=top_k``.

    For each sequence it returns ``[n, top_k]`` ids and log-probs, sorted by log-prob, for the
    tokens at positions ``logprob_start_len + 1 .. len - 1`` (SGLang's entry 0, always null, is
    left out), so ``logprob_start_len = prompt_len - 1`` gives one row per response token. The
    start is one for every sequence or one per sequence.
    """

    def __init__(self, model: PreTrainedModel):
        self.model = model

    @torch.no_grad()
    def __call__(
        self, seqs: list[list[int]], top_k: int, logprob_start_len: int | list[int]
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        pad_id = self.model.config.pad_token_id
        width = max(len(s) for s in seqs)
        ids = torch.tensor([s + [pad_id] * (width - len(s)) for s in seqs])
        hidden = self.model.get_decoder()(input_ids=ids).last_hidden_state
        head = self.model.get_output_embeddings()
        starts = (
            [logprob_start_len] * len(seqs)
            if isinstance(logprob_start_len, int)
            else logprob_start_len
        )
        top_ids, top_lps = [], []
        for row, seq, start in zip(hidden, seqs, starts):
            logits = head(row[start : len(seq) - 1]).float()
            values, indices = torch.log_softmax(logits, dim=-1).topk(top_k, dim=-1)
            top_ids.append(indices)
            top_lps.append(values)
        return top_ids, top_lps


def zero_weights(model: PreTrainedModel) -> None:
    """Zero every parameter and buffer in place (RoPE's non-persistent ``inv_freq`` included):
    the state a teacher wakes in when its memory was released without a CPU backup."""
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            tensor.zero_()


def _teacher_rows(
    score: Scorer, prompts: list[list[int]], responses: list[list[int]], top_k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Teacher ids and log-probs for every response token, padded to ``[B, T, top_k]``, and the
    ``[B, T]`` log-probs of the tokens there when the scorer gives them (else None).

    Each sequence is scored from its prompt's last token on (``logprob_start_len`` per sequence,
    as SGLang takes it per request), so only the response positions are scored; each row keeps
    its last ``len(response)`` entries, so the scorer may or may not include SGLang's null
    entry 0.
    """
    seqs = [p + r for p, r in zip(prompts, responses)]
    ids, lps, *rest = score(seqs, top_k, [len(p) - 1 for p in prompts])
    t_max = max(len(r) for r in responses)
    out_ids = torch.zeros(len(seqs), t_max, top_k, dtype=torch.long)
    out_lps = torch.zeros(len(seqs), t_max, top_k)
    out_tok = torch.zeros(len(seqs), t_max) if rest and rest[0] is not None else None
    for b, r in enumerate(responses):
        out_ids[b, : len(r)] = ids[b][-len(r) :]
        out_lps[b, : len(r)] = lps[b][-len(r) :].float()
        if out_tok is not None:
            out_tok[b, : len(r)] = rest[0][b][-len(r) :].float()
    return out_ids, out_lps, out_tok


def opd_step(
    student: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    items: list[MCQItem],
    tokenizer: WordTokenizer,
    score: Scorer,
    cfg: ArmConfig,
    generator: torch.Generator,
    check: Check | None = None,
    step: int = 0,
) -> dict:
    """Sample, score, ask ``check``, take one optimizer step; return the step's metrics
    (pre-update) with ``trained`` saying whether the update was applied."""
    prompts = prompt_ids(items, tokenizer)
    rollout = sample_responses(student, prompts, cfg.max_new_tokens, cfg.temperature, generator)
    full = cfg.token_selection == "student_topk"
    k_request = student.config.vocab_size if full else cfg.top_k
    t_ids, t_lps, t_tok = _teacher_rows(score, prompts, rollout.responses, k_request)
    logits, mask = response_logits(student, prompts, rollout.responses)
    sampled = torch.tensor([r + [0] * (mask.shape[1] - len(r)) for r in rollout.responses])
    if full:
        dense = torch.zeros_like(t_lps).scatter_(-1, t_ids, t_lps)
        ids = logits.detach().topk(cfg.top_k, dim=-1).indices
        # The teacher's own token log-probs when it gives them (SGLang's input_token_logprobs:
        # the same numbers on a healthy teacher, and what a fault between the two alters).
        token_lps = t_tok if t_tok is not None else dense.gather(-1, sampled[..., None]).squeeze(-1)
        lps = dense.gather(-1, ids)
        teacher_logprob = token_lps[mask].mean()
    else:
        ids, lps = t_ids, t_lps
        token_lps = None
        teacher_logprob = t_lps[..., 0][mask].mean()
    trained = True
    if check is not None:
        top = t_lps[..., : cfg.top_k][mask]
        sample = torch.arange(len(items))[:, None].expand_as(mask)
        trained = check(
            step,
            top,
            token_lps[mask] if token_lps is not None else None,
            topk_ids=t_ids[..., : cfg.top_k][mask],
            token_ids=sampled[mask],
            sample_index=sample[mask],
        )
    _, loss = jsd_topk_tail_loss(logits[mask], ids[mask], lps[mask], cfg.beta)
    optimizer.zero_grad()
    if trained:
        loss.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        optimizer.step()
    rewards = [
        data.score(tokenizer.decode(r), it.answer) for r, it in zip(rollout.responses, items)
    ]
    return {
        "loss": loss.item(),
        **student_stats(logits.detach(), mask, rollout, tokenizer.eos_id),
        "teacher_logprob": teacher_logprob.item(),
        "reward": sum(rewards) / len(rewards),
        "trained": trained,
    }


def run_arm(
    student: PreTrainedModel,
    tokenizer: WordTokenizer,
    train_items: list[MCQItem],
    eval_items: list[MCQItem],
    score: Scorer,
    cfg: ArmConfig,
    wake: Callable[[int], None] | None = None,
    on_step: Callable[[dict], None] | None = None,
    check: Check | None = None,
    sleep: Callable[[int], None] | None = None,
) -> list[dict]:
    """Train ``student`` in place for ``cfg.steps`` OPD steps; return one record per step.

    Record ``i`` holds step ``i``'s loss and rollout statistics; ``eval_accuracy`` (greedy, on
    ``eval_items``) is measured before steps ``0, eval_every, ...`` and once more after the last
    step, in a final record ``{"step": steps, ...}``. ``wake(step)`` runs before each scoring and
    ``sleep(step)`` after each update (where a colocated trainer wakes and sleeps its teacher);
    ``check`` may veto an update (see :data:`Check`); ``on_step`` sees each finished record.
    """
    torch.set_num_threads(cfg.threads)
    generator = torch.Generator().manual_seed(cfg.seed)
    optimizer = torch.optim.AdamW(student.parameters(), lr=cfg.lr, weight_decay=0.0)
    warmup = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / max(cfg.warmup_steps, 1))
    )
    records, start = [], time.perf_counter()
    for step in range(cfg.steps + 1):
        record: dict = {"step": step}
        if step % cfg.eval_every == 0 or step == cfg.steps:
            record["eval_accuracy"] = evaluate(student, eval_items, tokenizer, cfg.max_new_tokens)
        if step < cfg.steps:
            index = torch.randint(len(train_items), (cfg.batch_size,), generator=generator)
            if wake is not None:
                wake(step)
            batch = [train_items[i] for i in index]
            record |= opd_step(
                student, optimizer, batch, tokenizer, score, cfg, generator, check, step
            )
            warmup.step()
            if sleep is not None:
                sleep(step)
        record["seconds"] = round(time.perf_counter() - start, 2)
        records.append(record)
        if on_step is not None:
            on_step(record)
    return records


def main(argv: list[str] | None = None) -> list[dict]:
    """CLI: pretrain (cached), run one arm, write ``<out>/<arm>.jsonl``, print each step."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="outputs/sdpo_mini")
    parser.add_argument("--corrupt", action="store_true", help="zero the teacher at every wake")
    parser.add_argument("--steps", type=int, default=ArmConfig.steps)
    parser.add_argument("--lr", type=float, default=ArmConfig.lr)
    parser.add_argument("--batch-size", type=int, default=ArmConfig.batch_size)
    parser.add_argument(
        "--token-selection",
        default=ArmConfig.token_selection,
        choices=("student_topk", "teacher_topk"),
    )
    parser.add_argument("--seed", type=int, default=ArmConfig.seed)
    args = parser.parse_args(argv)
    transformers.utils.logging.disable_progress_bar()
    cfg = ArmConfig(
        steps=args.steps,
        lr=args.lr,
        batch_size=args.batch_size,
        token_selection=args.token_selection,
        seed=args.seed,
    )
    pretrain_cfg = PretrainConfig()
    teacher, student = load_pretrained(args.out, pretrain_cfg)
    tokenizer = build_tokenizer()
    train, eval_items = build_dataset(pretrain_cfg.data)
    wake = (lambda step: zero_weights(teacher)) if args.corrupt else None
    arm = "corrupt" if args.corrupt else "healthy"
    log_path = Path(args.out) / f"{arm}.jsonl"
    with log_path.open("w") as log:

        def emit(record: dict) -> None:
            log.write(json.dumps(record) + "\n")
            print(json.dumps(record), flush=True)

        records = run_arm(
            student, tokenizer, train, eval_items, HFTeacherScorer(teacher), cfg, wake, emit
        )
    print(json.dumps({"arm": arm, "config": asdict(cfg), "log": str(log_path)}))
    return records


if __name__ == "__main__":
    main()
