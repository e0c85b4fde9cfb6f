"""A 100k-step soak of the guard's hooks: memory must stay flat over a long run.

Every step calls ``on_teacher_scores`` (token and top-k logprobs of a healthy teacher) and
``on_step_metrics`` (loss, entropy, teacher logprob), with an event file on disk. Every
``--incident-every`` steps the teacher turns uniform for a step and, two steps later, the loss
is NaN (never 3 critical steps in a row, which would halt), so
findings, decisions, incidents and events are written all along the run, not only healthy
steps. Memory is read every ``--every`` steps: the process's resident set (``/proc/self/statm``
or ``ru_maxrss``) and Python's traced allocations (``tracemalloc``, started after warm-up).
The ratio printed is the last reading over the first.

Run: ``python benchmarks/soak.py [--steps 100000] [--every 10000]``.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import platform
import resource
import tempfile
import time
import tracemalloc
from pathlib import Path

import torch

from distill_guard import build_guard
from distill_guard.cli.progress import Progress
from distill_guard.events import read_events


def rss_mib() -> float:
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--every", type=int, default=10_000)
    ap.add_argument("--incident-every", type=int, default=1_000)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(1)
    logging.getLogger("distill_guard").setLevel(logging.CRITICAL + 1)  # the findings go to the file
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(args.tokens, args.vocab, generator=gen) * 3
    healthy = torch.log_softmax(logits, dim=-1)
    uniform = torch.full_like(healthy, -math.log(args.vocab))
    target = torch.randint(args.vocab, (args.tokens,), generator=gen)

    def scores(table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        top = table.topk(8, dim=-1).values
        return table.gather(1, target[:, None]).squeeze(1), top

    good, bad = scores(healthy), scores(uniform)
    with tempfile.TemporaryDirectory() as tmp:
        events = Path(tmp) / "events.jsonl"
        guard = build_guard(
            "default",
            [f"events_path={events}", f"run.vocab_size={args.vocab}", "alerts.use_wandb=false"],
        )
        print(f"# {platform.platform()}, torch {torch.__version__}, 1 thread")
        print(
            f"# {args.steps} steps, V={args.vocab}, {args.tokens} tokens, incident every "
            f"{args.incident_every} steps"
        )
        print(f"{'step':>7} {'rss MiB':>8} {'traced KiB':>10} {'events':>7} {'us/step':>8}")
        first: tuple[float, float] | None = None
        t_last = time.perf_counter()
        progress = Progress.for_command()  # on stderr, to a terminal only
        for step in range(args.steps + 1):
            progress.count(step, args.steps, "soak: step")
            burst = step % args.incident_every
            tok, top = bad if burst == 1 else good
            guard.on_teacher_scores(step, tok, top)
            loss = float("nan") if burst == 3 else 0.1 + 0.01 * math.sin(step)
            guard.on_step_metrics(
                step, {"loss": loss, "student_entropy": 0.5, "teacher_logprob": -1.2}
            )
            if step == args.every // 10:
                tracemalloc.start()
            if step and step % args.every == 0:
                now = time.perf_counter()
                traced = tracemalloc.get_traced_memory()[0] / 2**10
                rss = rss_mib()
                first = first or (rss, traced)
                n_events = sum(1 for _ in events.open())
                progress.close()  # the row starts a line of its own
                print(
                    f"{step:>7} {rss:>8.1f} {traced:>10.1f} {n_events:>7} "
                    f"{(now - t_last) / args.every * 1e6:>8.0f}"
                )
                t_last = now
        progress.close()
        guard.close()
        assert first is not None
        print(f"rss last/first: {rss / first[0]:.3f}; traced last/first: {traced / first[1]:.3f}")
        kinds = {e["kind"] for e in read_events(events)}
        print(f"event kinds written: {sorted(kinds)}; halted: {guard.halt is not None}")


if __name__ == "__main__":
    main()
