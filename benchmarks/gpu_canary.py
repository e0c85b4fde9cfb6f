"""GPU: the canary's cost against a pause+resume with CPU backup, for Qwen3-shaped models.

Shapes of Qwen3-0.6B and Qwen3-4B (random bf16 weights, V = 151936), each a ``TorchTeacher``
whose weights live in a real torch_memory_saver region with ``enable_cpu_backup=True``:
- wake = ``release()`` + ``resume()`` of the weights (median of 3, synchronised);
- canary = one scoring call of 64 tokens with top-16 (``Canary.measure``, median of 5).
Target: the canary costs under 5 % of the 4B model's wake. Writes $OUT/gpu_canary.json.

Run: python3 benchmarks/gpu_canary.py [--shapes 0.6b 4b]
"""

from __future__ import annotations

import argparse
import gc
import json
import os

import torch
from canary_cost import timed  # the same synchronised median as the canary's cost

from distill_guard.live.canary import Canary
from distill_guard.teachers import TorchTeacher

SHAPES = {
    "0.6b": dict(
        hidden_size=1024,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        intermediate_size=3072,
        head_dim=128,
    ),
    "4b": dict(
        hidden_size=2560,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        intermediate_size=9728,
        head_dim=128,
    ),
}


def build(shape: str) -> TorchTeacher:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    try:  # transformers 5.x
        from transformers.initialization import no_init_weights
    except ImportError:  # 4.x
        from transformers.modeling_utils import no_init_weights

    cfg = Qwen3Config(vocab_size=151936, tie_word_embeddings=shape == "0.6b", **SHAPES[shape])
    with no_init_weights():  # no CPU init of billions of weights: they are drawn on the GPU
        model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    teacher = TorchTeacher(model, device="cuda", enable_cpu_backup=True)
    assert teacher.uses_torch_memory_saver
    gen = torch.Generator(device="cuda").manual_seed(0)
    with torch.no_grad():
        for p in teacher.model.parameters():  # in place: stays inside the region
            p.normal_(0.0, 0.02, generator=gen)
    torch.cuda.synchronize()
    return teacher


def bench_shape(shape: str) -> dict:
    teacher = build(shape)
    n_bytes = sum(p.numel() * p.element_size() for p in teacher.model.parameters())
    canary = Canary(length=64, top_k=16)
    canary.fingerprint(teacher)  # warm-up: kernels, canary tokens

    def wake() -> None:
        teacher.release()
        teacher.resume()

    cuda = torch.device("cuda")
    first_wake = timed(wake, cuda, 1, 0)
    wake_s = timed(wake, cuda, 3, 0)
    canary_s = timed(lambda: canary.measure(teacher), cuda, 5, 0)
    assert canary.verify(teacher) == [], "the backed-up teacher must pass its canary"
    print(
        f"{shape}: {n_bytes / 1e9:.2f} GB of weights; pause+resume with CPU backup "
        f"{wake_s:.3f} s (first {first_wake:.3f} s); canary (64 tokens, top-16) "
        f"{canary_s * 1e3:.1f} ms = {canary_s / wake_s:.2%} of the wake (target < 5 % at 4b)"
    )
    return {
        "weights_GB": n_bytes / 1e9,
        "first_wake_s": first_wake,
        "wake_s": wake_s,
        "canary_ms": canary_s * 1e3,
        "canary_fraction_of_wake": canary_s / wake_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=["0.6b", "4b"], choices=list(SHAPES))
    args = ap.parse_args()
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    for shape in args.shapes:
        results[shape] = bench_shape(shape)
        gc.collect()
        torch.cuda.empty_cache()
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "gpu_canary.json"), "w") as fh:
            json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
