"""Issue 29's acceptance run: four reference replicas behind the real ``sglang-router``, one
waking with zeroed weights at seeded random steps, another whose weights turn to garbage once
after its wake was verified (found only by the canary after scoring); a small torch student
trained on the scored samples with the receipts' gate before each optimizer step.

Every sample is also scored by the checkpoint itself, in the test, so "poisoned" is the truth,
not the guard's word: a sample whose teacher logprobs are not the checkpoint's. Counted: updates
that used a poisoned sample (0), healthy samples refused or held (0); each broken replica out of
the router within its step and back after a verified repair; never a halt while at least
``min_healthy_replicas`` serve.
"""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest
import torch

from distill_guard.checks.canary import CanaryCheck
from distill_guard.findings import Code
from distill_guard.live.replicas import Move, ReplicaState, ReplicatedTeacher, metric_id
from distill_guard.live.teacher_reference import reference_from_checkpoint
from distill_guard.policy import Action
from distill_guard.teachers.replicas import make_replicas
from distill_guard.teachers.sglang_router import SGLangRouter
from distill_guard.testing.router import reference_replicas, sglang_router
from distill_guard.testing.tiny import build_tiny_qwen3

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("sglang_router") is None,
    reason="needs sglang-router: pip install 'distill_guard[router]'",
)

CHECK = CanaryCheck(length=16, top_k=4)
VOCAB, SEQ, BATCH = 512, 8, 8
ZEROED, GARBAGE = 1, 2
"""The replica that wakes zeroed at random steps; the one whose weights turn to garbage once."""


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return build_tiny_qwen3(tmp_path_factory.mktemp("acceptance_tiny"), vocab_size=VOCAB)


@pytest.fixture(scope="module")
def reference(tiny_dir):
    return reference_from_checkpoint(tiny_dir, CHECK)


class Student(torch.nn.Module):
    """A bigram student: the next token's logprobs from the current one."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, 16)
        self.out = torch.nn.Linear(16, VOCAB)

    def token_logprobs(self, seqs: torch.Tensor) -> torch.Tensor:
        logp = self.out(self.emb(seqs[:, :-1])).log_softmax(-1)
        return logp.gather(-1, seqs[:, 1:, None])[..., 0]


def _truth(tiny_dir: Path):
    """The checkpoint's own logprobs of a sequence's tokens (what a healthy replica scores)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_dir)).eval()

    def score(seq: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            logits = model(torch.tensor([seq])).logits[0, :-1].float()
        return logits.log_softmax(-1).gather(-1, torch.tensor(seq[1:])[:, None])[:, 0]

    return score


def _run(tiny_dir, reference, steps: int, seed: int) -> None:
    rng = random.Random(seed)
    zeroed_at = set(rng.sample(range(steps), max(2, steps // 4)))
    garbage_at = rng.randrange(steps)
    truth = _truth(tiny_dir)
    torch.manual_seed(seed)
    student = Student()
    opt = torch.optim.SGD(student.parameters(), lr=0.5)
    poisoned_updates = healthy_dropped = refused_poisoned = updates = 0
    alerts: list[str] = []
    with (
        reference_replicas(tiny_dir, [True] * 4) as replicas,
        sglang_router([r.url for r in replicas]) as url,
        SGLangRouter(url) as router,
    ):
        out_of_router: list[str] = []

        def on_event(kind: str, payload: dict) -> None:
            if kind == "replica.quarantined":  # out before its repair: the router lists it not
                assert router.worker(payload["url"]) is None
                out_of_router.append(payload["url"])

        teacher = ReplicatedTeacher(
            make_replicas([r.url for r in replicas]),
            reference,
            router=router,
            min_healthy_replicas=3,
            canary=CHECK,
            repair_backoff_s=0.01,
            on_event=on_event,
        )
        for step in range(steps):
            replicas[ZEROED].next_wakes(backup=step not in zeroed_at)
            teacher.sleep(step)
            woke = teacher.wake(step)
            assert woke.decision.action is not Action.HALT
            alerts += [r.url for r in woke.replicas if r.alert is not None]
            moved = {r.url: r.moves for r in woke.replicas}
            if step in zeroed_at:  # quarantined at the wake of its step, back once verified
                assert moved[replicas[ZEROED].url] == [Move.QUARANTINE, Move.REPAIR, Move.READMIT]
                codes = [f.code for f in woke.replicas[ZEROED].findings]
                assert codes.index(Code.TEACHER_REPAIRED) < codes.index(
                    Code.TEACHER_REPLICA_READMITTED
                )
            assert all(not m for u, m in moved.items() if u != replicas[ZEROED].url)
            if step == garbage_at:  # a bad push after its wake was verified
                replicas[GARBAGE].corrupt(seed=step)

            seqs = [[rng.randrange(1, VOCAB) for _ in range(SEQ)] for _ in range(BATCH)]
            scored = [teacher.score([s]) for s in seqs]
            late = teacher.recheck(step)  # the canary after scoring, before the optimizer
            assert late.decision.action is not Action.HALT
            alerts += [r.url for r in late.replicas if r.alert is not None]
            if step == garbage_at:  # found late, out and back within its own step
                bad = late.replicas[GARBAGE]
                assert bad.moves == [Move.QUARANTINE, Move.REPAIR, Move.READMIT]
            else:
                assert all(not r.moves for r in late.replicas)
            assert set(teacher.serving) == {r.url for r in replicas}
            assert {w.url for w in router.workers()} == {r.url for r in replicas}

            passed = teacher.gate([receipt for _, receipt in scored])
            assert not passed.hold
            poisoned = [
                not torch.allclose(result.token_logprobs[0], truth(s), atol=1e-4)
                for s, (result, _) in zip(seqs, scored)
            ]
            assert sum(poisoned) == (BATCH // 4 if step == garbage_at else 0)
            healthy_dropped += sum(not poisoned[i] for i in passed.refuse)
            refused_poisoned += sum(poisoned[i] for i in passed.refuse)
            if passed.admit:
                batch = torch.tensor([seqs[i] for i in passed.admit])
                target = torch.stack([scored[i][0].token_logprobs[0] for i in passed.admit])
                loss = (student.token_logprobs(batch) - target).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                updates += 1
                poisoned_updates += any(poisoned[i] for i in passed.admit)
        assert all(r.server.dead_reason is None for r in replicas)
        metrics = teacher.metrics()
    for r in replicas:  # one alert per incident per replica
        incidents = metrics[f"guard/replica/{metric_id(r.url)}/incidents"]
        assert alerts.count(r.url) == incidents
    assert metrics["guard/replicas_healthy"] == 4.0
    assert metrics[f"guard/replica/{metric_id(replicas[ZEROED].url)}/failed_wakes"] == len(
        zeroed_at
    )
    assert poisoned_updates == 0 and healthy_dropped == 0
    assert refused_poisoned == BATCH // 4  # the garbage replica's samples of its step, all
    assert updates == steps
    assert out_of_router.count(replicas[ZEROED].url) == len(zeroed_at)
    assert out_of_router.count(replicas[GARBAGE].url) == 1
    assert all(torch.isfinite(p).all() for p in student.parameters())
    assert all(s is ReplicaState.SERVING for s in teacher.states.values())


def test_four_replicas_behind_the_router_no_poisoned_update_no_healthy_sample_dropped(
    tiny_dir, reference
) -> None:
    _run(tiny_dir, reference, steps=6, seed=29)


@pytest.mark.slow
def test_soak_four_replicas_behind_the_router(tiny_dir, reference) -> None:
    _run(tiny_dir, reference, steps=24, seed=2029)
