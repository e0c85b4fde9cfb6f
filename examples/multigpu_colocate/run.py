"""Several ranks, one DDP student, a colocated TorchTeacher per rank that sleeps and wakes every step.

One rank's teacher runs without its weights CPU backup, so it wakes with zeroed weights (on CUDA
with torch_memory_saver, a real region; on CPU an emulation of it). The guard, its decisions
reduced over the ranks, must reach the same decision on every rank in the same step: repair the
faulty rank's teacher and carry on (``--policy repair``), or halt every rank after a checkpoint
(``--policy halt``); never a hang. ``--compare`` also runs without the guard and prints the ratio
of step times. See README.md next to this file.

    python -m examples.multigpu_colocate.run --nproc 2 --device cpu --faulty-rank 1 --compare
    torchrun --nproc-per-node 2 -m examples.multigpu_colocate.run --faulty-rank 1 --compare
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import gc
import hashlib
import json
import os
import socket
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from distill_guard import DistillGuard
from distill_guard.alerts import Alerter
from distill_guard.checks.canary import CanaryCheck
from distill_guard.consensus import DistributedReducer
from distill_guard.observations import RunSpec
from distill_guard.policy import Action, Decision, Policy
from distill_guard.signals import entropy_from_logits
from distill_guard.teachers import TorchTeacher

NO_MULTICAST = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
"""NVLink multicast stays off (the device README): set before anything initialises."""
BETA = 0.5
"""JSD weight of the teacher; the ceiling H(β) is ln 2."""
EMBED_STD = 0.6
"""Teacher embedding init: peaked like a trained model (entropy ≈ 0.6 nats at V = 151936)."""
STUDENT_NOISE = 0.3
"""The student is the teacher plus this much relative noise: a healthy JSD sits far below ln 2."""
STAGES = ("wake", "scores", "metrics")
"""The guard's decision points in a step, in order (wake, on_teacher_scores, on_step_metrics)."""
HOOKS = tuple(
    h.__name__
    for h in (
        DistillGuard.wake,
        DistillGuard.on_teacher_scores,
        DistillGuard.on_step_metrics,
        DistillGuard.sleep,
    )
)


# ---------------------------------------------------------------------------------- options


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m examples.multigpu_colocate.run",
        description="DDP student + colocated teacher per rank, teacher fault on one rank.",
    )
    p.add_argument("--nproc", type=int, default=2, help="ranks to spawn when not under torchrun")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda if any")
    p.add_argument("--backend", choices=("nccl", "gloo"), default=None)
    p.add_argument("--same-gpu", action="store_true", help="all ranks on cuda:0 (gloo only)")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--faulty-rank", type=int, default=None, help="its teacher has no CPU backup")
    p.add_argument("--policy", choices=("repair", "halt"), default="repair")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--no-guard", action="store_true", help="baseline: no guard at all")
    mode.add_argument("--compare", action="store_true", help="run without, then with the guard")
    p.add_argument("--out", type=Path, default=Path("outputs/multigpu_colocate"))
    p.add_argument("--vocab-size", type=int, default=151936, help="Qwen3's V by default")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=8)
    p.add_argument("--gen-len", type=int, default=16)
    p.add_argument("--top-k", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout-s", type=float, default=600.0, help="whole run, per rank")
    p.add_argument("--consensus-timeout-s", type=float, default=60.0, help="per guard hook")
    args = p.parse_args(argv)
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.backend = args.backend or (
        "nccl" if args.device == "cuda" and not args.same_gpu else "gloo"
    )
    if args.same_gpu and (args.device != "cuda" or args.backend != "gloo"):
        p.error("--same-gpu needs --device cuda and --backend gloo (NCCL wants one GPU per rank)")
    if args.backend == "nccl" and args.device != "cuda":
        p.error("--backend nccl needs --device cuda")
    return args


# ---------------------------------------------------------------------------------- launch


def main(argv: list[str] | None = None, *, start_method: str = "spawn") -> int:
    """Under torchrun run this rank; otherwise spawn ``--nproc`` ranks on 127.0.0.1.

    Exit code 0 when every rank took the same decisions at every step, else 1.
    ``start_method`` starts those ranks (the tests pass ``forkserver``: a server that imported
    torch once forks them, instead of each importing it again).
    """
    args = parse_args(argv)
    os.environ.update(NO_MULTICAST)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        _exit_without_teardown(worker(args))
    (args.out / "summary.json").unlink(missing_ok=True)
    mp.start_processes(
        _spawned,
        args=(args, free_port(), LauncherStreams()),
        nprocs=args.nproc,
        join=True,
        start_method=start_method,
    )
    summary = json.loads((args.out / "summary.json").read_text())
    return 0 if summary["agreed"] else 1


class LauncherStreams:
    """The launcher's stdout and stderr, handed to each rank as it starts: a spawned rank
    inherits them anyway, a fork server's child would otherwise write to the server's (the
    tests' Relax harness hands its trainer ranks the driver's the same way)."""

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:  # runs while the rank is being started
        from multiprocessing.reduction import DupFd

        return (RankStreams, (DupFd(1), DupFd(2)))


class RankStreams:
    """What a rank receives of :class:`LauncherStreams`: ``attach`` makes them its fd 1 and 2."""

    def __init__(self, out: Any, err: Any) -> None:
        self.fds = (out.detach(), err.detach())

    def attach(self) -> None:
        for fd, target in zip(self.fds, (1, 2)):
            if fd != target:  # the same descriptor when spawned
                os.dup2(fd, target)
                os.close(fd)


def _spawned(rank: int, args: argparse.Namespace, port: int, streams: RankStreams) -> None:
    streams.attach()
    os.environ.update(NO_MULTICAST)  # a fork server's child has the server's environment
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE=str(args.nproc),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
    )
    _exit_without_teardown(worker(args))


def _exit_without_teardown(code: int) -> None:
    """End a rank once its results are written, skipping interpreter teardown.

    On an H200 with torch_memory_saver 0.0.10 (torch hook mode) a rank whose teacher lived in a
    memory-saver region exited with status 1 during interpreter shutdown, after all its work was
    done and written, with or without the guard; the cause was not established. Exiting here
    keeps the status the rank's own.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_watchdog(timeout_s: float, rank: int) -> threading.Timer:
    """A hang becomes a failure: past ``timeout_s`` dump every thread's stack and exit 124."""

    def fire() -> None:
        print(
            f"[rank {rank}] watchdog: the run did not finish within --timeout-s {timeout_s:g} s; "
            "stacks follow",
            file=sys.stderr,
            flush=True,
        )
        faulthandler.dump_traceback(all_threads=True)
        os._exit(124)

    timer = threading.Timer(timeout_s, fire)
    timer.daemon = True
    timer.start()
    return timer


@dataclass(frozen=True)
class Place:
    """Where this rank runs."""

    rank: int
    world: int
    device: torch.device


def worker(args: argparse.Namespace) -> int:
    """One rank: build, run the mode(s), gather; rank 0 prints the table and writes summary.json."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    watchdog = start_watchdog(args.timeout_s, rank)
    place = Place(rank, world, rank_device(args, local))
    if place.device.type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group(args.backend, timeout=datetime.timedelta(seconds=args.timeout_s))
    try:
        quiet_transformers()
        teacher_dir, student_dir = checkpoints(args, rank)
        modes = (False, True) if args.compare else (not args.no_guard,)
        mine = [ColocatedRank(args, place, teacher_dir, student_dir, g).run() for g in modes]
        everyone: list[Any] = [None] * world
        dist.all_gather_object(everyone, mine)
        if rank != 0:
            return 0
        by_mode = {m["mode"]: [ranks[i] for ranks in everyone] for i, m in enumerate(mine)}
        summary = summarize(args, by_mode)
        (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
        print(report(args, by_mode, summary), flush=True)
        return 0 if summary["agreed"] else 1
    finally:
        dist.destroy_process_group()
        watchdog.cancel()


def rank_device(args: argparse.Namespace, local_rank: int) -> torch.device:
    if args.device == "cpu":
        return torch.device("cpu")
    device = torch.device("cuda", 0 if args.same_gpu else local_rank)
    torch.cuda.set_device(device)
    return device


def quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def checkpoints(args: argparse.Namespace, rank: int) -> tuple[Path, Path]:
    """Rank 0 writes the teacher and student checkpoints; the others wait for them, and stop,
    saying so, where they cannot see them (``--out`` on a node-local disk of another node)."""
    root = args.out / "ckpt"
    if rank == 0:
        build_checkpoints(root, args.vocab_size, args.seed)
    dist.barrier()
    missing = [d for d in ("teacher", "student") if not (root / d / "config.json").is_file()]
    if missing:
        raise SystemExit(
            f"[rank {rank}] {root} has no {' or '.join(missing)} checkpoint: rank 0 wrote them "
            "on its node; --out must be a directory every node sees (a shared filesystem)"
        )
    return root / "teacher", root / "student"


def build_checkpoints(root: Path, vocab_size: int, seed: int) -> None:
    """A tiny Qwen3 teacher on disk (its repairs reload it) and a student near it."""
    from transformers import Qwen3ForCausalLM

    from distill_guard.testing.tiny import build_tiny_qwen3

    teacher_dir = build_tiny_qwen3(
        root / "teacher", vocab_size=vocab_size, seed=seed, embed_std=EMBED_STD
    )
    student = Qwen3ForCausalLM.from_pretrained(teacher_dir)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in student.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * STUDENT_NOISE * p.std())
    student.save_pretrained(root / "student")


# ---------------------------------------------------------------------------------- one rank


class Halted(Exception):
    """The agreed decision at a stage was halt."""

    def __init__(self, stage: str) -> None:
        super().__init__(stage)
        self.stage = stage


@dataclass
class StepRecord:
    """What one rank did in one step."""

    step: int
    actions: dict[str, str] = field(default_factory=dict)
    """Agreed decision per guard stage (``wake``, ``scores``, ``metrics``)."""
    repaired: bool = False
    """This rank's own teacher was reloaded and verified at this step."""
    trained: bool = False
    loss: float | None = None
    student_entropy: float | None = None
    halt: str | None = None
    """The stage at which every rank halted."""
    seconds: float = 0.0
    guard_seconds: dict[str, float] = field(default_factory=dict)
    """Time inside each guard hook (canary, checks, repairs, waiting for the other ranks)."""


class ColocatedRank:
    """This rank's DDP student replica, its colocated teacher and, if guarded, its guard."""

    def __init__(
        self,
        args: argparse.Namespace,
        place: Place,
        teacher_dir: Path,
        student_dir: Path,
        guarded: bool,
    ) -> None:
        from torch.nn.parallel import DistributedDataParallel
        from transformers import Qwen3ForCausalLM

        self.args, self.place = args, place
        self.mode = "guard" if guarded else "no_guard"
        self.out = args.out / self.mode
        self.out.mkdir(parents=True, exist_ok=True)
        dev = place.device
        model = Qwen3ForCausalLM.from_pretrained(student_dir, dtype=torch.float32).to(dev)
        self.student = DistributedDataParallel(
            model, device_ids=[dev.index] if dev.type == "cuda" else None
        )
        self.optimizer = torch.optim.AdamW(self.student.parameters(), lr=args.lr)
        self.backup = place.rank != args.faulty_rank
        self.teacher = TorchTeacher.from_pretrained(
            teacher_dir,
            device=dev,
            dtype=torch.bfloat16 if dev.type == "cuda" else torch.float32,
            enable_cpu_backup=self.backup,
            enable_deterministic_inference=True,
        )
        self.guard: DistillGuard | None = self._make_guard() if guarded else None
        self.checkpoint: Path | None = None

    def _make_guard(self) -> DistillGuard:
        rank = self.place.rank
        events = self.out / f"guard.rank{rank}.jsonl"
        events.unlink(missing_ok=True)  # the event log appends; start this run's afresh
        # halt: repair disabled, so a dead teacher stops every rank at once
        policy = Policy() if self.args.policy == "repair" else Policy(critical_action=Action.HALT)
        guard = DistillGuard(
            policy=policy,
            run=RunSpec(vocab_size=self.args.vocab_size, beta=BETA),
            events=events,
            alerter=Alerter(rank=rank, use_wandb=False),
            teacher=self.teacher,
            canary=CanaryCheck(),
            repair_backoff_s=0.1,
            reducer=DistributedReducer(timeout_s=self.args.consensus_timeout_s),
            rank=rank,
        )
        guard.reducer.setup()
        return guard

    # -- the loop ----------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """All steps (or up to the halt); the per-rank summary, also written as rank<r>.json."""
        if self.guard is not None:
            self.guard.sleep(-1)  # the launch sleep: the trainer takes the memory first
        else:
            self.teacher.release()
        records = []
        for step in range(self.args.steps):
            rec = self.step(step)
            records.append(rec)
            if rec.halt is not None:
                self.checkpoint = self.save_halt_checkpoint(step)
                break
        summary = self.summary(records)
        (self.out / f"rank{self.place.rank}.json").write_text(json.dumps(summary, indent=1))
        self.close()
        return summary

    def step(self, step: int) -> StepRecord:
        """wake → canary → score → batch check → loss/backward/update → metrics → fingerprint → sleep."""
        rec = StepRecord(step)
        t0 = time.perf_counter()
        try:
            if self.guard is None:
                self.teacher.resume()
            woke = self.ask(rec, DistillGuard.wake, step, stage="wake")
            rec.repaired = woke is not None and woke.repaired
            ids = self.sample(step)
            topk_lp, topk_ids, token_lp = self.score(ids)
            d = self.ask(
                rec,
                DistillGuard.on_teacher_scores,
                step,
                stage="scores",
                token_logprobs=token_lp,
                topk_logprobs=topk_lp,
            )
            train = d is None or not d.acts  # skip_batch / rewake: not on these scores
            metrics = self.learn(rec, ids, topk_lp, topk_ids) if train else {}
            self.ask(rec, DistillGuard.on_step_metrics, step, metrics, stage="metrics")
            if self.guard is None:
                self.teacher.release()
            self.ask(rec, DistillGuard.sleep, step)
        except Halted as h:
            rec.halt = h.stage
        if self.place.device.type == "cuda":
            torch.cuda.synchronize(self.place.device)
        rec.seconds = time.perf_counter() - t0
        return rec

    def ask(
        self,
        rec: StepRecord,
        hook: Callable[..., Decision],
        *args: Any,
        stage: str | None = None,
        **kwargs: Any,
    ) -> Decision | None:
        """Call ``hook`` (a :class:`DistillGuard` method) on the guard, if any, and time it;
        record the decision as ``stage``'s (already agreed by all ranks), and raise
        :class:`Halted` on a halt."""
        if self.guard is None:
            return None
        t0 = time.perf_counter()
        decision = hook(self.guard, *args, **kwargs)
        rec.guard_seconds[hook.__name__] = time.perf_counter() - t0
        if stage is not None:
            rec.actions[stage] = decision.action.value
        if decision.action is Action.HALT:
            raise Halted(stage or hook.__name__)
        return decision

    def sample(self, step: int) -> torch.Tensor:
        """The student's own rollout: seeded prompts (a different shard per rank), sampled tokens."""
        a, dev = self.args, self.place.device
        seed = (a.seed * 1_000_003 + step) * self.place.world + self.place.rank
        gen = torch.Generator().manual_seed(seed)
        prompts = torch.randint(0, a.vocab_size, (a.batch_size, a.prompt_len), generator=gen)
        torch.manual_seed(seed)  # generate() samples from the global generator
        with torch.no_grad():
            return self.student.module.generate(
                prompts.to(dev),
                attention_mask=torch.ones_like(prompts, device=dev),
                do_sample=True,
                top_k=0,
                top_p=1.0,
                max_new_tokens=a.gen_len,
                min_new_tokens=a.gen_len,
                pad_token_id=0,
            )

    def score(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Teacher top-k logprobs ``[N, K]``, their ids, and sampled-token logprobs ``[N]``,
        for the N = batch × gen_len generated positions."""
        res = self.teacher.score(
            ids.tolist(), top_k=self.args.top_k, logprob_start_len=self.args.prompt_len - 1
        )
        dev = self.place.device
        return (
            torch.cat(res.topk_logprobs).to(dev),
            torch.cat(res.topk_ids).to(dev),
            torch.cat(res.token_logprobs).to(dev),
        )

    def learn(
        self, rec: StepRecord, ids: torch.Tensor, topk_lp: torch.Tensor, topk_ids: torch.Tensor
    ) -> dict[str, float]:
        """JSD on the teacher's top-k with a tail bin; backward is DDP's all-reduce."""
        p = self.args.prompt_len
        logits = self.student(ids).logits[:, p - 1 : -1].flatten(0, 1)
        loss, entropy = topk_jsd(logits, topk_lp, topk_ids, BETA)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        rec.trained, rec.loss, rec.student_entropy = True, loss.item(), entropy.item()
        return {"loss": rec.loss, "student_entropy": rec.student_entropy}

    # -- after the loop ------------------------------------------------------------------------

    def save_halt_checkpoint(self, step: int) -> Path:
        """Every rank halted at ``step``: rank 0 saves the student, each rank its guard state."""
        path = self.out / f"halt-step{step}"
        path.mkdir(parents=True, exist_ok=True)
        if self.place.rank == 0:
            state = {
                "step": step,
                "student": self.student.module.state_dict(),
                "optimizer": self.optimizer.state_dict(),
            }
            torch.save(state, path / "student.pt")
        torch.save(self.guard.state_dict(), path / f"guard.rank{self.place.rank}.pt")
        return path

    def summary(self, records: list[StepRecord]) -> dict[str, Any]:
        halt = self.guard.halt if self.guard is not None else None
        return {
            "mode": self.mode,
            "rank": self.place.rank,
            "device": str(self.place.device),
            "teacher_cpu_backup": self.backup,
            "torch_memory_saver": self.teacher.uses_torch_memory_saver,
            "steps": [asdict(r) for r in records],
            "repairs": self.guard.repairs if self.guard is not None else 0,
            "halted_step": halt.step if halt else None,
            "halt_reason": halt.message if halt else None,
            "checkpoint": str(self.checkpoint) if self.checkpoint else None,
            "events": str(self.guard.events.path) if self.guard is not None else None,
            "student_sha256": params_sha256(self.student.module),
        }

    def close(self) -> None:
        """Free this mode's teacher and student before the next mode builds its own."""
        if self.guard is not None:
            self.guard.close()
        if self.teacher.asleep:  # free mapped memory: a paused torch_memory_saver region
            self.teacher.resume()  # freed as such broke the next region's allocation on an H200
        del self.teacher, self.student, self.optimizer, self.guard
        gc.collect()
        if self.place.device.type == "cuda":
            torch.cuda.empty_cache()


def topk_jsd(
    student_logits: torch.Tensor, topk_lp: torch.Tensor, topk_ids: torch.Tensor, beta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token JSD (teacher weight β) over the teacher's top-k ids plus one tail bin, and the
    student's full-vocabulary entropy (detached)."""
    s_lp = torch.log_softmax(student_logits.float(), dim=-1)
    s = _with_tail(s_lp.gather(-1, topk_ids))
    t = _with_tail(topk_lp.float())
    m = beta * t + (1 - beta) * s

    def kl(x: torch.Tensor) -> torch.Tensor:
        return (torch.special.xlogy(x, x) - torch.special.xlogy(x, m)).sum(-1)

    entropy = entropy_from_logits(student_logits.detach()).mean()
    return (beta * kl(t) + (1 - beta) * kl(s)).mean(), entropy


def _with_tail(lp: torch.Tensor) -> torch.Tensor:
    p = lp.exp()
    return torch.cat([p, (1 - p.sum(-1, keepdim=True)).clamp_min(0)], dim=-1)


def params_sha256(model: torch.nn.Module) -> str:
    """Hash of every parameter's bytes: DDP replicas must hash the same."""
    h = hashlib.sha256()
    for _, p in sorted(model.named_parameters()):
        h.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


# ---------------------------------------------------------------------------------- report


def step_decision(step: dict[str, Any]) -> str:
    """The non-continue stage decisions of a step, e.g. ``rewake@wake``; ``continue`` if none."""
    acts = [f"{a}@{s}" for s in STAGES if (a := step["actions"].get(s)) not in (None, "continue")]
    return ", ".join(acts) or ("continue" if step["actions"] else "-")


def timed_steps(ranks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Completed steps of every rank, leaving out step 0 (first-call warm-up) where there are more."""
    done = [[s for s in r["steps"] if s["halt"] is None] for r in ranks]
    return [s for steps in done for s in (steps[1:] if len(steps) > 1 else steps)]


def step_times(ranks: list[dict[str, Any]]) -> dict[str, float | None]:
    """Mean and median step time, and mean time inside the guard's hooks (all, and per hook),
    in seconds."""
    steps = timed_steps(ranks)
    if not steps:
        return {"mean": None, "median": None, "guard": None, "hooks": {}}
    seconds = [s["seconds"] for s in steps]
    hooks = {h: statistics.fmean(s["guard_seconds"].get(h, 0.0) for s in steps) for h in HOOKS}
    return {
        "mean": statistics.fmean(seconds),
        "median": statistics.median(seconds),
        "guard": sum(hooks.values()),
        "hooks": hooks,
    }


def mean_loss(rank: dict[str, Any]) -> float | None:
    losses = [s["loss"] for s in rank["steps"] if s["loss"] is not None]
    return statistics.fmean(losses) if losses else None


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def summarize(args: argparse.Namespace, by_mode: dict[str, list[dict]]) -> dict[str, Any]:
    out: dict[str, Any] = {"modes": {}}
    for mode, ranks in by_mode.items():
        decisions = [[s["actions"] for s in r["steps"]] for r in ranks]
        out["modes"][mode] = {
            "same_decisions": all(d == decisions[0] for d in decisions),
            "same_student": len({r["student_sha256"] for r in ranks}) == 1,
            "repairs": [r["repairs"] for r in ranks],
            "halted_step": [r["halted_step"] for r in ranks],
            "steps_run": [len(r["steps"]) for r in ranks],
            "step_s": step_times(ranks),
            "mean_loss": [mean_loss(r) for r in ranks],
        }
    out["agreed"] = all(m["same_decisions"] for m in out["modes"].values())
    if {"guard", "no_guard"} <= set(by_mode):
        g, b = out["modes"]["guard"]["step_s"], out["modes"]["no_guard"]["step_s"]
        out["step_time_ratio"] = {
            k: g[k] / b[k] if g[k] and b[k] else None for k in ("mean", "median")
        }
    return out


def report(args: argparse.Namespace, by_mode: dict[str, list[dict]], summary: dict) -> str:
    """Rank 0's table: per step, each rank's decision and step time; then the summary."""
    first = next(iter(by_mode.values()))
    region = (
        "a torch_memory_saver region"
        if all(r["torch_memory_saver"] for r in first)
        else "an emulated region (no torch_memory_saver)"
    )
    lines = [
        f"{len(first)} ranks, {args.backend} on {args.device}"
        f"{' (same GPU)' if args.same_gpu else ''}, V={args.vocab_size}, policy {args.policy}, "
        f"faulty rank {args.faulty_rank}, teacher weights in {region}"
    ]
    for mode, ranks in by_mode.items():
        s = summary["modes"][mode]
        lines += ["", f"[{mode}]", _table(ranks)]
        halted = sorted({h for h in s["halted_step"] if h is not None})
        lines += [
            f"same decision on every rank at every step: {'yes' if s['same_decisions'] else 'NO'}",
            f"student identical on every rank: {'yes' if s['same_student'] else 'NO'}",
            "repairs per rank: " + ", ".join(f"rank {i}: {n}" for i, n in enumerate(s["repairs"])),
            "mean loss per rank: "
            + ", ".join(f"rank {i}: {_num(x)}" for i, x in enumerate(s["mean_loss"])),
            f"halted: {'at step ' + str(halted) if halted else 'no'} "
            f"(steps run per rank: {s['steps_run']})",
            _times_line(s["step_s"]),
        ]
        if ranks[0]["halt_reason"]:
            lines.append(f"halt reason (rank 0): {ranks[0]['halt_reason']}")
    ratio = summary.get("step_time_ratio")
    if ratio and ratio["mean"]:
        g, b = summary["modes"]["guard"]["step_s"], summary["modes"]["no_guard"]["step_s"]
        lines += [
            "",
            f"step time with guard / without: mean {g['mean'] * 1e3:.1f} / {b['mean'] * 1e3:.1f} ms"
            f" = {ratio['mean']:.3f}; median {g['median'] * 1e3:.1f} / {b['median'] * 1e3:.1f} ms"
            f" = {ratio['median']:.3f}",
        ]
    return "\n".join(lines)


def _times_line(t: dict[str, float | None]) -> str:
    if t["mean"] is None:
        return "step time: - (no completed step)"
    line = f"step time (steps >= 1, all ranks): mean {t['mean'] * 1e3:.1f} ms, median "
    line += f"{t['median'] * 1e3:.1f} ms"
    if t["guard"]:
        line += f"; in the guard's hooks {t['guard'] * 1e3:.1f} ms ({t['guard'] / t['mean']:.1%}: "
        line += ", ".join(f"{h} {x * 1e3:.1f}" for h, x in t["hooks"].items()) + ")"
    return line


def _table(ranks: list[dict[str, Any]]) -> str:
    n = max(len(r["steps"]) for r in ranks)
    head = ["step"] + [f"rank {r['rank']} decision" for r in ranks]
    head += [f"rank {r['rank']} ms" for r in ranks]
    rows = [head]
    for i in range(n):
        steps = [r["steps"][i] if i < len(r["steps"]) else None for r in ranks]
        cells = [str(i)]
        cells += [_cell(s) for s in steps]
        cells += [f"{s['seconds'] * 1e3:.1f}" if s else "-" for s in steps]
        rows.append(cells)
    widths = [max(len(row[c]) for row in rows) for c in range(len(head))]
    return "\n".join(" | ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows)


def _cell(step: dict[str, Any] | None) -> str:
    if step is None:
        return "-"
    return step_decision(step) + (" (repaired here)" if step["repaired"] else "")


if __name__ == "__main__":
    sys.exit(main())
