"""Relax hooks: exact signatures, and Sample-like objects with uniform and healthy teacher logprobs."""

from __future__ import annotations

import enum
import importlib
import inspect
import json
import math
from argparse import Namespace
from dataclasses import dataclass, field

import pytest
import torch

from distill_guard.events import read_events
from distill_guard.integrations import relax
from distill_guard.live.canary import Canary
from distill_guard.observations import LossKind
from distill_guard.teachers import SGLangHTTPTeacher, TorchTeacher
from distill_guard.testing.reference_server import ReferenceServer, serve_in_thread
from distill_guard.testing.tiny import build_tiny_qwen3

from ._tiny import VOCAB, events

PROMPT, RESPONSE = 6, 10
UNIFORM = -math.log(VOCAB)


class Status(enum.Enum):
    COMPLETED = "completed"
    TRUNCATED = "truncated"


@dataclass
class Sample:
    """The fields of Relax's Sample the guard reads (docs/relax.md §1.2, §3)."""

    tokens: list[int]
    response_length: int
    teacher_log_probs: list[float] | None = None
    loss_mask: list[int] | None = None
    status: Status = Status.COMPLETED
    reward: float = 0.0
    metadata: dict = field(default_factory=dict)
    rollout_tokens: list[int] | None = None


@dataclass
class SDPOSample(Sample):
    opd_topk_teacher_log_probs: list[list[float]] | None = None
    opd_topk_token_ids: list[list[int]] | None = None
    opd_sample_mask: bool = True


def make_samples(teacher, n=4, seed=0, cls=Sample, top_k=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(1, VOCAB, (PROMPT + RESPONSE,), generator=g).tolist()
        res = teacher.score([ids], top_k=top_k, logprob_start_len=PROMPT - 1)
        s = cls(ids, RESPONSE, res.token_logprobs[0].tolist(), loss_mask=[1] * RESPONSE)
        if top_k:
            s.opd_topk_teacher_log_probs = res.topk_logprobs[0].tolist()
            s.opd_topk_token_ids = res.topk_ids[0].tolist()
        out.append(s)
    return out


def uniform_samples(n=4, cls=Sample):
    g = torch.Generator().manual_seed(1)
    return [
        cls(
            torch.randint(1, VOCAB, (PROMPT + RESPONSE,), generator=g).tolist(),
            RESPONSE,
            [UNIFORM] * RESPONSE,
            loss_mask=[1] * RESPONSE,
        )
        for _ in range(n)
    ]


ARGS = Namespace(
    opd_token_selection="student_sampled",
    opd_log_prob_top_k=0,
    opd_kl_type="jsd",
    opd_jsd_alpha=0.5,
    opd_teacher_url=None,
)


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    for var in ("DISTILL_GUARD_PRESET", "DISTILL_GUARD_OVERRIDES", "DISTILL_GUARD_EVENTS"):
        monkeypatch.delenv(var, raising=False)
    relax.reset()
    yield
    relax.reset()


def overrides(tmp_path, *extra):
    return [f"events_path={tmp_path / 'events.jsonl'}", "alerts.use_wandb=false", *extra]


def test_hooks_have_relax_exact_signatures():
    def names(fn):
        return list(inspect.signature(fn).parameters)

    assert names(relax.rollout_log_function) == [
        "rollout_id",
        "args",
        "samples",
        "rollout_extra_metrics",
        "rollout_time",
    ]
    assert names(relax.eval_rollout_log_function) == ["rollout_id", "args", "data", "extra_metrics"]
    assert names(relax.before_train_step_hook) == [
        "args",
        "rollout_id",
        "step_id",
        "model",
        "optimizer",
        "opt_param_scheduler",
    ]
    cls = relax.GuardedGoldenAnswerSDPOFeedback
    assert names(cls.check_transfer_channels) == ["self", "sample", "channels", "top_k"]
    assert names(cls.check_student_topk_ids) == ["self", "sample", "top_k"]
    # loadable the way Relax loads function paths: module + attribute
    mod, _, attr = "distill_guard.integrations.relax.GuardedGoldenAnswerSDPOFeedback".rpartition(
        "."
    )
    assert getattr(importlib.import_module(mod), attr) is cls


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    """The tiny teacher on disk: what ``reload_weights`` reads back."""
    return build_tiny_qwen3(
        tmp_path_factory.mktemp("relax_teacher"), vocab_size=VOCAB, embed_std=0.3, max_positions=64
    )


@pytest.fixture
def teacher(teacher_dir):
    """A real TorchTeacher with the memory saver on and no weights CPU backup: each release and
    resume leaves zeroed weights, and a reload from its checkpoint brings them back."""
    return TorchTeacher.from_pretrained(teacher_dir, enable_cpu_backup=False)


def lose_weights(teacher):
    """The colocated sleep and wake without a backup, done outside the guard (by Relax)."""
    teacher.release()
    teacher.resume()


def reloads(tmp_path):
    return sum(e["kind"] == "repair.reload" for e in read_events(tmp_path / "events.jsonl"))


def test_healthy_step_adds_metrics_and_changes_nothing(tmp_path, teacher):
    relax.configure(
        "default", guard_overrides=overrides(tmp_path), args=ARGS, teacher=teacher, repair=False
    )
    samples = make_samples(teacher)
    before = [list(s.teacher_log_probs) for s in samples]
    metrics = {}
    assert relax.rollout_log_function(0, ARGS, samples, metrics, 1.0) is False
    assert metrics["guard/action"] == 0.0 and metrics["guard/halted"] == 0.0
    assert metrics["guard/teacher_uniform_sample_frac"] == 0.0
    assert metrics["guard/samples"] == 4 and -10 < metrics["guard/teacher_logprob_mean"] < 0
    assert [s.teacher_log_probs for s in samples] == before
    assert all(s.loss_mask == [1] * RESPONSE for s in samples)
    assert [
        e for e in events(tmp_path / "events.jsonl") if e.get("severity") in ("warn", "critical")
    ] == []
    st = relax.state()
    assert st.guard.run.vocab_size == VOCAB and st.guard.run.loss is LossKind.JSD


def test_uniform_teacher_without_repair_masks_then_halts(tmp_path):
    relax.configure(
        "default",
        guard_overrides=overrides(tmp_path, f"run.vocab_size={VOCAB}"),
        args=ARGS,
        repair=False,
    )
    for step in range(2):  # unrepaired rewakes: the step's samples leave the loss
        samples, metrics = uniform_samples(), {}
        assert relax.rollout_log_function(step, ARGS, samples, metrics, 1.0) is False
        assert metrics["guard/teacher_uniform_sample_frac"] == 1.0
        assert metrics["guard/masked_samples"] == 4 and all(
            s.loss_mask == [0] * RESPONSE for s in samples
        )
    samples = uniform_samples()
    with pytest.raises(relax.GuardHalt, match="teacher.uniform"):
        relax.rollout_log_function(2, ARGS, samples, {}, 1.0)
    assert all(s.loss_mask == [0] * RESPONSE for s in samples)
    marker = json.loads((tmp_path / "events.halt.json").read_text())
    assert marker["step"] == 2 and "teacher.uniform" in marker["message"]
    halts = [e for e in events(tmp_path / "events.jsonl") if e["kind"] == "halt"]
    assert len(halts) == 1 and halts[0]["step"] == 2


def test_sdpo_topk_samples_use_the_sample_mask(tmp_path, teacher):
    args = Namespace(
        **{**vars(ARGS), "opd_token_selection": "student_topk", "opd_log_prob_top_k": 4}
    )
    relax.configure(
        "default", guard_overrides=overrides(tmp_path), args=args, teacher=teacher, repair=False
    )
    healthy = make_samples(teacher, cls=SDPOSample, top_k=4)
    assert relax.rollout_log_function(0, args, healthy, {}, 1.0) is False
    assert all(s.opd_sample_mask for s in healthy)
    lose_weights(teacher)
    dead = make_samples(teacher, cls=SDPOSample, top_k=4)
    metrics = {}
    relax.rollout_log_function(1, args, dead, metrics, 1.0)
    assert metrics["guard/masked_samples"] == 4 and not any(s.opd_sample_mask for s in dead)
    assert all(s.loss_mask == [1] * RESPONSE for s in dead)  # the PG loss is left alone


def test_repair_and_rescore_in_place(tmp_path, teacher):
    healthy = make_samples(teacher)
    expected = [s.teacher_log_probs for s in healthy]
    st = relax.configure(
        "default",
        guard_overrides=overrides(tmp_path),
        args=ARGS,
        teacher=teacher,
        canary=Canary(length=16),
    )
    lose_weights(teacher)
    dead = make_samples(teacher)  # scored by the dead teacher: all -ln V
    assert all(abs(v - UNIFORM) < 1e-5 for s in dead for v in s.teacher_log_probs)
    metrics = {}
    assert relax.rollout_log_function(0, ARGS, dead, metrics, 1.0) is False
    assert reloads(tmp_path) == 1 and metrics["guard/repairs"] == 1
    assert metrics["guard/rescored_samples"] == 4 and metrics["guard/masked_samples"] == 0
    for s, want in zip(dead, expected):
        assert s.teacher_log_probs == pytest.approx(want, abs=1e-5)
        assert s.loss_mask == [1] * RESPONSE
    assert not st.guard.halted
    resc = [e for e in events(tmp_path / "events.jsonl") if e["kind"] == "rescore"]
    assert resc == [dict(resc[0], rescored=4, masked=0, verified=True)]
    # the next step is healthy and quiet again
    m2 = {}
    relax.rollout_log_function(1, ARGS, make_samples(teacher, seed=3), m2, 1.0)
    assert m2["guard/action"] == 0.0


def test_student_topk_cannot_be_rescored_so_it_is_masked_after_repair(tmp_path, teacher):
    args = Namespace(
        **{**vars(ARGS), "opd_token_selection": "student_topk", "opd_log_prob_top_k": 4}
    )
    relax.configure(
        "default",
        guard_overrides=overrides(tmp_path),
        args=args,
        teacher=teacher,
        canary=Canary(length=16),
    )
    lose_weights(teacher)
    dead = make_samples(teacher, cls=SDPOSample, top_k=4)
    metrics = {}
    relax.rollout_log_function(0, args, dead, metrics, 1.0)
    assert metrics["guard/repairs"] == 1 and metrics["guard/masked_samples"] == 4
    assert not any(s.opd_sample_mask for s in dead)


def test_lifecycle_wrapper_runs_relax_own_sleep_and_wake_inside_the_guards(tmp_path, teacher_dir):
    """Relax's TeacherManager holds its own handle on the server and offloads and onloads it
    itself: the wrapped calls become the guard's colocated step (fingerprint, offload; onload,
    canary, repair), over real HTTP to a reference server without a weights backup."""
    local = TorchTeacher.from_pretrained(teacher_dir, enable_cpu_backup=False)
    with serve_in_thread(ReferenceServer(local)) as url:
        guard_side, relax_side = SGLangHTTPTeacher(url), SGLangHTTPTeacher(url)
        st = relax.configure(
            "default",
            guard_overrides=overrides(tmp_path),
            args=ARGS,
            teacher=guard_side,
            canary=Canary(length=16),
        )
        calls = []

        class Manager:  # Relax's TeacherManager, reduced to its sleep and wake
            def offload(self):
                calls.append(("offload", guard_side.asleep))
                relax_side.release()
                return "offloaded"

            def onload(self):
                calls.append(("onload", guard_side.asleep))
                relax_side.resume()

        m = relax.wrap_teacher_manager(Manager(), st)
        assert relax.wrap_teacher_manager(m, st) is m  # idempotent
        assert m.offload() == "offloaded"  # the host's return value passes through
        assert guard_side.asleep  # the guard's tracked state followed Relax's offload
        m.onload()
        assert calls == [("offload", False), ("onload", True)]
        assert not guard_side.asleep and reloads(tmp_path) == 1
        # the repair left a healthy teacher: a fresh scoring matches the fingerprint
        assert st.guard.canary.verify(guard_side) == []
        assert not st.guard.halted and st.guard.repairs == 1
        guard_side.close()
        relax_side.close()


def test_eval_hook_feeds_accuracy(tmp_path):
    relax.configure("default", guard_overrides=overrides(tmp_path), args=ARGS, repair=False)
    extra = {}
    data = {
        "sciknoweval-biology": {"rewards": [1, 0, 1, 1], "truncated": [0, 0, 0, 1], "samples": []}
    }
    assert relax.eval_rollout_log_function(5, ARGS, data, extra) is False
    assert extra == {"guard/eval_action": 0.0}


def test_feedback_fails_fast_on_a_uniform_sample(monkeypatch):
    fb = relax.GuardedGoldenAnswerSDPOFeedback(guard_vocab_size=VOCAB)
    ok = SDPOSample([1] * 16, RESPONSE)
    healthy = torch.log_softmax(torch.randn(RESPONSE, VOCAB) * 3, -1).topk(4, -1).values
    assert fb.check_transfer_channels(ok, {"opd_topk_teacher_log_probs": healthy}, 4) is None
    uniform = torch.full((RESPONSE, 4), UNIFORM)
    with pytest.raises(relax.TeacherCollapseError, match="uniform"):
        fb.check_transfer_channels(ok, {"opd_topk_teacher_log_probs": uniform.numpy()}, 4)
    # degrade instead of failing: the sample leaves the SDPO loss
    soft = relax.GuardedGoldenAnswerSDPOFeedback(guard_on_collapse="mask")  # V inferred
    s = SDPOSample([1] * 16, RESPONSE)
    soft.check_transfer_channels(s, {"opd_topk_teacher_log_probs": uniform.tolist()}, 4)
    assert s.opd_sample_mask is False and soft.guard_collapsed == 1


def test_before_train_step_hook_saves_then_halts_on_the_marker(tmp_path, monkeypatch):
    saved = []
    monkeypatch.setattr(relax, "_megatron_save", lambda *a: saved.append(a[1]))
    marker = tmp_path / "halt.json"
    monkeypatch.setenv("DISTILL_GUARD_HALT_MARKER", str(marker))
    assert relax.before_train_step_hook(ARGS, 7, 0, None, None, None) is None and saved == []
    marker.write_text(json.dumps({"step": 6, "message": "halt: teacher.uniform"}))
    with pytest.raises(relax.GuardHalt, match="teacher.uniform"):
        relax.before_train_step_hook(ARGS, 7, 0, None, None, None)
    assert saved == [7]


def test_mark_mode_writes_the_marker_without_raising(tmp_path):
    relax.configure(
        "strict",
        guard_overrides=overrides(
            tmp_path, f"run.vocab_size={VOCAB}", "policy.critical_action=HALT"
        ),
        args=ARGS,
        repair=False,
        halt_mode="mark",
    )
    samples = uniform_samples()
    assert relax.rollout_log_function(0, ARGS, samples, {}, 1.0) is False
    assert (tmp_path / "events.halt.json").exists() and relax.state().guard.halted
    later = uniform_samples()
    relax.rollout_log_function(1, ARGS, later, {}, 1.0)  # nothing after a halt trains
    assert all(s.loss_mask == [0] * RESPONSE for s in later)


def test_configuration_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("DISTILL_GUARD_PRESET", "strict")
    monkeypatch.setenv("DISTILL_GUARD_OVERRIDES", f"run.vocab_size={VOCAB} alerts.use_wandb=false")
    monkeypatch.setenv("DISTILL_GUARD_EVENTS", str(tmp_path / "ev.jsonl"))
    args = Namespace(**{**vars(ARGS), "opd_kl_type": "reverse_kl", "opd_jsd_alpha": 0.1})
    st = relax.state(args)
    assert st.guard.policy.halt_after_critical_steps == 2  # strict
    assert st.guard.run.vocab_size == VOCAB and st.guard.run.loss is LossKind.REVERSE_KL
    assert st.guard.run.beta == 0.1 and st.teacher is None
    assert st.halt_marker == tmp_path / "ev.halt.json"


def test_repair_and_rescore_against_the_reference_server(tmp_path):
    """The real path: an SGLang-protocol server whose teacher woke without its weights."""
    canary = Canary(length=16)
    model_dir = build_tiny_qwen3(tmp_path / "teacher", vocab_size=VOCAB)
    local = TorchTeacher.from_pretrained(
        model_dir, enable_memory_saver=True, enable_cpu_backup=False
    )
    with serve_in_thread(ReferenceServer(local)) as url:
        guard_side = SGLangHTTPTeacher(url, timeout_s=10)
        relax_side = SGLangHTTPTeacher(url, timeout_s=10)  # Relax's TeacherManager's own handle
        expected = [s.teacher_log_probs for s in make_samples(guard_side)]
        st = relax.configure(
            "default",
            guard_overrides=overrides(tmp_path),
            args=ARGS,
            teacher=guard_side,
            canary=canary,
        )
        assert st.guard.run.vocab_size == VOCAB
        relax_side.release()  # the colocated sleep/wake, without a weights backup
        relax_side.resume()
        dead = make_samples(guard_side)
        assert all(abs(v - UNIFORM) < 1e-4 for s in dead for v in s.teacher_log_probs)
        metrics = {}
        assert relax.rollout_log_function(0, ARGS, dead, metrics, 1.0) is False
        assert metrics["guard/teacher_uniform_sample_frac"] == 1.0
        assert metrics["guard/repairs"] == 1 and metrics["guard/rescored_samples"] == 4
        for s, want in zip(dead, expected):
            assert s.teacher_log_probs == pytest.approx(want, abs=1e-4)
        assert not st.guard.halted
        guard_side.close()
        relax_side.close()
    kinds = [e["kind"] for e in events(tmp_path / "events.jsonl")]
    assert "rescore" in kinds and "halt" not in kinds


def test_a_malformed_sample_never_crashes_the_rollout(tmp_path):
    relax.configure("default", guard_overrides=overrides(tmp_path), args=ARGS, repair=False)
    bad = Sample([1, 2, 3], 2, teacher_log_probs=[[1.0, 2.0], [3.0]])  # ragged: not a vector
    metrics = {}
    assert relax.rollout_log_function(0, ARGS, [bad], metrics, 1.0) is False
    assert metrics == {"guard/error": 1.0}
    assert [e["kind"] for e in events(tmp_path / "events.jsonl")] == ["guard_error"]
    fb = relax.GuardedOPDFeedback()
    assert (
        fb.check_transfer_channels(bad, {"opd_topk_teacher_log_probs": [[1.0], [2.0, 3.0]]}, 2)
        is None
    )


def test_opsd_teacher_prompt_is_not_guessed_from_the_student_tokens(tmp_path, teacher):
    args = Namespace(**{**vars(ARGS), "opd_teacher_prompt_key": "teacher_prompt"})
    relax.configure(
        "default",
        guard_overrides=overrides(tmp_path),
        args=args,
        teacher=teacher,
        canary=Canary(length=16),
    )
    lose_weights(teacher)
    dead = make_samples(teacher)
    metrics = {}
    relax.rollout_log_function(0, args, dead, metrics, 1.0)
    assert metrics["guard/repairs"] == 1 and metrics["guard/rescored_samples"] == 0
    assert metrics["guard/masked_samples"] == 4
