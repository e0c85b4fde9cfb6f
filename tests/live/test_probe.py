"""run_probe against reference servers over loopback HTTP."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from distill_guard.findings import Code
from distill_guard.live.canary import Canary
from distill_guard.live.probe import format_table, run_probe
from distill_guard.teachers import SGLangHTTPTeacher, TorchTeacher
from distill_guard.testing.servers import reference_teacher
from distill_guard.testing.tiny import build_tiny_qwen3

SEQ = [list(range(5, 60))]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_qwen3(tmp_path_factory.mktemp("probe_tiny"), vocab_size=512)


@pytest.mark.parametrize(
    ("version", "fault", "code"),
    [
        ("0.5.23", "zeros", Code.TEACHER_FINGERPRINT_MISMATCH),  # the checksum, traffic held
        ("0.5.6", "garbage", Code.TEACHER_WEIGHTS_NOT_KEPT),  # no checksum: its configuration
        ("0.4.8", "zeros", None),  # no pause route: never released, so nothing is lost
    ],
)
def test_probe_finds_the_loss_repairs_and_leaves_the_teacher_scoring_correctly(
    tiny_dir, version, fault, code
) -> None:
    from distill_guard.live.probe import NothingReleased

    expected = TorchTeacher.from_pretrained(tiny_dir).score(SEQ, top_k=4)
    with (
        reference_teacher(tiny_dir, version=version, fault=fault) as (url, _),
        SGLangHTTPTeacher(url) as t,
    ):
        if code is None:
            with pytest.raises(NothingReleased, match="no /pause_generation"):
                run_probe(t, cycles=3)
        else:
            report = run_probe(t, cycles=3)
            assert not report.ok and report.repaired and report.exit_code == 1
            assert len(report.cycles) == 1 and report.cycles[0].lost_weights  # stops at the loss
            assert report.cycles[0].uniform is None  # held: no canary ran on the lost weights
            got = [f.code for f in report.findings]
            assert got[0] == Code.CONFIG_NO_WEIGHTS_BACKUP, got
            assert code in got and Code.TEACHER_REPAIRED in got, got
        after = t.score(SEQ, top_k=4)  # the probe left it as it found it
        assert torch.equal(after.topk_logprobs[0], expected.topk_logprobs[0])
        assert not t.asleep


def test_probe_of_a_backed_up_teacher_is_healthy(tiny_dir) -> None:
    with (
        reference_teacher(tiny_dir, enable_cpu_backup=True) as (url, _),
        SGLangHTTPTeacher(url) as t,
    ):
        report = run_probe(t, cycles=3, tags=["weights", "kv_cache"])
    assert report.ok and not report.repaired and report.exit_code == 0
    assert [c.max_abs_delta for c in report.cycles] == [0.0, 0.0, 0.0]
    assert all(c.top1_logprob > -3 and not c.uniform for c in report.cycles)
    assert [f.code for f in report.findings] == [Code.CONFIG_NONDETERMINISTIC]
    table = format_table(report)
    assert table.count("\n") == 4 and "max |Δ logprob|" in table


def test_releasing_only_the_kv_cache_keeps_the_weights(tiny_dir) -> None:
    with reference_teacher(tiny_dir) as (url, _), SGLangHTTPTeacher(url) as t:
        report = run_probe(t, cycles=2, tags=["kv_cache"])
    assert [c.lost_weights for c in report.cycles] == [False, False]
    assert not report.ok  # preflight still flags the configuration


def test_to_json_has_exactly_the_documented_shape(tiny_dir) -> None:
    from distill_guard.live.colocate import ColocatedTeacher

    with reference_teacher(tiny_dir) as (url, teacher), SGLangHTTPTeacher(url) as t:
        out = run_probe(t, cycles=1, canary=Canary(length=16, top_k=4)).to_json()
        assert list(out) == ["ok", "repaired", "findings", "cycles", "stopped"]
        assert out["ok"] is False and out["repaired"] is True
        assert json.loads(json.dumps(out, allow_nan=False)) == out
        assert out["cycles"][0]["uniform"] is None  # held for its repair, unmeasured
        # the host's own sleep (no hold): the canary measures the loss after the wake
        colocated = ColocatedTeacher(t, Canary(length=16, top_k=4))
        colocated.sleep(0, release=teacher.release)
        colocated.wake(0, resume=teacher.resume)
        cmp = colocated.canary.last_comparison
        assert cmp.uniform and cmp.max_abs_delta > 1 and cmp.top1_logprob < -6


def test_a_teacher_broken_before_the_probe_is_reported_not_cycled(tiny_dir) -> None:
    with reference_teacher(tiny_dir) as (url, teacher), SGLangHTTPTeacher(url) as t:
        teacher.release()
        teacher.resume()  # lost before the probe started
        report = run_probe(t, cycles=3, preflight=False)
    assert report.cycles == [] and not report.ok and not report.repaired
    assert [f.code for f in report.findings] == [Code.TEACHER_UNIFORM]


def test_no_repair_leaves_it_reported(tiny_dir) -> None:
    with reference_teacher(tiny_dir) as (url, _), SGLangHTTPTeacher(url) as t:
        report = run_probe(t, cycles=2, repair=False)
    assert not report.repaired and report.cycles[0].lost_weights


def test_a_probe_that_stops_early_says_after_which_cycle_and_why(tiny_dir) -> None:
    """Issue 28: --cycles 3 stopped after a failed first cycle without saying so (--json)."""
    with reference_teacher(tiny_dir) as (url, _), SGLangHTTPTeacher(url) as t:
        seen: list[int] = []
        report = run_probe(t, cycles=3, on_cycle=lambda c: seen.append(c.cycle))
    assert seen == [1] and len(report.cycles) == 1
    assert (
        report.stopped == "stopped after cycle 1 of 3: it lost its weights (repaired and verified)"
    )
    assert report.to_json()["stopped"] == report.stopped
    with (
        reference_teacher(tiny_dir, enable_cpu_backup=True) as (url, _),
        SGLangHTTPTeacher(url) as t,
    ):
        assert run_probe(t, cycles=2).stopped is None
