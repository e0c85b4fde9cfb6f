"""Canary: catches a teacher that woke uniform or with garbage, and nothing healthy."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from distill_guard.findings import Code, Severity
from distill_guard.live.canary import Canary, teacher_error_finding
from distill_guard.teachers import ScoreResult, SGLangHTTPTeacher, TeacherUnreachable, TorchTeacher
from distill_guard.testing.servers import reference_teacher
from distill_guard.testing.tiny import build_tiny_qwen3


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_qwen3(tmp_path_factory.mktemp("canary_tiny"), vocab_size=512)


class FakeTeacher:
    """Returns canned logprobs: for the judgement alone, without a model."""

    def __init__(self, token: float | list[float], top: list[list[float]] | None, *,
                 vocab: int | None = 1000, info: dict[str, Any] | None = None) -> None:  # fmt: skip
        self.token, self.top, self._vocab, self.info = token, top, vocab, info or {}
        self.asleep = False

    def score(
        self, sequences: Sequence[Sequence[int]], *, top_k: int = 0, logprob_start_len: int = 0
    ) -> ScoreResult:
        n = len(sequences[0]) - 1
        tok = torch.tensor(self.token if isinstance(self.token, list) else [self.token] * n)
        top = torch.tensor(self.top) if self.top is not None else None
        return ScoreResult(
            [tok],
            [top] if top is not None else None,
            [torch.zeros_like(top, dtype=torch.long)] if top is not None else None,
        )

    def server_info(self) -> dict[str, Any]:
        return self.info

    @property
    def vocab_size(self) -> int | None:
        return self._vocab


def cycle(t: Any) -> None:
    t.release()
    t.resume()


@pytest.mark.parametrize(
    ("fault", "code"),
    [("zeros", Code.TEACHER_UNIFORM), ("garbage", Code.TEACHER_FINGERPRINT_MISMATCH)],
)
def test_catches_both_fault_modes_after_one_wake(tiny_dir, fault, code) -> None:
    t = TorchTeacher.from_pretrained(tiny_dir, fault=fault)
    canary = Canary()
    canary.fingerprint(t, step=3)
    cycle(t)
    findings = canary.verify(t, step=4)
    assert [f.code for f in findings] == [code]
    f = findings[0]
    assert f.severity is Severity.CRITICAL and f.step == 4
    assert "--enable-weights-cpu-backup" in f.message
    if code == Code.TEACHER_UNIFORM:
        assert f.values["vocab_size"] == 512 and "−ln V = -6.23832" in f.message
        assert canary.last_comparison.uniform
    else:
        assert f.values["mean_abs_delta"] > 0.1 and "bounds mean 0.1, max 1" in f.message


@pytest.mark.parametrize("over_http", [False, True])
def test_five_clean_cycles_with_backup_pass(tiny_dir, over_http) -> None:
    with contextlib.ExitStack() as stack:
        if over_http:
            url, _ = stack.enter_context(reference_teacher(tiny_dir, enable_cpu_backup=True))
            t = stack.enter_context(SGLangHTTPTeacher(url))
        else:
            t = TorchTeacher.from_pretrained(tiny_dir, enable_cpu_backup=True)
        canary = Canary(deterministic=True)  # CPU is bit-exact: hold it to exactness
        for step in range(5):
            canary.fingerprint(t, step)
            cycle(t)
            assert canary.verify(t, step) == []
            assert canary.last_comparison.max_abs_delta == 0.0
            assert canary.last_comparison.top1_logprob > -3.0


def test_healthy_teacher_with_repeated_token_logprobs_is_not_uniform(tiny_dir) -> None:
    t = TorchTeacher.from_pretrained(tiny_dir, enable_cpu_backup=True)
    canary = Canary(tokens=[7] * 40)  # one token repeated: later positions repeat values
    fp = canary.fingerprint(t)
    assert len(set(round(v, 4) for v in fp.token_logprobs[10:])) <= 3
    cycle(t)
    assert canary.verify(t) == []
    # a confident teacher repeating one value exactly, with a peaked top-k, is not uniform either
    fake = FakeTeacher(-0.25, [[-0.25, -3.0, -4.0]] * 63)
    assert Canary(top_k=3).verify(fake) == []


def test_flat_rows_are_not_uniform_unless_they_sit_at_minus_ln_v() -> None:
    flat = [[-2.0] * 4] * 63  # flat, but −2 ≠ −ln 1000
    assert Canary(top_k=4).verify(FakeTeacher(-2.0, flat, vocab=1000)) == []
    u = -math.log(1000)
    got = Canary(top_k=4).verify(FakeTeacher(u, [[u] * 4] * 63, vocab=1000))
    assert [f.code for f in got] == [Code.TEACHER_UNIFORM]


def test_unknown_vocab_is_inferred_from_a_uniform_response() -> None:
    u = -math.log(151936)
    canary = Canary(top_k=16)
    got = canary.verify(FakeTeacher(u, [[u] * 16] * 63, vocab=None))
    assert [f.code for f in got] == [Code.TEACHER_UNIFORM]
    assert got[0].values["vocab_inferred"] and got[0].values["vocab_size"] == 151936
    assert "inferred from the response" in got[0].message
    # without top-k or V there is no proof: a flat token list alone is not called uniform
    assert Canary(top_k=0).verify(FakeTeacher(u, None, vocab=None)) == []


def test_nonfinite_logprobs_are_their_own_finding() -> None:
    tok = [float("nan")] + [-1.0] * 62
    got = Canary(top_k=2).verify(FakeTeacher(tok, [[-1.0, -2.0]] * 63))
    assert [f.code for f in got] == [Code.TEACHER_NONFINITE]
    assert got[0].values["nonfinite"] == 1 and "1 of 189" in got[0].message


def test_tolerances_noise_passes_without_determinism_and_fails_with_it() -> None:
    base = [-1.0 - 0.01 * i for i in range(63)]
    noisy = [v + 0.05 for v in base]
    top = [[-0.5, -2.0]] * 63
    loose = Canary(top_k=2)
    loose.fingerprint(FakeTeacher(base, top, info={"enable_deterministic_inference": False}))
    assert loose.verify(FakeTeacher(noisy, top)) == []
    exact = Canary(top_k=2)
    exact.fingerprint(FakeTeacher(base, top, info={"enable_deterministic_inference": True}))
    got = exact.verify(FakeTeacher(noisy, top))
    assert [f.code for f in got] == [Code.TEACHER_FINGERPRINT_MISMATCH]
    assert got[0].values["deterministic"] and "deterministic inference" in got[0].message
    assert Canary(top_k=2, tolerance_mean=0.01).judge  # configurable
    strict = Canary(top_k=2, tolerance_mean=0.01)
    strict.fingerprint(FakeTeacher(base, top))
    assert strict.verify(FakeTeacher(noisy, top))[0].values["tolerance_mean"] == 0.01


def test_ema_teacher_is_compared_across_the_sleep_boundary_only(tiny_dir) -> None:
    t = TorchTeacher.from_pretrained(tiny_dir, enable_cpu_backup=True)
    canary = Canary(deterministic=True)
    for step in range(3):
        with torch.no_grad():  # an EMA update moves the weights between steps
            for p in t.model.parameters():
                p.mul_(0.9).add_(0.01)
        canary.fingerprint(t, step)  # before sleep, after the update
        cycle(t)
        assert canary.verify(t, step) == []


def test_partial_damage_that_is_not_uniform_is_caught(tiny_dir) -> None:
    t = TorchTeacher.from_pretrained(tiny_dir, snapshot_buffers=False)  # RoPE buffers lost too
    canary = Canary(deterministic=True)
    canary.fingerprint(t)
    cycle(t)
    t.reload_weights()
    got = canary.verify(t)
    assert [f.code for f in got] == [Code.TEACHER_FINGERPRINT_MISMATCH]
    assert not canary.last_comparison.uniform


def test_state_dict_round_trip_keeps_tokens_and_fingerprint(tiny_dir) -> None:
    t = TorchTeacher.from_pretrained(tiny_dir)
    a = Canary(seed=7, length=20)
    a.fingerprint(t, step=11)
    b = Canary()
    b.load_state_dict(a.state_dict())
    assert b.canary_tokens() == a.canary_tokens() and len(b.canary_tokens()) == 20
    assert b.last_fingerprint.step == 11
    cycle(t)
    assert [f.code for f in b.verify(t)] == [Code.TEACHER_UNIFORM]


def test_drawn_tokens_are_seeded_and_inside_the_vocabulary(tiny_dir) -> None:
    t = TorchTeacher.from_pretrained(tiny_dir)
    a, b, c = Canary(seed=1), Canary(seed=1), Canary(seed=2)
    assert a.canary_tokens(t) == b.canary_tokens(t) != c.canary_tokens(t)
    assert max(a.canary_tokens(t)) < 512 and len(a.canary_tokens(t)) == 64


def test_teacher_errors_become_unreachable_findings() -> None:
    f = teacher_error_finding(TeacherUnreachable("no answer within 30 s"), 5, during="canary")
    assert f.code == Code.TEACHER_UNREACHABLE and f.severity is Severity.CRITICAL
    assert "during canary" in f.message and f.step == 5


def test_a_saved_canary_vocabulary_never_replaces_the_configured_one(caplog) -> None:
    """A state saved with V = 1000 resumed under checks.canary.vocab_size = 151936: the
    configured V stays (a dead teacher is then still read as uniform), and the difference is
    said; without a configured V the saved one is taken."""
    from distill_guard.live.canary import Canary

    saved = Canary(vocab_size=1000).state_dict()
    configured = Canary(vocab_size=151936)
    configured.load_state_dict(saved)
    assert configured.vocab_size == 151936 and "configured one is kept" in caplog.text
    learnt = Canary()
    learnt.load_state_dict(saved)
    assert learnt.vocab_size == 1000
