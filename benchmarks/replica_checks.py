"""The per-replica checks' cost against a wake, at 1, 4 and 16 replicas (issue 29).

Reference servers (a tiny Qwen3, V = 512, weights kept across sleep) on loopback, one thread
each in this process, driven by :class:`~distill_guard.live.replicas.ReplicatedTeacher` with no
router (a healthy fleet never calls it). Per fleet size, the median over ``--repeats`` rounds of:

- (a) the wake: every replica's ``/resume_memory_occupation``, as the guard times it
  (``ColocatedTeacher.seconds["resume"]``), summed over the replicas;
- (b) the checks after the wake: ``ReplicatedTeacher.wake`` minus (a): per replica the weights
  checksum, ``/continue_generation`` and the canary judged against the fingerprint and the
  checkpoint's reference, and the fleet's decision;
- (c) the fingerprint before the sleep: ``ReplicatedTeacher.sleep`` minus every release;
- (d) ``recheck``: the canary of every serving replica again, after the step's scoring.

Prints one table, the sizes side by side, with (b)/(a), (c)/(a), (d)/(a) and (b) per replica.
Replicas are handled one after another, so (b) grows with their number; this measures by how
much. Writes $OUT/replica_checks.json when $OUT is set.

Run: .venv/bin/python benchmarks/replica_checks.py [--sizes 1 4 16] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

from distill_guard.checks.canary import CanaryCheck
from distill_guard.live.replicas import ReplicatedTeacher
from distill_guard.live.teacher_reference import reference_from_checkpoint
from distill_guard.policy import Action
from distill_guard.teachers.replicas import make_replicas
from distill_guard.testing.router import reference_replicas
from distill_guard.testing.tiny import build_tiny_qwen3


def measure(model_dir: str, reference, check: CanaryCheck, n: int, repeats: int) -> dict:
    rows: dict[str, list[float]] = {"wake": [], "checks": [], "fingerprint": [], "recheck": []}
    with reference_replicas(model_dir, [True] * n) as replicas:
        fleet = ReplicatedTeacher(make_replicas([r.url for r in replicas]), reference, canary=check)
        members = [fleet.colocated(r.url) for r in replicas]
        for i in range(repeats + 1):  # the first round warms up
            t0 = time.perf_counter()
            fleet.sleep(i)
            slept = time.perf_counter() - t0
            released = sum(m.seconds["release"] for m in members)
            t0 = time.perf_counter()
            woke = fleet.wake(i)
            waking = time.perf_counter() - t0
            resumed = sum(m.seconds["resume"] for m in members)
            assert woke.decision.action is Action.CONTINUE, woke.decision.message
            t0 = time.perf_counter()
            late = fleet.recheck(i)
            rechecked = time.perf_counter() - t0
            assert late.decision.action is Action.CONTINUE, late.decision.message
            if i:
                rows["wake"].append(resumed)
                rows["checks"].append(waking - resumed)
                rows["fingerprint"].append(slept - released)
                rows["recheck"].append(rechecked)
    out = {k: statistics.median(v) * 1e3 for k, v in rows.items()}
    out["replicas"] = n
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--length", type=int, default=16, help="canary tokens")
    args = ap.parse_args()
    check = CanaryCheck(length=args.length, top_k=4)
    model_dir = str(build_tiny_qwen3(tempfile.mkdtemp(prefix="replica_checks_"), vocab_size=512))
    reference = reference_from_checkpoint(model_dir, check)
    results = [measure(model_dir, reference, check, n, args.repeats) for n in args.sizes]
    sizes = [f"{r['replicas']} replica(s)" for r in results]
    head = f"{'':34}" + "".join(f"{size:>16}" for size in sizes)
    print(head)
    lines = [
        ("(a) wake (resume), ms", lambda r: f"{r['wake']:.1f}"),
        ("(b) checks after the wake, ms", lambda r: f"{r['checks']:.1f}"),
        ("(c) fingerprint before sleep, ms", lambda r: f"{r['fingerprint']:.1f}"),
        ("(d) recheck after scoring, ms", lambda r: f"{r['recheck']:.1f}"),
        ("(b)/(a)", lambda r: f"{r['checks'] / r['wake']:.2f}x"),
        ("(c)/(a)", lambda r: f"{r['fingerprint'] / r['wake']:.2f}x"),
        ("(d)/(a)", lambda r: f"{r['recheck'] / r['wake']:.2f}x"),
        ("(b) per replica, ms", lambda r: f"{r['checks'] / r['replicas']:.1f}"),
    ]
    for name, cell in lines:
        print(f"{name:34}" + "".join(f"{cell(r):>16}" for r in results))
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "replica_checks.json"), "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
