"""Per-step guard overhead for a realistic step, on GPU tensors (CPU with --device cpu).

One step = teacher check over 256 x 4096 tokens with top-16 logprobs (``on_teacher_scores``),
the step-metric checks (``on_step_metrics``), and the event write (a finding-free step writes
nothing, so one finding line is forced per step with an always-on info check). Target < 1 ms on
GPU. Wall clock per step, median over 50 steps after 5 warm-ups, with the GPU synchronised
before and after (the teacher check itself needs one host transfer). The scores are healthy
log-probabilities (each row's top-16 holds 90 % of its mass), so the step is the guard's healthy
path. ``--repeats`` repeats the measurement and prints the median of the repeats' medians too.
Each repeat also times the same steps with the teacher checks' statistics on their PyTorch path
(the path of every device but CUDA float32), interleaved with the Triton one, and prints the
ratio of the two medians. On CPU (``--device cpu``) the number is a proxy for the guard's host
overhead.

Run: python3 benchmarks/gpu_overhead.py [--device cuda|cpu] [--repeats 7]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
import time
from dataclasses import dataclass

import torch

import distill_guard.signals as signals
from distill_guard.checks import Check, default_checks
from distill_guard.findings import Finding, Severity
from distill_guard.guard import DistillGuard
from distill_guard.observations import RunSpec


@dataclass
class _EveryStepInfo(Check):
    """Emits one info finding per step so the event file is written every step."""

    name = "every_step_info"

    def on_step_metrics(self, metrics, run):
        return [Finding("bench.info", Severity.INFO, "benchmark event", metrics.step)]


FUSABLE = signals.fusable_float32


def _stats_path(path: str) -> None:
    """Sends the teacher checks' statistics (teacher collapse, the rows' top-1, the pairing
    gaps) through their Triton kernels where they apply (``fused``, the default) or always
    through PyTorch (``torch``)."""
    signals.fusable_float32 = FUSABLE if path == "fused" else (lambda *tensors: False)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    dev = torch.device(args.device)
    gen = torch.Generator(device=dev).manual_seed(0)
    rows = torch.randn(256 * 4096, 16, device=dev, generator=gen).sort(dim=1, descending=True)
    topk = rows.values - rows.values.logsumexp(dim=1, keepdim=True) + math.log(0.9)
    tokens = topk[:, 0] - torch.rand(256 * 4096, device=dev, generator=gen)
    with tempfile.TemporaryDirectory() as tmp:
        events = os.path.join(tmp, "events.jsonl")
        guard = DistillGuard(
            [*default_checks(), _EveryStepInfo()], run=RunSpec(vocab_size=151936), events=events
        )
        metrics = {
            "loss": 0.02,
            "student_entropy": 0.41,
            "truncated_ratio": 0.05,
            "eval_accuracy": 0.4,
        }

        def step(i: int, with_tokens: bool) -> float:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            guard.on_teacher_scores(
                i, token_logprobs=tokens if with_tokens else None, topk_logprobs=topk
            )
            guard.on_step_metrics(i, metrics)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            return (time.perf_counter() - t) * 1e3

        res: dict = {
            "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
            "tokens": 256 * 4096,
            "top_k": 16,
        }
        step_no = 0
        labels = [
            (f"{label}{suffix}", with_tokens, path)
            for label, with_tokens in (("topk", False), ("topk_and_tokens", True))
            for suffix, path in (("", "fused"), ("_torch_stats", "torch"))
        ]
        for label, _, _ in labels:
            res[label] = {"repeats": []}
        for _ in range(args.repeats):
            for label, with_tokens, path in labels:
                _stats_path(path)
                times = []
                for i in range(5 + args.steps):
                    ms = step(step_no, with_tokens)
                    step_no += 1
                    if i >= 5:  # after 5 warm-up steps
                        times.append(ms)
                res[label]["repeats"].append(
                    {
                        "median_ms": statistics.median(times),
                        "p90_ms": sorted(times)[int(0.9 * len(times))],
                    }
                )
        _stats_path("fused")
        for label, _, _ in labels:
            medians = [r["median_ms"] for r in res[label]["repeats"]]
            res[label] |= {"median_ms": statistics.median(medians), "medians_ms": medians}
        res["halted"] = guard.halted
        with open(events) as fh:
            res["event_lines"] = sum(1 for _ in fh)
    for label, what in (
        ("topk", "top-16 logprobs"),
        ("topk_and_tokens", "top-16 and sampled-token logprobs"),
    ):
        r = res[label]
        for i, one in enumerate(r["repeats"]):
            print(
                f"guard overhead per step on {res['device']} ({res['tokens']} tokens, {what}, "
                f"step metrics, one event line), run {i + 1}: median {one['median_ms']:.3f} ms, "
                f"p90 {one['p90_ms']:.3f} ms"
            )
        spread = f"{min(r['medians_ms']):.3f}–{max(r['medians_ms']):.3f}"
        print(
            f"{what}: median of {len(r['repeats'])} runs' medians {r['median_ms']:.3f} ms "
            f"(runs {spread} ms; target < 1 ms on GPU)"
        )
        slow = res[f"{label}_torch_stats"]
        print(
            f"{what}, teacher statistics on PyTorch in the same runs: {slow['median_ms']:.3f} ms "
            f"(runs {min(slow['medians_ms']):.3f}–{max(slow['medians_ms']):.3f} ms); "
            f"ratio {slow['median_ms'] / r['median_ms']:.2f}x"
        )
    print(f"event lines {res['event_lines']}, halted {res['halted']}")
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "gpu_overhead.json"), "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
