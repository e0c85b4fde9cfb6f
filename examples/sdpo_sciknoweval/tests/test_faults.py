"""The faults' scoring paths on a fake teacher whose rows say which position they predict."""

import pytest
import torch

from distill_guard.teachers.base import ScoreResult
from examples.sdpo_sciknoweval.faults import FaultyScorer, check_fault


class PositionTeacher:
    """Row j of a sequence scored from ``start`` predicts position ``start + 1 + j``: every value
    in it is that position (token logprob) or position + tag (top-k), ids are the tokens there."""

    def __init__(self, tag: float = 0.0):
        self.tag = tag
        self.seen: list[list[int]] = []

    def score(self, sequences, *, top_k=0, logprob_start_len=0):
        self.seen += [list(s) for s in sequences]
        tok, lps, ids = [], [], []
        for s in sequences:
            pos = torch.arange(logprob_start_len + 1, len(s), dtype=torch.float32)
            tok.append(pos)
            lps.append((pos + self.tag)[:, None].expand(-1, top_k).clone())
            ids.append(torch.tensor(s[logprob_start_len + 1 :])[:, None].expand(-1, top_k).clone())
        return ScoreResult(tok, lps, ids)


SEQS = [[1, 10, 11, 12, 13, 2], [1, 20, 21, 22, 23, 24, 2], [1, 30, 31, 32, 2], [1, 40, 41, 2]]


def test_none_is_the_teacher_itself():
    teacher = PositionTeacher()
    r = FaultyScorer("none", teacher)(SEQS, 2, 2)
    assert teacher.seen == SEQS
    assert [t.tolist() for t in r.token_logprobs] == [list(range(3, len(s))) for s in SEQS]


def test_off_by_one_pairs_each_token_with_the_view_of_the_one_before():
    healthy = FaultyScorer("none", PositionTeacher())(SEQS, 2, 2)
    shifted = FaultyScorer("off_by_one", PositionTeacher())(SEQS, 2, 2)
    for h, s, hi, si in zip(
        healthy.token_logprobs, shifted.token_logprobs, healthy.topk_ids, shifted.topk_ids
    ):
        assert s.shape == h.shape and torch.equal(s[1:], h[:-1]) and s[0] == h[0] - 1
        assert torch.equal(si[1:], hi[:-1])  # ids, log-probs and token log-probs move together


def test_vocab_mismatch_permutes_the_tokenizer_ids_and_keeps_the_padding_ids():
    teacher = PositionTeacher()
    seqs = [[1, 5, 7, 650, 2]]
    FaultyScorer("vocab_mismatch", teacher, vocab_size=648, seed=0)(seqs, 2, 1)
    (seen,) = teacher.seen
    perm = torch.randperm(648, generator=torch.Generator().manual_seed(0)).tolist()
    assert seen == [perm[1], perm[5], perm[7], 650, perm[2]] and seen != seqs[0]


def test_partial_routes_every_fourth_sample_to_the_garbage_replica():
    teacher, replica = PositionTeacher(), PositionTeacher(tag=100.0)
    r = FaultyScorer("partial", teacher, replica=replica)(SEQS * 2, 2, 2)
    garbage = [i for i, lp in enumerate(r.topk_logprobs) if (lp >= 100).all()]
    assert garbage == [3, 7] and len(replica.seen) == 2 and len(teacher.seen) == 6
    assert [len(t) for t in r.token_logprobs] == [len(s) - 3 for s in SEQS * 2]  # in order


def test_unknown_faults_and_missing_parts_are_refused():
    with pytest.raises(ValueError, match="unknown fault"):
        check_fault("sideways")
    with pytest.raises(ValueError, match="vocab_size"):
        FaultyScorer("vocab_mismatch", PositionTeacher())
    with pytest.raises(ValueError, match="replica"):
        FaultyScorer("partial", PositionTeacher())
