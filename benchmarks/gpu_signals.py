"""GPU: full-vocabulary student entropy and JSD over [16384, 151936] bf16 logits.

Side by side in one run, each timed with CUDA events (median of 5 after 2 warm-ups):
- device-to-device copy of the same tensor: the bandwidth yardstick (bytes read + written);
- ``signals.entropy_from_logits`` / ``jsd_from_logits`` (Triton kernel on CUDA; achieved bytes/s
  counts the logits read once, as the ideal kernel would);
- the chunked PyTorch path of the same functions (``backend="torch"``);
- a plain PyTorch implementation (``log_softmax`` of a float32 copy).
Peak extra memory is ``torch.cuda.max_memory_allocated`` above what was allocated before the
call. Prints a table and writes JSON to $OUT/gpu_signals.json when $OUT is set.

Run: python3 benchmarks/gpu_signals.py [--rows 16384]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics

import torch

from distill_guard.signals import entropy_from_logits, jsd_from_logits

V = 151_936


def plain_entropy(x: torch.Tensor) -> torch.Tensor:
    logp = torch.log_softmax(x.float(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def plain_jsd(s: torch.Tensor, t: torch.Tensor, beta: float = 0.5) -> torch.Tensor:
    ls = torch.log_softmax(s.float(), dim=-1)
    lt = torch.log_softmax(t.float(), dim=-1)
    lm = torch.logaddexp(ls + math.log1p(-beta), lt + math.log(beta))
    return (1 - beta) * (ls.exp() * (ls - lm)).sum(-1) + beta * (lt.exp() * (lt - lm)).sum(-1)


TILE_SWEEP = ((8, 1024, 4), (4, 1024, 4), (2, 1024, 4), (4, 512, 2), (4, 2048, 8), (8, 2048, 8),
              (16, 512, 4))  # fmt: skip
"""(tile rows, tile columns, warps) swept for the per-lane kernels (entropy here, the loss's
statistics pass in gpu_loss.py)."""


def measure(fn, repeat: int = 5, warmup: int = 2) -> tuple[float, float]:
    """(median ms, peak extra MB) of fn()."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    return statistics.median(times), peak


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=16384)
    ap.add_argument(
        "--sweep",
        action="store_true",
        help="also time the kernels per tile (entropy) or block (JSD) x warps",
    )
    args = ap.parse_args()
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    s = (torch.randn(args.rows, V, device=dev, generator=gen) * 3).to(torch.bfloat16)
    t = (torch.randn(args.rows, V, device=dev, generator=gen) * 3).to(torch.bfloat16)
    nbytes = s.numel() * s.element_size()
    dst = torch.empty_like(s)
    res: dict = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "rows": args.rows,
        "vocab": V,
    }

    copy_ms, _ = measure(lambda: dst.copy_(s))
    copy_bw = 2 * nbytes / (copy_ms / 1e3)
    res["copy"] = {"ms": copy_ms, "GBps": copy_bw / 1e9}
    dst = None  # free 5 GB before the other measurements

    # correctness of the fast paths against float64 on a slice
    ref_rows = 64
    sl, tl_ = s[:ref_rows].double(), t[:ref_rows].double()
    ref_h = plain_entropy(sl)
    ref_j = plain_jsd(sl, tl_)
    res["max_abs_err"] = {
        "entropy_triton": float((entropy_from_logits(s[:ref_rows]) - ref_h).abs().max()),
        "entropy_torch_chunked": float(
            (entropy_from_logits(s[:ref_rows], backend="torch") - ref_h).abs().max()
        ),
        "jsd_triton": float((jsd_from_logits(s[:ref_rows], t[:ref_rows]) - ref_j).abs().max()),
    }

    for name, fn, nread in (
        ("entropy_triton", lambda: entropy_from_logits(s), nbytes),
        ("entropy_torch_chunked", lambda: entropy_from_logits(s, backend="torch"), nbytes),
        ("entropy_plain", lambda: plain_entropy(s), nbytes),
        ("jsd_triton", lambda: jsd_from_logits(s, t), 2 * nbytes),
        ("jsd_torch_chunked", lambda: jsd_from_logits(s, t, backend="torch"), 2 * nbytes),
        ("jsd_plain", lambda: plain_jsd(s, t), 2 * nbytes),
    ):
        try:
            ms, peak = measure(fn)
        except torch.OutOfMemoryError as exc:
            res[name] = {"error": f"OOM: {exc}"[:200]}
            torch.cuda.empty_cache()
            continue
        bw = nread / (ms / 1e3)
        res[name] = {
            "ms": ms,
            "GBps": bw / 1e9,
            "fraction_of_copy_bw": bw / copy_bw,
            "peak_extra_MB": peak,
        }
        torch.cuda.empty_cache()

    if args.sweep:
        from distill_guard.triton_kernels import triton_entropy, triton_jsd

        sweep = {}
        for block in (1024, 2048, 4096, 8192):
            for warps in (4, 8, 16):
                j_ms, _ = measure(
                    lambda b=block, w=warps: triton_jsd(s, t, 0.5, block=b, num_warps=w), 3, 1
                )
                sweep[f"{block}x{warps}"] = {"jsd_frac": 2 * nbytes / (j_ms / 1e3) / copy_bw}
        for r, c, w in TILE_SWEEP:
            kw = {"tile_rows": r, "tile_cols": c, "num_warps": w}
            e_ms, _ = measure(lambda kw=kw: triton_entropy(s, **kw), 3, 1)
            key = f"tile{r}x{c}x{w}"
            sweep[key] = {"entropy_frac": nbytes / (e_ms / 1e3) / copy_bw}
            print(
                f"sweep entropy {key:16s} {e_ms:.3f} ms {sweep[key]['entropy_frac']:6.1%} of copy bw"
            )
        res["sweep"] = sweep
        for k, v in sweep.items():
            if "jsd_frac" not in v:
                continue
            print(f"sweep jsd block x warps {k:>9}: {v['jsd_frac']:6.1%} of copy bw")

    for sig in ("entropy", "jsd"):
        fast, plain = res[f"{sig}_triton"], res[f"{sig}_plain"]
        if "ms" in fast and "ms" in plain:
            res[f"{sig}_speedup_vs_plain"] = plain["ms"] / fast["ms"]
            res[f"{sig}_memory_vs_plain"] = fast["peak_extra_MB"] / plain["peak_extra_MB"]

    print(
        f"# {res['device']}  torch {res['torch']}  [{args.rows}, {V}] bf16 ({nbytes / 1e9:.2f} GB per tensor)"
    )
    print(f"d2d copy: {copy_ms:.2f} ms, {copy_bw / 1e9:.0f} GB/s (read+write)")
    for k, v in res.items():
        if isinstance(v, dict) and "ms" in v and k != "copy":
            print(
                f"{k:24s} {v['ms']:9.2f} ms  {v['GBps']:7.0f} GB/s  {v['fraction_of_copy_bw']:6.1%} of copy  "
                f"peak extra {v['peak_extra_MB']:9.1f} MB"
            )
        elif isinstance(v, dict) and "error" in v:
            print(f"{k:24s} {v['error']}")
    for sig in ("entropy", "jsd"):
        if f"{sig}_speedup_vs_plain" in res:
            print(
                f"{sig}: triton is {res[f'{sig}_speedup_vs_plain']:.1f}x plain log_softmax; "
                f"memory {res[f'{sig}_memory_vs_plain']:.4f} of plain"
            )
    print("max abs error vs float64:", res["max_abs_err"])
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "gpu_signals.json"), "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
