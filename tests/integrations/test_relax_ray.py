"""Relax's verdict across nodes that share no file system: one real Ray cluster, started here.

The rollout process and the two trainer ranks are Ray actors, as in Relax, each with its own
event directory (three "nodes", no directory in common). The trainer ranks are a real gloo
group. They find the rollout side's verdicts through the run's named Ray actor, and train or
halt at the same step; what each rank did is measured on its own model.
"""

from __future__ import annotations

import math
import os
from argparse import Namespace
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray")

from distill_guard.testing.servers import free_port  # noqa: E402

from . import relax_harness as harness  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
UNIFORM = -math.log(harness.VOCAB)
SETTINGS = {
    "DISTILL_GUARD_OVERRIDES": f"run.vocab_size={harness.VOCAB} alerts.use_wandb=false",
    "DISTILL_GUARD_GATES": "filter,train_step,log",
    "DISTILL_GUARD_TEACHER_URL": "none",
    "DISTILL_GUARD_SAVE_FUNCTION": "tests.integrations.test_relax_ray:save",
    "DISTILL_GUARD_VERDICT_WAIT_S": "60",
}


def relax_args() -> Namespace:
    return harness.relax_args("studio", ("filter", "train_step", "log"), "none")


def save(args, rollout_id, model, optimizer, scheduler) -> None:
    """The run's checkpoint (``DISTILL_GUARD_SAVE_FUNCTION``), on this rank's own node."""
    path = Path(os.environ["DISTILL_GUARD_EVENTS"]).with_name(f"halt-{rollout_id}.pt")
    torch.save(model[0].state_dict(), path)


@ray.remote(num_cpus=0)
class RolloutNode:
    """Relax's rollout process: the filter per group, then the log hook."""

    def __init__(self, events: str) -> None:
        os.environ.update(SETTINGS, DISTILL_GUARD_EVENTS=events)
        from distill_guard.integrations import relax

        self.relax = relax

    def rollout(self, rollout_id: int, dead: bool) -> float:
        value = UNIFORM if dead else -1.5
        group = [
            harness.Sample(
                [1] * 16, 10, index=i, loss_mask=[1] * 10, teacher_log_probs=[value] * 10
            )
            for i in range(4)
        ]
        self.relax.dynamic_sampling_filter(relax_args(), group)
        metrics: dict[str, float] = {}
        self.relax.rollout_log_function(rollout_id, relax_args(), group, metrics, 1.0)
        return metrics["guard/verdict"]

    def channel(self) -> str:
        return self.relax.state().board.where


@ray.remote(num_cpus=0)
class TrainerNode:
    """One trainer rank: ``zero_grad``, the before-train-step hook, backward, ``step``."""

    def __init__(self, rank: int, port: int, events: str) -> None:
        os.environ.update(SETTINGS, DISTILL_GUARD_EVENTS=events)
        torch.set_num_threads(1)
        torch.distributed.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2
        )
        torch.manual_seed(0)
        self.model = torch.nn.Linear(4, 4)
        self.optimizer = harness.MegatronLikeOptimizer(list(self.model.parameters()))
        self.scheduler = harness.Scheduler()

    def train(self, rollout_id: int) -> str:
        from distill_guard.integrations import relax

        before = self.model.weight.detach().clone()
        self.optimizer.zero_grad()
        try:
            relax.before_train_step_hook(
                relax_args(), rollout_id, 0, [self.model], self.optimizer, self.scheduler
            )
        except relax.GuardHalt as halt:
            return f"halted: {halt}"
        self.model(torch.ones(1, 4)).sum().backward()
        self.optimizer.step()
        return "trained" if not torch.equal(before, self.model.weight) else "no update"


@pytest.fixture(scope="module")
def cluster():
    """A local cluster whose workers import this checkout: the raylet's environment carries
    ``PYTHONPATH``, so the workers it starts ahead (one per CPU) can host the actors (a
    ``runtime_env`` would make every actor wait for a worker of its own)."""
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), saved]))
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    finally:
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved
    yield
    ray.shutdown()


@pytest.mark.timeout(120)
def test_trainer_ranks_on_other_nodes_read_the_verdict_through_ray_and_halt_together(
    cluster, tmp_path
):
    nodes = [tmp_path / name for name in ("rollout-node", "trainer-node-0", "trainer-node-1")]
    for n in nodes:
        n.mkdir()
    rollout = RolloutNode.remote(str(nodes[0] / "events.jsonl"))
    port = free_port()
    ranks = [TrainerNode.remote(r, port, str(nodes[1 + r] / "events.jsonl")) for r in range(2)]

    assert ray.get(rollout.rollout.remote(0, dead=False)) == 0.0  # train
    assert ray.get([r.train.remote(0) for r in ranks]) == ["trained", "trained"]
    assert ray.get(rollout.rollout.remote(1, dead=True)) == 2.0  # halt (the default policy)
    halted = ray.get([r.train.remote(1) for r in ranks])
    assert all(
        h.startswith("halted: distill_guard halted the run before training rollout 1")
        for h in halted
    ), halted
    assert "--teacher-sglang-enable-weights-cpu-backup" in halted[0]
    # each rank checkpointed on its own node; no node ever had the rollout side's files
    assert [(n / "halt-1.pt").exists() for n in nodes] == [False, True, True]
    assert not list(nodes[1].glob("*.verdicts")) and not list(nodes[2].glob("*.verdicts"))
    assert ray.get(rollout.channel.remote()).startswith("Ray actor 'distill_guard.verdicts.")


@pytest.mark.timeout(120)
def test_without_the_rollout_side_the_trainer_finds_no_channel_and_halts(cluster, tmp_path):
    os.environ["DISTILL_GUARD_RUN_ID"] = "never-announced"
    try:
        from distill_guard.integrations.relax.ray_board import RayBoard

        board = RayBoard("never-announced", find_timeout_s=0.5)
        got = board.wait(0, 0.5)
    finally:
        del os.environ["DISTILL_GUARD_RUN_ID"]
    assert got.value is None and "namespace 'distill_guard'" in got.where
