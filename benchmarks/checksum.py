"""The exact weights checksum against the canary, side by side on the reference server (CPU).

For each model shape one reference server (emulating SGLang 0.5.23) runs on 127.0.0.1; over real
HTTP it times, interleaved, the two checks the guard makes after a wake: the canary (one
``/generate`` scoring call, ``--length`` tokens, top-``--top-k``) and the checksum
(``/weights_checker {"action": "checksum"}``: a hash of every parameter, no forward pass).
Medians over ``--repeats``; the ratio is checksum / canary.

Run: ``python benchmarks/checksum.py [--repeats 9] [--threads 1]``.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from distill_guard.live.canary import Canary
from distill_guard.teachers import SGLangHTTPTeacher
from distill_guard.testing.servers import reference_teacher
from distill_guard.testing.tiny import QWEN3_VOCAB, build_tiny_qwen3

SHAPES = {
    # name: (vocab, hidden, layers, heads, kv_heads, head_dim, intermediate)
    "tiny V=512": (512, 32, 2, 2, 1, 16, 64),
    "tiny V=151936": (QWEN3_VOCAB, 32, 2, 2, 1, 16, 64),
    "small V=151936": (QWEN3_VOCAB, 256, 4, 4, 2, 64, 768),
}


def bench(model_dir: Path, repeats: int, length: int, top_k: int) -> dict[str, float]:
    canary = Canary(length=length, top_k=top_k)
    times: dict[str, list[float]] = {"canary": [], "checksum": []}
    with (
        reference_teacher(model_dir, enable_cpu_backup=True) as (url, _),
        SGLangHTTPTeacher(url) as t,
    ):
        canary.fingerprint(t)
        assert t.checksum()  # warm-up, and the version has it
        for _ in range(repeats):
            t0 = time.perf_counter()
            canary.measure(t)
            times["canary"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            t.checksum()
            times["checksum"].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--length", type=int, default=64)
    ap.add_argument("--top-k", type=int, default=16)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{args.threads} thread(s), medians of {args.repeats}")  # fmt: skip
    print(f"{'shape':<16} {'params MB':>9} {'canary ms':>10} {'checksum ms':>12} {'ratio':>6}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, (v, h, n, a, kv, hd, inter) in SHAPES.items():
            d = build_tiny_qwen3(
                Path(tmp) / name.replace(" ", "_"), vocab_size=v, hidden_size=h, num_layers=n,
                num_heads=a, num_kv_heads=kv, head_dim=hd, intermediate_size=inter,
            )  # fmt: skip
            mb = sum(f.stat().st_size for f in d.glob("*.safetensors")) / 2**20
            r = bench(d, args.repeats, args.length, args.top_k)
            print(f"{name:<16} {mb:>9.1f} {r['canary'] * 1e3:>10.1f} {r['checksum'] * 1e3:>12.1f} "
                  f"{r['checksum'] / r['canary']:>6.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
