"""TokenPairingCheck: scores that belong to other tokens, another vocabulary, another position."""

from __future__ import annotations

import pytest
import torch

from distill_guard.checks import TokenPairingCheck
from distill_guard.findings import Code, Severity
from distill_guard.observations import RunSpec, TeacherScores
from tests.checks._syncs import host_reads

V = 1000
G = torch.Generator().manual_seed(0)


def batch(samples=8, length=32, k=8, shift=0):
    """On-policy tokens and a teacher that ranks each position's sampled token among its top-k
    (most often first). ``shift`` moves the teacher's rows by one position within each sample,
    as a teacher written at response positions instead of prediction positions."""
    tokens = torch.randint(0, V, (samples, length), generator=G)
    ids = torch.randint(0, V, (samples, length, k), generator=G)
    first = torch.rand(samples, length, generator=G) < 0.7
    slot = torch.where(first, 0, torch.randint(1, k, (samples, length), generator=G))
    ids.scatter_(2, slot[..., None], tokens[..., None])
    if shift:
        ids = torch.roll(ids, shifts=shift, dims=1)
    sample = torch.arange(samples)[:, None].expand(samples, length)
    return tokens.reshape(-1), ids.reshape(-1, k), sample.reshape(-1)


SHARED = RunSpec(vocab_size=V)


def judge(scores, run=SHARED):
    return TokenPairingCheck().on_teacher_scores(scores, run)


def paired_scores() -> TeacherScores:
    """A paired batch with every view: tokens and their logprobs, top-k rows, ids, samples."""
    tokens, ids, sample = batch()
    top = -torch.rand(tokens.numel(), 8).sort(dim=1, descending=True).values
    return TeacherScores(
        0,
        token_logprobs=top[:, 0] - 0.5,
        topk_logprobs=top,
        topk_ids=ids,
        token_ids=tokens,
        sample_index=sample,
    )


def test_a_paired_batch_is_clean():
    scores = paired_scores()
    assert judge(scores, RunSpec(vocab_size=V, student_vocab_size=V)) == []


@pytest.mark.parametrize("shift", [1, -1])
def test_logprobs_shifted_by_one_position_are_caught(shift):
    tokens, ids, sample = batch(shift=shift)
    (f,) = judge(TeacherScores(3, topk_ids=ids, token_ids=tokens, sample_index=sample))
    assert f.code == Code.TEACHER_POSITION_SHIFT and f.severity is Severity.CRITICAL
    assert f.values["shifted_agreement"] > 0.6 > 0.2 > f.values["own_agreement"]
    assert f.values["lag"] == ("+1" if shift == 1 else "-1")


def test_a_teacher_ranking_ids_beyond_the_students_vocabulary_is_caught():
    """Qwen2.5-7B's 152064 rows against a 151936-id student: padded ids the student lacks."""
    tokens, ids, _ = batch()
    ids[::4, 0] = V + 64  # a quarter of the rows rank an id the student does not have first
    run = RunSpec(vocab_size=V + 128, student_vocab_size=V)
    (f,) = judge(TeacherScores(0, topk_ids=ids, token_ids=tokens), run)
    assert f.code == Code.TEACHER_VOCAB_MISMATCH
    assert f.values["foreign_top1_fraction"] == pytest.approx(0.25)
    assert judge(TeacherScores(0, topk_ids=ids), RunSpec(vocab_size=V + 128)) == []  # V unknown


def test_a_teacher_reading_another_tokenizers_ids_disagrees_with_every_token():
    n = 256
    top = torch.sort(-torch.rand(n, 8) * 2, dim=1, descending=True).values
    mismatched = top[:, 0] - 6 - torch.rand(n) * 4  # the student's token far below first choice
    (f,) = judge(TeacherScores(1, token_logprobs=mismatched, topk_logprobs=top))
    assert f.code == Code.TEACHER_TOKENS_MISMATCH and f.values["median_gap"] >= 5
    matched = top[:, 0] - torch.rand(n) * 2
    assert judge(TeacherScores(1, token_logprobs=matched, topk_logprobs=top)) == []


def test_the_mask_is_applied_to_ids_and_tokens():
    tokens, ids, sample = batch(shift=1)
    mask = torch.zeros(tokens.numel(), dtype=torch.bool)
    scores = TeacherScores(0, topk_ids=ids, token_ids=tokens, sample_index=sample, mask=mask)
    assert judge(scores) == []  # nothing kept, nothing judged


def test_a_handful_of_answer_tokens_in_every_top_k_does_not_hide_a_shift():
    """The SDPO miniature's answers use ~8 tokens, all of them in every top-16: membership gave
    0.99 own against 0.98 shifted; the first choice gives 0.004 against 0.77."""
    length, k = 32, 16
    answer = torch.arange(8)
    tokens = answer[torch.randint(0, 8, (8, length), generator=G)]
    ids = torch.cat([answer.expand(8, length, 8), torch.randint(8, V, (8, length, k - 8))], -1)
    ids = ids.clone()
    ids[..., 0], ids[..., 1:8] = tokens, answer[1:].expand(8, length, 7)  # first choice: the token
    sample = torch.arange(8)[:, None].expand(8, length).reshape(-1)
    paired = TeacherScores(
        0, topk_ids=ids.reshape(-1, k), token_ids=tokens.reshape(-1), sample_index=sample
    )
    assert judge(paired) == []
    shifted = torch.roll(ids, shifts=1, dims=1).reshape(-1, k)
    (f,) = judge(
        TeacherScores(0, topk_ids=shifted, token_ids=tokens.reshape(-1), sample_index=sample)
    )
    assert f.code == Code.TEACHER_POSITION_SHIFT


def test_a_paired_step_reads_the_host_once():
    """The vocabulary, position and tokens tests read their counts in one host transfer (on a
    GPU each further read is a round trip on the guard's per-step path)."""
    scores = paired_scores()
    with host_reads() as reads:
        assert judge(scores, RunSpec(vocab_size=V, student_vocab_size=V)) == []
    assert len(reads) <= 1, reads
