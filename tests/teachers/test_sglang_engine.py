"""SGLangEngineTeacher against an object with sglang.Engine's signatures and return shapes."""

from __future__ import annotations

import math
import sys

import pytest
import torch

from distill_guard.extras import MissingExtra
from distill_guard.teachers import (
    SGLangEngineTeacher,
    TeacherError,
    TeacherStateError,
    TorchTeacher,
)
from distill_guard.testing.engine_standin import EngineStandIn, ProcessKilled


@pytest.fixture
def engine(tiny_dir) -> EngineStandIn:
    return EngineStandIn(TorchTeacher.from_pretrained(tiny_dir))


def test_scores_through_the_engine_match_the_torch_teacher(engine, tiny_dir) -> None:
    seqs = [list(range(3, 30)), [4, 4, 4, 4, 8]]
    direct = TorchTeacher.from_pretrained(tiny_dir).score(seqs, top_k=3, logprob_start_len=1)
    t = SGLangEngineTeacher(engine)
    res = t.score(seqs, top_k=3, logprob_start_len=1)
    for a, b in zip(
        res.token_logprobs + res.topk_logprobs, direct.token_logprobs + direct.topk_logprobs
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert t.vocab_size == 512
    assert "sglang" not in sys.modules  # imported lazily, never here


def test_given_token_ids_are_scored_through_the_engine_as_in_process(engine, tiny_dir) -> None:
    seqs, ids = [list(range(3, 20)), [5, 9, 2, 41]], [[7, 3, 7], [0, 511]]
    want = TorchTeacher.from_pretrained(tiny_dir).score_token_ids(seqs, ids, logprob_start_len=1)
    got = SGLangEngineTeacher(engine).score_token_ids(seqs, ids, logprob_start_len=1)
    for a, b in zip(got.token_ids_logprobs, want.token_ids_logprobs):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    with pytest.raises(TeacherError, match=r"in \[0, 512\)"):  # the engine's own refusal
        SGLangEngineTeacher(engine)._score_token_ids(seqs[:1], [[512]], 0)


def test_sleep_wake_reload_flush_through_the_engine(engine) -> None:
    t = SGLangEngineTeacher(engine)
    before = t.score([list(range(3, 30))]).token_logprobs[0]
    t.release(["weights", "kv_cache"])
    with pytest.raises(TeacherStateError):
        t.release(["weights"])
    t.resume()
    woke = t.score([list(range(3, 30))]).token_logprobs[0]
    assert float((woke + math.log(512)).abs().max()) < 1e-5
    t.reload_weights()
    t.flush_cache()
    assert torch.equal(t.score([list(range(3, 30))]).token_logprobs[0], before)
    assert [c[0] for c in engine.calls if c[0] != "generate"] == [
        "release", "resume", "update_weights_from_disk", "flush_cache"]  # fmt: skip
    assert engine.calls[1] == ("release", ["weights", "kv_cache"])
    assert engine.calls[2] == ("resume", ["weights", "kv_cache"])


def test_engine_failures_become_teacher_errors(engine) -> None:
    t = SGLangEngineTeacher(engine)
    with pytest.raises(TeacherError, match="update_weights_from_disk failed"):
        t.reload_weights("/nonexistent")
    with pytest.raises(ProcessKilled):  # bypassing the tracker: in process, this is fatal
        t._resume(("weights",))


def test_a_teacher_the_host_released_is_never_scored_or_resumed_on_a_guess(engine) -> None:
    from distill_guard.findings import Code
    from distill_guard.live.canary import Canary
    from distill_guard.live.colocate import ColocatedTeacher

    t = SGLangEngineTeacher(engine)
    colocated = ColocatedTeacher(t, Canary(length=16))
    colocated.sleep(0, release=lambda: engine.release_memory_occupation(None))  # the host's own
    sent = len(engine.calls)
    found = colocated.wake(1)  # and no resume=: asleep or woken by the host, nobody says
    assert [f.code for f in found] == [Code.TEACHER_STATE_UNKNOWN]
    assert "no resume=" in found[0].message
    assert engine.calls[sent:] == []  # nothing sent: no generate, no resume
    assert colocated.repair(1, found)[0].ok is False and engine.calls[sent:] == []
    with pytest.raises(ProcessKilled):  # what the old "is it awake?" scoring call did here
        engine.generate(
            input_ids=[[0, 0]],
            sampling_params={"max_new_tokens": 0},
            return_logprob=True,
            logprob_start_len=0,
        )
    engine.resume_memory_occupation(None)
    t.mark_resumed()  # the host says it woke it: the guard checks it again
    assert Code.TEACHER_STATE_UNKNOWN not in {f.code for f in colocated.wake(2)}


def test_launch_without_sglang_says_what_to_install() -> None:
    if "sglang" in sys.modules or _has_sglang():
        pytest.skip("sglang is installed")
    with pytest.raises(MissingExtra, match=r"needs sglang.*pip install 'distill_guard\[sglang\]'"):
        SGLangEngineTeacher.launch(model_path="/m")


def _has_sglang() -> bool:
    import importlib.util

    return importlib.util.find_spec("sglang") is not None
