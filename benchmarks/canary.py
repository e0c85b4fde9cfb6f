"""What a canary costs next to a sleep/wake cycle of the reference server, measured side by side.

For each model shape one reference server runs on 127.0.0.1 (CPU); over real HTTP it times:

- the canary: one ``/generate`` scoring call (``--length`` tokens, top-``--top-k``);
- a sleep/wake cycle with the weights CPU backup (release + resume);
- a sleep/wake cycle without the backup, plus the reload that repairs it
  (release + resume + ``/update_weights_from_disk`` + ``/flush_cache``).

The canary is also timed in-process on the server's own TorchTeacher, to separate the forward
from HTTP and JSON. Medians over ``--repeats`` runs, interleaved so load on the machine hits all three alike.
Run: ``python benchmarks/canary.py [--repeats 9] [--threads 1]``.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
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


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench_shape(model_dir: Path, repeats: int, length: int, top_k: int) -> dict[str, float]:
    canary = Canary(length=length, top_k=top_k)
    out: dict[str, list[float]] = {
        "canary": [], "canary_in_process": [], "cycle_backup": [], "cycle_reload": []
    }  # fmt: skip
    with (
        reference_teacher(model_dir, enable_cpu_backup=True) as (url_b, tb),
        reference_teacher(model_dir) as (url_n, _),
        SGLangHTTPTeacher(url_b) as backed,
        SGLangHTTPTeacher(url_n) as bare,
    ):
        canary.fingerprint(backed)  # warm-up: first forward, connection set-up
        backed.release(), backed.resume()
        bare.release(), bare.resume(), bare.reload_weights(), bare.flush_cache()
        for _ in range(repeats):
            out["canary"].append(timed(lambda: canary.measure(backed)))
            out["canary_in_process"].append(timed(lambda: canary.measure(tb)))
            out["cycle_backup"].append(timed(lambda: (backed.release(), backed.resume())))
            out["cycle_reload"].append(
                timed(
                    lambda: (
                        bare.release(),
                        bare.resume(),
                        bare.reload_weights(),
                        bare.flush_cache(),
                    )
                )
            )
        assert canary.verify(backed) == [], "the backed-up teacher must pass its canary"
        params = sum(p.numel() for p in tb.model.parameters())
    res = {k: statistics.median(v) for k, v in out.items()}
    res["params_m"] = params / 1e6
    res["weights_mb"] = params * 4 / 1e6
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--length", type=int, default=64, help="canary tokens")
    ap.add_argument("--top-k", type=int, default=16)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"# canary vs sleep/wake, reference server on CPU ({platform.processor() or platform.machine()},"
        f" torch {torch.__version__}, {args.threads} thread(s)); medians of {args.repeats}; "
        f"canary = {args.length} tokens, top-{args.top_k}, over loopback HTTP\n"
    )
    print(
        "| model | params | fp32 weights | canary (HTTP) | canary (in-process) "
        "| sleep/wake, CPU backup | canary / that | sleep/wake + reload, no backup | canary / that |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, (v, h, layers, heads, kv, hd, inter) in SHAPES.items():
            d = build_tiny_qwen3(
                Path(tmp) / name.replace(" ", "_").replace("=", ""),
                vocab_size=v, hidden_size=h, num_layers=layers, num_heads=heads,
                num_kv_heads=kv, head_dim=hd, intermediate_size=inter,
            )  # fmt: skip
            r = bench_shape(d, args.repeats, args.length, args.top_k)
            print(
                f"| {name} | {r['params_m']:.1f} M | {r['weights_mb']:.0f} MB "
                f"| {r['canary'] * 1e3:.1f} ms | {r['canary_in_process'] * 1e3:.1f} ms "
                f"| {r['cycle_backup'] * 1e3:.1f} ms "
                f"| {r['canary'] / r['cycle_backup']:.2f}× | {r['cycle_reload'] * 1e3:.1f} ms "
                f"| {r['canary'] / r['cycle_reload']:.2f}× |",
                flush=True,
            )


if __name__ == "__main__":
    main()
