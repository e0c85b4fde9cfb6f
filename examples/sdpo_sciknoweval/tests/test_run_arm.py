import math

import pytest
import torch

from examples.sdpo_sciknoweval.data import build_dataset
from examples.sdpo_sciknoweval.models import ModelSize, build_model
from examples.sdpo_sciknoweval.run_arm import ArmConfig, HFTeacherScorer, run_arm, zero_weights
from examples.sdpo_sciknoweval.tokenizer import build_tokenizer

TINY = ModelSize(hidden_size=32, num_layers=1, intermediate_size=64, vocab_multiple=1024)


@pytest.fixture()
def setup():
    tok = build_tokenizer()
    train, eval_items = build_dataset()
    return tok, train[:32], eval_items[:8]


def test_scorer_rows_follow_sglang_and_zeroing_makes_the_teacher_uniform(setup):
    tok, train, _ = setup
    teacher = build_model(TINY, tok, seed=1)
    seqs = [tok.encode(item.prompt + item.target, add_bos=True) for item in train[:3]]
    start = min(len(s) for s in seqs) - 4
    ids, lps = HFTeacherScorer(teacher)(seqs, 16, start)
    assert [t.shape for t in ids] == [(len(s) - start - 1, 16) for s in seqs]
    assert (lps[0][:, :-1] >= lps[0][:, 1:]).all()
    zero_weights(teacher)
    assert all(b.abs().sum() == 0 for b in teacher.buffers())
    _, lps = HFTeacherScorer(teacher)(seqs, 16, start)
    assert torch.allclose(torch.cat(lps), torch.tensor(-math.log(1024)))


@pytest.mark.parametrize("selection", ["student_topk", "teacher_topk"])
@pytest.mark.parametrize("corrupt", [False, True])
def test_three_step_smoke(setup, selection, corrupt):
    tok, train, eval_items = setup
    teacher, student = build_model(TINY, tok, seed=1), build_model(TINY, tok, seed=2)
    cfg = ArmConfig(
        steps=3, batch_size=4, max_new_tokens=4, eval_every=2, token_selection=selection, threads=1
    )
    before = [p.clone() for p in student.parameters()]
    wake = (lambda step: zero_weights(teacher)) if corrupt else None
    seen = []
    records = run_arm(
        student, tok, train, eval_items, HFTeacherScorer(teacher), cfg, wake, seen.append
    )
    assert records == seen and [r["step"] for r in records] == [0, 1, 2, 3]
    assert [("eval_accuracy" in r) for r in records] == [True, False, True, True]
    for r in records[:3]:
        assert 0.0 <= r["loss"] <= math.log(2) + 1e-5
        assert 0.0 <= r["truncated_ratio"] <= 1.0 and 0.0 <= r["eos_prob"] <= 1.0
        assert r["student_entropy"] > 0 and math.isfinite(r["teacher_logprob"])
    if corrupt:
        assert records[0]["teacher_logprob"] == pytest.approx(-math.log(1024), abs=1e-4)
    assert any(not torch.equal(a, b) for a, b in zip(before, student.parameters()))
