"""CPU benchmarks of the guard's hot paths, measured side by side in one run.

1. The per-step teacher check over 256k tokens with top-16 logprobs (target <= 20 ms), next to
   the cost of one plain pass over the same tensor (``x.sum()``) for scale.
2. Full-vocabulary entropy of [2048, 151936] float32 logits: the chunked
   ``signals.entropy_from_logits`` against a plain ``log_softmax`` implementation. Targets: no
   slower, and peak extra memory <= 1/8 of the baseline's. Memory is the growth of the process's
   peak RSS (ru_maxrss) over the RSS after the input exists, each method in a fresh process.

Run: .venv/bin/python benchmarks/signals.py   (takes about a minute on 2 cores)
"""

from __future__ import annotations

import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

import torch

N_TOKENS, TOP_K, V = 262_144, 16, 151_936
ENT_ROWS = 2048


def median_ms(fn, repeat: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def bench_teacher_check() -> dict:
    from distill_guard.guard import DistillGuard
    from distill_guard.observations import RunSpec

    guard = DistillGuard(run=RunSpec(vocab_size=V))
    gen = torch.Generator().manual_seed(0)
    healthy = torch.randn(N_TOKENS, TOP_K, generator=gen).sort(dim=1, descending=True).values - 3
    uniform = torch.full((N_TOKENS, TOP_K), -math.log(V))
    step = iter(range(10**9))
    out = {
        "check_healthy_ms": median_ms(
            lambda: guard.on_teacher_scores(next(step), topk_logprobs=healthy), 21
        ),
        "one_pass_sum_ms": median_ms(lambda: healthy.sum(), 21),
    }
    guard.alerter.log_alerts = False
    out["check_uniform_ms"] = median_ms(
        lambda: guard.on_teacher_scores(next(step), topk_logprobs=uniform), 5
    )
    assert guard.summary.count.get("teacher.uniform"), "the uniform batch was not flagged"
    return out


def baseline_entropy(logits: torch.Tensor) -> torch.Tensor:
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def chunked_entropy(logits: torch.Tensor) -> torch.Tensor:
    from distill_guard.signals import entropy_from_logits

    return entropy_from_logits(logits)


def _child(method: str) -> None:
    """Runs in a fresh process: time one method and report its peak memory growth."""
    torch.set_num_threads(2)
    fn = {"baseline": baseline_entropy, "chunked": chunked_entropy}[method]
    logits = torch.randn(ENT_ROWS, V, generator=torch.Generator().manual_seed(0)).mul_(4)
    before_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    h = fn(logits)
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    ms = median_ms(lambda: fn(logits), repeat=3, warmup=0)
    print(
        json.dumps(
            {"ms": ms, "extra_mb": (peak_kb - before_kb) / 1024, "mean_entropy": float(h.mean())}
        )
    )


def run_child(method: str) -> dict:
    proc = subprocess.run(
        [sys.executable, __file__, "--child", method], capture_output=True, text=True, check=True
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    print(
        f"# distill_guard signal benchmarks  torch {torch.__version__}  "
        f"{platform.processor() or platform.machine()}  load average {os.getloadavg()[0]:.2f}"
    )
    for threads in (2, 1):
        torch.set_num_threads(threads)
        tc = bench_teacher_check()
        print(
            f"teacher check, {N_TOKENS} tokens x top-{TOP_K}, {threads} torch thread(s): healthy "
            f"{tc['check_healthy_ms']:.2f} ms, uniform {tc['check_uniform_ms']:.2f} ms "
            f"(target <= 20 ms); one x.sum() pass {tc['one_pass_sum_ms']:.2f} ms"
        )
    torch.set_num_threads(2)
    base, chunk = run_child("baseline"), run_child("chunked")
    assert abs(base["mean_entropy"] - chunk["mean_entropy"]) < 1e-3, (base, chunk)
    print(
        f"entropy [{ENT_ROWS}, {V}] float32: log_softmax baseline {base['ms']:.0f} ms, "
        f"peak extra {base['extra_mb']:.0f} MB; chunked {chunk['ms']:.0f} ms, peak extra "
        f"{chunk['extra_mb']:.0f} MB"
    )
    print(
        f"  speed chunked/baseline = {base['ms'] / chunk['ms']:.2f}x (target >= 1.0x); "
        f"memory chunked/baseline = {chunk['extra_mb'] / base['extra_mb']:.3f} (target <= 0.125)"
    )


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        _child(sys.argv[2])
    else:
        main()
