"""TorchTeacher in a real torch_memory_saver region on CUDA, V = 151936 (docs/invariants.md §1.2).

Without backup a real pause/resume must leave the teacher uniform and the canary must say so;
the repair reloads in place and the canary passes again. With backup, five cycles are bit-exact.
"""

from __future__ import annotations

import gc
import math

import pytest
import torch

from distill_guard import Action, DistillGuard
from distill_guard.findings import Code
from distill_guard.live.canary import Canary
from distill_guard.live.repair import repair_teacher
from distill_guard.teachers import TorchTeacher
from distill_guard.testing.tiny import QWEN3_VOCAB


@pytest.fixture
def teacher_factory(qwen_vocab_dir):
    made = []

    def make(backup: bool) -> TorchTeacher:
        t = TorchTeacher.from_pretrained(
            qwen_vocab_dir, device="cuda", dtype=torch.bfloat16, enable_cpu_backup=backup
        )
        made.append(t)
        return t

    yield make
    made.clear()
    gc.collect()
    torch.cuda.empty_cache()


def test_no_backup_wakes_uniform_and_the_repair_brings_it_back_in_place(teacher_factory):
    t = teacher_factory(backup=False)
    assert t.uses_torch_memory_saver
    canary = Canary(deterministic=True)
    reference = canary.fingerprint(t)
    ptrs = {n: p.data_ptr() for n, p in t.model.named_parameters()}
    free_before = torch.cuda.mem_get_info()[0]
    t.release()
    assert torch.cuda.mem_get_info()[0] > free_before  # the region's pages were given back
    t.resume()
    # what docs/invariants.md §1.2 records: every weight exactly zero, buffers restored SGLang-style
    assert all(float(p.abs().max()) == 0.0 for p in t.model.parameters())
    assert float(t.model.model.rotary_emb.inv_freq.abs().max()) > 0
    findings = canary.verify(t)
    assert [f.code for f in findings] == [Code.TEACHER_UNIFORM]
    comp = canary.last_comparison
    assert comp.uniform and comp.top1_logprob == pytest.approx(-math.log(QWEN3_VOCAB), abs=1e-3)
    print(
        f"\nno backup: top-1 logprob after wake {comp.top1_logprob:.4f} (−ln V = "
        f"{-math.log(QWEN3_VOCAB):.4f}), max |Δ| {comp.max_abs_delta:.3f}"
    )

    outcome = repair_teacher(t, canary, backoff_s=0.1)
    assert outcome.ok, outcome.findings
    assert {n: p.data_ptr() for n, p in t.model.named_parameters()} == ptrs  # in place
    assert canary.verify(t) == [] and canary.last_comparison.max_abs_delta == 0.0
    assert canary.measure(t).token_logprobs == reference.token_logprobs
    print(
        f"repair: {outcome.attempts} attempt(s), {outcome.seconds * 1e3:.1f} ms, canary exact again"
    )


def test_backup_passes_five_cycles_bit_exactly(teacher_factory):
    t = teacher_factory(backup=True)
    canary = Canary(deterministic=True)
    first = canary.fingerprint(t)
    for _ in range(5):
        t.release()
        t.resume()
        assert canary.verify(t) == []
        assert canary.last_comparison.max_abs_delta == 0.0
        canary.fingerprint(t)
    assert canary.measure(t).token_logprobs == first.token_logprobs


def test_guard_repairs_the_real_region_at_every_wake(teacher_factory, tmp_path):
    t = teacher_factory(backup=False)
    guard = DistillGuard(
        teacher=t,
        canary=Canary(deterministic=True),
        repair_backoff_s=0.1,
        events=tmp_path / "events.jsonl",
    )
    for step in range(3):
        guard.sleep(step)
        decision = guard.wake(step)
        assert decision.action is Action.REWAKE and decision.repaired
    assert guard.repairs == 3 and not guard.halted
    assert guard.summary.first[Code.TEACHER_UNIFORM] == 0
