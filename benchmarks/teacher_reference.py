"""The teacher's reference from its checkpoint: what it costs to make, and how far a healthy
serving forward sits from it (the tolerance) against how far a wrong teacher does (the margin).

The reference is the canary scored by the checkpoint in fp32 on CPU
(:func:`distill_guard.live.teacher_reference.reference_from_checkpoint`). The serving side here is
the same checkpoint loaded in bf16 (and fp16) with ``transformers``' kernels on the GPU when there
is one: a stand-in for SGLang's kernels, not them (SGLang cannot run on this project's machines).
Wrong teachers: every weight replaced by noise at its own scale (garbage), the distribution at
temperature 2, another checkpoint (another seed), and a copy of the student (the teacher's
weights plus 2 % noise).

The model is a random Qwen3 of the chosen size whose head spreads the logits like a trained LM's
(``--logit-std``); no download.

Run: ``python benchmarks/teacher_reference.py [--size small|1b|4b]``
"""

from __future__ import annotations

import argparse
import copy
import tempfile
import time

import torch

from distill_guard.checks.canary import CanaryCheck, _deltas
from distill_guard.live.teacher_reference import (
    reference_from_checkpoint,
    score_canary,
    tolerance_for,
)

SIZES = {
    "small": dict(vocab_size=4096, hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2,
                  head_dim=64, intermediate_size=768),
    "1b": dict(vocab_size=151936, hidden_size=2048, num_layers=16, num_heads=16, num_kv_heads=8,
               head_dim=128, intermediate_size=6144),
    "4b": dict(vocab_size=151936, hidden_size=2560, num_layers=36, num_heads=32, num_kv_heads=8,
               head_dim=128, intermediate_size=9728),
}  # fmt: skip


def random_qwen3(cfg: dict, logit_std: float, seed: int) -> torch.nn.Module:
    """A random Qwen3 with an untied head drawn so the logits spread like a trained LM's (a tied
    random head predicts the input token with probability about 1)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_hidden_layers=cfg["num_layers"],
        num_attention_heads=cfg["num_heads"],
        num_key_value_heads=cfg["num_kv_heads"],
        head_dim=cfg["head_dim"],
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, logit_std / cfg["hidden_size"] ** 0.5)
    return model


def garble(model: torch.nn.Module, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            x = p.detach().float()
            noise = torch.randn(p.shape, generator=g) * float(x.std()) + float(x.mean())
            p.copy_(noise.to(p.dtype))


def student_copy(model: torch.nn.Module, noise: float = 0.02, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_((torch.randn(p.shape, generator=g) * noise).to(p.dtype))


def at_temperature(model: torch.nn.Module, t: float = 2.0) -> None:
    with torch.no_grad():
        model.model.norm.weight.div_(t)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", choices=list(SIZES), default="small")
    ap.add_argument(
        "--logit-std",
        type=float,
        default=3.0,
        help="spread of the logits over the vocabulary (a trained LM's is about 2-4); the "
        "embeddings are drawn at this / sqrt(hidden)",
    )
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    cfg = SIZES[args.size]
    check = CanaryCheck(vocab_size=cfg["vocab_size"])
    print(f"size {args.size}: {cfg}; serving device {device}")
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        model = random_qwen3(cfg, args.logit_std, seed=0)
        n = sum(p.numel() for p in model.parameters())
        model.save_pretrained(tmp)
        other = random_qwen3(cfg, args.logit_std, seed=7)
        print(f"params {n / 1e6:.0f} M; built and saved in {time.perf_counter() - t0:.1f} s")
        ref = reference_from_checkpoint(tmp, check)  # fp32, CPU: the reference
        top1 = sum(r[0] for r in ref.topk_logprobs) / len(ref.topk_logprobs)
        print(
            f"reference: {ref.seconds:.2f} s (load + one 64-token forward, fp32 CPU, "
            f"{torch.get_num_threads()} threads); mean top-1 logprob {top1:.2f}"
        )
        rows = []
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            served = copy.deepcopy(model).to(device=device, dtype=dtype)
            t0 = time.perf_counter()
            m = score_canary(served, ref.tokens, check.top_k)
            if cuda:
                torch.cuda.synchronize()
            rows.append((f"healthy, {str(dtype)[6:]} {device}", *_deltas(m, ref.measurement())))
            del served
        wrongs = {
            "garbage": garble,
            "temperature 2": at_temperature,
            "student copy (2 % noise)": student_copy,
        }
        for name, poison in wrongs.items():
            served = copy.deepcopy(model)
            poison(served)
            served = served.to(device=device, dtype=torch.bfloat16)
            rows.append(
                (
                    f"{name}, bf16 {device}",
                    *_deltas(score_canary(served, ref.tokens, check.top_k), ref.measurement()),
                )
            )
            del served
        served = other.to(device=device, dtype=torch.bfloat16)
        rows.append((f"another checkpoint, bf16 {device}", *_deltas(score_canary(served, ref.tokens, check.top_k), ref.measurement())))  # fmt: skip
    print(
        "\n| serving teacher | mean abs delta (nats) | max abs delta | tolerance (mean, max) "
        "| mean / tolerance |\n|---|---|---|---|---|"
    )
    for name, mean_d, max_d in rows:
        dtype = name.split(", ")[-1].split()[0]
        tol = tolerance_for(dtype)
        print(f"| {name} | {mean_d:.4f} | {max_d:.4f} | {tol} | {mean_d / tol[0]:.2f} |")


if __name__ == "__main__":
    main()
