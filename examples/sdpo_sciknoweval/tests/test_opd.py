import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from examples.sdpo_sciknoweval.data import build_dataset
from examples.sdpo_sciknoweval.models import ModelSize, build_model
from examples.sdpo_sciknoweval.opd import (
    Rollout,
    evaluate,
    jsd_topk_tail_loss,
    prompt_ids,
    response_logits,
    sample_responses,
    student_stats,
)
from examples.sdpo_sciknoweval.tokenizer import build_tokenizer
from tests._reference import binary_entropy64

SETTINGS = settings(max_examples=60, deadline=None)


def random_case(seed: int, n: int, vocab: int, k: int, scale: float):
    """Student logits [n, V], teacher top-k ids [n, K] and their teacher log-probs."""
    gen = torch.Generator().manual_seed(seed)
    student = torch.randn(n, vocab, generator=gen) * scale
    teacher = torch.log_softmax(torch.randn(n, vocab, generator=gen) * scale, dim=-1)
    values, ids = teacher.topk(k, dim=-1)
    return student, ids, values


@SETTINGS
@given(
    seed=st.integers(0, 2**31),
    vocab=st.integers(2, 300),
    k=st.integers(1, 16),
    scale=st.floats(0.0, 30.0),
    beta=st.floats(0.01, 0.99),
)
def test_jsd_lies_between_zero_and_the_binary_entropy64(seed, vocab, k, scale, beta):
    student, ids, values = random_case(seed, 8, vocab, min(k, vocab), scale)
    per_token, mean = jsd_topk_tail_loss(student, ids, values, beta)
    assert per_token.dtype == torch.float32 and torch.isfinite(per_token).all()
    assert (per_token >= -1e-6).all()
    assert (per_token <= binary_entropy64(beta) + 1e-5).all()
    assert mean == pytest.approx(per_token.mean().item(), abs=1e-6)


@SETTINGS
@given(seed=st.integers(0, 2**31), vocab=st.integers(2, 300), scale=st.floats(0.0, 30.0))
def test_jsd_is_zero_when_the_distributions_match(seed, vocab, scale):
    student, _, _ = random_case(seed, 8, vocab, 1, scale)
    ids = student.topk(min(16, vocab), dim=-1).indices
    same = torch.log_softmax(student, dim=-1).gather(-1, ids)
    per_token, _ = jsd_topk_tail_loss(student, ids, same, 0.5)
    assert per_token.abs().max() < 1e-5


@SETTINGS
@given(seed=st.integers(0, 2**31), peak=st.floats(30.0, 80.0), position=st.integers(0, 151935))
def test_uniform_teacher_against_peaked_student_sits_at_ln2(seed, peak, position):
    vocab = 151936
    student = torch.randn(2, vocab, generator=torch.Generator().manual_seed(seed))
    student[:, position] = peak
    ids = student.topk(16, dim=-1).indices  # the recipe's student_topk selection
    uniform = torch.full((2, 16), -math.log(vocab))
    per_token, _ = jsd_topk_tail_loss(student, ids, uniform, 0.5)
    assert per_token.sub(math.log(2)).abs().max() < 0.01


@SETTINGS
@given(
    seed=st.integers(0, 2**31),
    vocab=st.integers(2, 300),
    k=st.integers(1, 16),
    scale=st.floats(0.0, 30.0),
    beta=st.floats(0.01, 0.99),
)
def test_the_fused_loss_is_the_tail_jsd_value_and_gradient64(seed, vocab, k, scale, beta):
    """The demo's loss runs through distill_guard.losses.distill_loss: the same number and the
    same gradient as the K+1-bin JSD written out in float64."""
    student, ids, values = random_case(seed, 8, vocab, min(k, vocab), scale)
    student = student.double().requires_grad_(True)
    per_token, mean = jsd_topk_tail_loss(student.float(), ids, values, beta)
    mean.backward()
    fused_grad = student.grad.clone()
    student.grad = None

    def bins(logp: torch.Tensor) -> torch.Tensor:
        mass = logp.exp().sum(-1, keepdim=True).clamp(max=1.0 - 1e-6)
        return torch.cat([logp, torch.log1p(-mass)], dim=-1)

    s = bins(torch.log_softmax(student, dim=-1).gather(-1, ids))
    t = bins(values.double())
    m = torch.logaddexp(s + math.log(1.0 - beta), t + math.log(beta))
    ref = (1.0 - beta) * (s.exp() * (s - m)).sum(-1) + beta * (t.exp() * (t - m)).sum(-1)
    ref.mean().backward()
    assert torch.allclose(per_token.double(), ref.detach(), atol=2e-5)
    assert torch.allclose(fused_grad, student.grad, atol=2e-5)


def test_masked_mean_ignores_masked_tokens_and_beta_must_be_inside():
    student, ids, values = random_case(0, 6, 50, 4, 3.0)
    mask = torch.tensor([True, False, True, False, False, True])
    per_token, mean = jsd_topk_tail_loss(student, ids, values, 0.5, mask)
    assert mean.item() == pytest.approx(per_token[mask].mean().item(), abs=1e-6)
    with pytest.raises(ValueError):
        jsd_topk_tail_loss(student, ids, values, 1.0)


def test_student_stats_read_entropy_and_eos_from_the_package_signals():
    logits = torch.zeros(2, 3, 1000)  # uniform student: entropy ln V, p(EOS) = 1/V everywhere
    mask = torch.tensor([[True, True, False], [True, False, False]])
    rollout = Rollout(responses=[[1, 2], [3]], truncated=[False, True])
    stats = student_stats(logits, mask, rollout, eos_id=7)
    assert stats["student_entropy"] == pytest.approx(math.log(1000), abs=1e-4)
    assert stats["eos_prob"] == pytest.approx(1 / 1000, rel=1e-4)
    assert stats["truncated_ratio"] == 0.5


@pytest.fixture(scope="module")
def tiny():
    tok = build_tokenizer()
    size = ModelSize(hidden_size=32, num_layers=1, intermediate_size=64, vocab_multiple=1024)
    return tok, build_model(size, tok, seed=0), build_dataset()[1][:6]


def test_batched_sampling_matches_one_at_a_time_and_tracks_truncation(tiny):
    tok, model, items = tiny
    prompts = prompt_ids(items, tok)
    batched = sample_responses(model, prompts, max_new_tokens=4, temperature=0.0)
    for prompt, response in zip(prompts, batched.responses):
        assert sample_responses(model, [prompt], 4, temperature=0.0).responses[0] == response
    for response, truncated in zip(batched.responses, batched.truncated):
        assert 1 <= len(response) <= 4 and tok.eos_id not in response[:-1]
        assert truncated == (response[-1] != tok.eos_id)
    gen = torch.Generator().manual_seed(0)
    sampled = sample_responses(model, prompts, 4, 1.0, gen)
    gen = torch.Generator().manual_seed(0)
    assert sample_responses(model, prompts, 4, 1.0, gen) == sampled


def test_response_logits_match_a_plain_forward(tiny):
    tok, model, items = tiny
    prompts = prompt_ids(items[:3], tok)
    responses = [[5, 6], [7], [8, 9, tok.eos_id]]
    logits, mask = response_logits(model, prompts, responses)
    assert mask.tolist() == [[True, True, False], [True, False, False], [True, True, True]]
    for b, (p, r) in enumerate(zip(prompts, responses)):
        full = model(input_ids=torch.tensor([p + r])).logits[0, len(p) - 1 : len(p) - 1 + len(r)]
        assert torch.allclose(logits[b, : len(r)], full, atol=1e-5)


def test_evaluate_is_a_fraction(tiny):
    tok, model, items = tiny
    assert 0.0 <= evaluate(model, items, tok, max_new_tokens=3) <= 1.0
