"""The in-process canary's cost against the teacher forward a GKD step already pays for.

A Qwen2-0.5B-shaped teacher (random bf16 weights on CUDA, no download; ``--tiny``: a small one in
fp32 for a CPU smoke run) and ``ModuleCanary`` as the guard runs it before each update:
- (a) the teacher's forward on batch x sequence tokens (8 x 512), what GKD pays for the teacher;
- (b) the canary check as before: ``module_every_steps=1``, one canary forward (64 tokens,
  top-16) and its judgement at every check;
- (c) the weights fingerprint alone (``take_fingerprint``);
- (d) the canary check now, on an unchanged teacher with ``module_every_steps`` (16), amortised
  per step over ``--steps`` (64) steps: the fingerprint at every check, the forward every 16.
Each is the median of ``--repeat`` runs after warm-up, the device synchronised around each.
Prints (b)/(a), (c)/(a), (d)/(a); writes $OUT/canary_cost.json when $OUT is set.

Run: python3 benchmarks/canary_cost.py [--device cuda] [--tiny --device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable

import torch

from distill_guard.checks.canary import CanaryCheck
from distill_guard.live.module_canary import ModuleCanary
from distill_guard.live.weights_fingerprint import take_fingerprint

QWEN2_0_5B = dict(
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151936,
    tie_word_embeddings=True,
)
TINY = dict(
    hidden_size=64,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=1024,
    tie_word_embeddings=True,
)


def build(shape: dict, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """A Qwen2 causal LM of ``shape`` with random weights drawn on ``device``: matrices
    N(0, 0.02), norms 1 (a peaked distribution, not a uniform one)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    try:  # transformers 5.x
        from transformers.initialization import no_init_weights
    except ImportError:  # 4.x
        from transformers.modeling_utils import no_init_weights

    with no_init_weights():  # no CPU init of half a billion weights: drawn on the device
        model = Qwen2ForCausalLM(Qwen2Config(**shape)).to(device=device, dtype=dtype)
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=gen)
    return model.eval()


def timed(fn: Callable[[], object], device: torch.device, repeat: int, warmup: int) -> float:
    """Median seconds of ``fn`` over ``repeat`` calls after ``warmup``, synchronised."""

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    out = []
    for i in range(warmup + repeat):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        if i >= warmup:
            out.append(time.perf_counter() - t)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="a small Qwen2 (CPU smoke run)")
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default=None)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--every", type=int, default=CanaryCheck().module_every_steps)
    ap.add_argument("--steps", type=int, default=64, help="steps (d) is amortised over")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    shape = TINY if args.tiny else QWEN2_0_5B
    model = build(shape, device, dtype)
    n_params = sum(p.numel() for p in model.parameters())
    n_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    gen = torch.Generator(device=device).manual_seed(1)
    ids = torch.randint(
        0, shape["vocab_size"], (args.batch, args.seq), device=device, generator=gen
    )
    mask = torch.ones_like(ids)

    def teacher_forward() -> None:
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask).logits  # noqa: B018 - the forward is the work

    before = ModuleCanary(model, CanaryCheck(module_every_steps=1))
    now = ModuleCanary(model, CanaryCheck(module_every_steps=args.every))
    step = iter(range(10**9))
    a = timed(teacher_forward, device, args.repeat, args.warmup)
    b = timed(lambda: before.check(next(step)), device, args.repeat, args.warmup)
    c = timed(lambda: take_fingerprint(model), device, args.repeat, args.warmup)
    findings: list = []

    def steps_now() -> None:
        for _ in range(args.steps):
            findings.extend(now.check(next(step)))

    steps_now()  # warm-up: the first forward, the clean reference
    forwards0, skipped0 = now.forwards, now.checked_by_fingerprint
    d = timed(steps_now, device, args.repeat, 0) / args.steps
    forwards = now.forwards - forwards0
    skipped = now.checked_by_fingerprint - skipped0
    res = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "shape": "tiny" if args.tiny else "qwen2-0.5b",
        "config": shape,
        "dtype": str(dtype).removeprefix("torch."),
        "params": n_params,
        "weights_GB": n_bytes / 1e9,
        "parameter_tensors": len(list(model.parameters())),
        "batch": args.batch,
        "seq": args.seq,
        "canary_tokens": len(now.canary.canary_tokens()),
        "module_every_steps": args.every,
        "steps": args.steps,
        "a_teacher_forward_ms": a * 1e3,
        "b_canary_check_every_step_ms": b * 1e3,
        "c_fingerprint_ms": c * 1e3,
        "d_canary_check_now_per_step_ms": d * 1e3,
        "b_over_a": b / a,
        "c_over_a": c / a,
        "d_over_a": d / a,
        "d_forwards": forwards,
        "d_checked_by_fingerprint": skipped,
        "fingerprint_stable": forwards <= args.repeat * -(-args.steps // args.every),
        "findings": len(findings) + len(before.check(next(step))),
    }
    print(
        f"{res['shape']} teacher on {res['device']} ({n_params / 1e6:.1f} M parameters, "
        f"{res['parameter_tensors']} tensors, {res['dtype']}, {n_bytes / 1e9:.2f} GB)\n"
        f"(a) teacher forward {args.batch} x {args.seq}: {a * 1e3:.2f} ms\n"
        f"(b) canary check as before (a {res['canary_tokens']}-token forward every step): "
        f"{b * 1e3:.2f} ms = {b / a:.1%} of (a)\n"
        f"(c) weights fingerprint: {c * 1e3:.3f} ms = {c / a:.1%} of (a)\n"
        f"(d) canary check now (fingerprint every step, forward every {args.every}), per step "
        f"over {args.steps}: {d * 1e3:.3f} ms = {d / a:.1%} of (a) "
        f"[{forwards} forwards, {skipped} checks by fingerprint over {args.repeat} runs]"
    )
    if not res["fingerprint_stable"]:
        print("WARNING: the fingerprint changed on an unchanged teacher (not reproducible here)")
    if res["findings"]:
        print(f"WARNING: {res['findings']} findings on a healthy teacher")
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "canary_cost.json"), "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
