"""``DistillGuard.load_state_dict`` takes a state whole or not at all, and never lets a saved run
fact silently replace a configured one (distill_guard/guard_state.py)."""

from __future__ import annotations

import copy
import json
import logging
import math

import pytest
import torch

from distill_guard import DistillGuard, LossKind, RunSpec
from distill_guard.errors import GuardError, GuardStateError
from distill_guard.events import read_events
from distill_guard.findings import Code
from distill_guard.live.canary import Canary
from distill_guard.policy import Policy
from distill_guard.teachers import SGLangHTTPTeacher

from .conftest import QWEN3_V

RUN = RunSpec(vocab_size=QWEN3_V)
ADVICE = "Nothing was loaded: the guard is as it was"


def metrics(s: int, shift: float = 0.0) -> dict[str, float]:
    return {
        "loss": 0.02,
        "student_entropy": 1.0 + shift + 0.05 * ((s * 7) % 5 - 2) + (1.5 if s >= 30 else 0.0),
        "truncated_ratio": 0.9 if 20 <= s < 28 else 0.05,
    }


def drive(guard: DistillGuard, steps: range, shift: float = 0.0) -> list[tuple[str, list[str]]]:
    out = []
    for s in steps:
        d = guard.on_step_metrics(s, metrics(s, shift))
        out.append((d.action.value, sorted(f.code for f in d.reasons)))
    return out


@pytest.fixture
def saved(make_guard) -> dict:
    """A state unlike the guard's under test, so a half-taken load would show in its state."""
    other = make_guard(run=RUN, events=None)
    drive(other, range(0, 35), shift=0.4)
    return json.loads(json.dumps(other.state_dict()))


@pytest.fixture
def pair(make_guard):
    """Two guards with the same configuration and history: the one a load is refused on, and
    its twin that was never offered the state."""
    guards = []
    for _ in range(2):
        g = make_guard(run=RUN, events=None)
        drive(g, range(0, 25))
        guards.append(g)
    return guards


def snapshot(guard: DistillGuard) -> tuple:
    return (
        copy.deepcopy(guard.state_dict()),
        [id(c) for c in guard.checks],
        id(guard.policy),
        id(guard.summary),
        guard.run,
        guard.open_incident,
    )


def assert_refused(pair, state, match: str, **kw) -> GuardStateError:
    """Refused with one GuardStateError naming the path; the guard is exactly as before and
    goes on at its next hooks as its twin does."""
    guard, twin = pair
    before = snapshot(guard)
    with pytest.raises(GuardStateError, match=match) as info:
        guard.load_state_dict(state, **kw)
    assert isinstance(info.value, GuardError) and isinstance(info.value, ValueError)
    assert ADVICE in str(info.value)
    assert snapshot(guard) == before
    assert drive(guard, range(25, 45)) == drive(twin, range(25, 45))
    assert guard.state_dict() == twin.state_dict()
    return info.value


# --------------------------------------------------------------------- refused, nothing changed


@pytest.mark.parametrize("state", ["garbage", [("checks", {})], None, 3])
def test_a_state_that_is_not_a_mapping_is_refused(pair, state):
    assert_refused(pair, state, r"guard state: the state must be a mapping .*got ")


def test_a_corrupted_summary_is_refused_before_the_checks_and_policy_are_taken(pair, saved):
    """Before: the checks and the policy were replaced, then the summary raised AttributeError."""
    state = saved | {"summary": "garbage"}
    assert_refused(pair, state, r"guard state: 'summary' must be a mapping, got str\.")


def test_a_run_field_from_another_version_is_refused(pair, saved):
    """Before: TypeError from RunSpec(**run), after the checks, policy and summary were taken."""
    state = copy.deepcopy(saved)
    state["run"]["foo"] = 1
    err = assert_refused(pair, state, r"guard state: run: unknown field 'foo'")
    assert "from another version of distill_guard?" in str(err)


def test_an_unknown_top_level_key_is_refused(pair, saved):
    assert_refused(pair, saved | {"extra": {}}, r"guard state: unknown key 'extra' \(from another")


@pytest.mark.parametrize("keep_halt", [True, False])
@pytest.mark.parametrize(
    ("halt", "match"),
    [
        ({"step": 3, "message": "halt: x", "codes": []}, r"summary\.halt: missing 'stage'"),
        ({"step": 3, "stage": "wake", "codes": []}, r"summary\.halt: missing 'message'"),
        ("garbage", r"'summary\.halt' must be a mapping, got str"),
        ({"step": "3", "stage": "wake", "message": "m"}, r"summary\.halt\.step must be a step"),
        ({"stage": "wake", "message": "m", "why": 1}, r"summary\.halt: unknown key 'why'"),
        ({"stage": "wake", "message": "m", "codes": "x"}, r"summary\.halt\.codes must be a list"),
    ],
)
def test_a_malformed_halt_is_refused_whether_or_not_it_is_kept(pair, saved, halt, match, keep_halt):
    """Before: KeyError('stage') with keep_halt=False, after the checks and policy were taken."""
    state = copy.deepcopy(saved)
    state["summary"]["halt"] = halt
    assert_refused(pair, state, r"guard state: " + match, keep_halt=keep_halt)


def _set(path: str | tuple[str, ...], value):
    def mutate(state: dict) -> None:
        *parents, last = path.split(".") if isinstance(path, str) else path
        node = state
        for key in parents:
            node = node[key]
        node[last] = value

    return mutate


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (_set("checks", "garbage"), r"'checks' must be a mapping, got str"),
        (_set("checks.entropy_drift", [1, 2]), r"'checks\.entropy_drift' must be a mapping"),
        (_set("checks.entropy_drift.reference", 3), r"'checks\.entropy_drift\.reference' must be"),
        (_set("checks.entropy_drift.reference.median", "high"), r"checks\.entropy_drift: median"),
        (_set("checks.entropy_drift.recent.values", "1234"), r"'checks\.entropy_drift\.recent\.va"),
        (_set("checks.entropy_drift.follow_up.incident", "7"), r"checks\.entropy_drift: incident"),
        (_set("checks.truncation.recent.values", ["a"]), r"checks\.truncation: ValueError"),
        (_set("checks.truncation.bogus", 1), r"checks\.truncation: unknown key 'bogus'"),
        (_set("checks.eval_accuracy.best", [0.5]), r"checks\.eval_accuracy: best must be a num"),
        (_set("policy", [1]), r"'policy' must be a mapping, got list"),
        (_set("policy.critical", "x"), r"'policy\.critical' must be a mapping, got str"),
        (_set("policy.warn.last_step", "24"), r"policy: last_step must be a step"),
        (_set("policy.warn.run", "many"), r"policy: ValueError"),
        (_set("policy.warn.extra", 0), r"policy\.warn: unknown key 'extra'"),
        (_set("summary.count", [1]), r"'summary\.count' must be a mapping"),
        (
            _set(("summary", "count", "student.truncation"), -1),
            r"summary\.count\.student\.truncation must be a count",
        ),
        (_set("summary.warn_findings", "30"), r"summary\.warn_findings must be a count"),
        (_set("open_incident", "70"), r"open_incident must be a step"),
        (_set("run", "jsd"), r"'run' must be a mapping, got str"),
        (_set("run.vocab_size", "151936"), r"run\.vocab_size: TypeError"),
        (_set("run.loss", "kl"), r"run\.loss: loss must be one of"),
        (_set("run.beta", 2.0), r"run\.beta: beta must lie in \[0, 1\]"),
        (_set("canary", "x"), r"'canary' must be a mapping"),
        (_set("canary", {"tokens": "abc"}), r"canary\.tokens must be a list of token ids"),
        (_set("canary", {"vocab_size": 1}), r"canary\.vocab_size must be an int >= 2"),
        (_set("canary", {"fingerprint": {"tokens": [1]}}), r"canary\.fingerprint\.token_logprobs"),
        (
            _set("canary", {"fingerprint": {"tokens": [1, 2], "token_logprobs": [-1.0]}}),
            r"canary: TypeError: .*missing 2 required",
        ),
        (_set("canary", {"fingerprint": {"x": 1}}), r"canary\.fingerprint: unknown field 'x'"),
        (_set("canary", {"bogus": 1}), r"canary: unknown key 'bogus'"),
        (_set("incidents", {"current": {"repairs": "2"}}), r"incidents\.current\.repairs"),
        (_set("incidents", {"closed": [{"x": 1}]}), r"incidents\.closed\[0\]: unknown field"),
        (_set("module_canary", [1]), r"'module_canary' must be a mapping"),
        (_set("teacher_reference", {"tokens": [1, 2]}), r"teacher_reference: missing"),
        (_set("teacher_reference", "file.json"), r"'teacher_reference' must be a mapping"),
    ],
)
def test_a_part_of_the_wrong_kind_is_refused_naming_its_path(pair, saved, mutate, match):
    state = copy.deepcopy(saved)
    mutate(state)
    assert_refused(pair, state, r"guard state: " + match)


def test_a_refused_load_leaves_a_live_teacher_and_its_canary_alone(make_guard, saved):
    """The teachers' part is checked on fresh canaries: the live teacher's canary (and the
    client it holds) is neither touched nor copied."""
    teacher = SGLangHTTPTeacher("http://127.0.0.1:9", timeout_s=0.5, max_retries=0, vocab_size=512)
    guard = make_guard(run=RUN, teacher=teacher, canary=Canary(), events=None)
    canary = guard.colocated.canary
    good = copy.deepcopy(guard.state_dict()["canary"])
    good["tokens"] = list(range(1, 9))
    state = saved | {"canary": good, "incidents": {"current": {"first_step": "x"}}}
    before = snapshot(guard)
    with pytest.raises(GuardStateError, match=r"incidents\.current\.first_step must be a step"):
        guard.load_state_dict(state)
    assert snapshot(guard) == before
    assert guard.colocated.canary is canary and guard.colocated.teacher is teacher
    assert canary.state_dict()["tokens"] is None  # the valid canary part was not taken either


def test_the_state_refused_is_not_changed(pair, saved):
    state = copy.deepcopy(saved)
    state["summary"]["halt"] = {"step": 3, "message": "x"}
    frozen = copy.deepcopy(state)
    with pytest.raises(GuardStateError):
        pair[0].load_state_dict(state, keep_halt=False)
    assert state == frozen


# --------------------------------------------------------------------- configured vs saved run


def _events(path) -> list[dict]:
    return [e for e in read_events(path) if e["kind"] == "state_run_kept"]


def test_a_configured_vocab_size_is_kept_against_a_saved_one_and_said_once(
    make_guard, saved, tmp_path, caplog
):
    """Before: the saved V = 1000 replaced the configured 151936 silently, and a dead teacher
    (every top-k entry at -ln 151936) was then not judged uniform."""
    state = copy.deepcopy(saved)
    state["run"]["vocab_size"] = 1000
    events = tmp_path / "resumed.jsonl"
    guard = make_guard(run=RUN, events=events)
    with caplog.at_level(logging.WARNING, logger="distill_guard"):
        guard.load_state_dict(state)
    assert guard.run.vocab_size == QWEN3_V
    (warning,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "run.vocab_size is 1000" in warning.getMessage()
    assert f"keeping {QWEN3_V}" in warning.getMessage()
    assert "check that the teacher is the checkpoint's" in warning.getMessage()
    dead = torch.full((64, 4), -math.log(QWEN3_V))
    decision = guard.on_teacher_scores(35, topk_logprobs=dead)
    assert Code.TEACHER_UNIFORM in {f.code for f in decision.reasons}, decision.message
    guard.close()
    (record,) = _events(events)
    assert record["field"] == "vocab_size"
    assert (record["saved"], record["configured"]) == (1000, QWEN3_V)


@pytest.mark.parametrize(
    ("configured", "saved_run"),
    [
        (RunSpec(vocab_size=QWEN3_V, loss=LossKind.REVERSE_KL), {"loss": "jsd"}),
        (RunSpec(vocab_size=QWEN3_V, beta=0.3), {"beta": 0.7}),
        (RunSpec(vocab_size=QWEN3_V), {"beta": 0.1}),  # a configured default is configured too
        (RunSpec(vocab_size=QWEN3_V, loss_scale=2.0), {"loss_scale": 1.0}),
        (RunSpec(vocab_size=QWEN3_V, teacher_temperature=1.0), {"teacher_temperature": 0.7}),
    ],
)
def test_a_configured_loss_beta_or_other_run_fact_is_kept_with_a_warning(
    make_guard, saved, tmp_path, caplog, configured, saved_run
):
    state = copy.deepcopy(saved)
    state["run"] |= saved_run
    (name,) = saved_run
    events = tmp_path / "resumed.jsonl"
    guard = make_guard(run=configured, events=events)
    with caplog.at_level(logging.WARNING, logger="distill_guard"):
        guard.load_state_dict(state)
    assert guard.run == configured
    (warning,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert f"run.{name} is {saved_run[name]!r}" in warning.getMessage()
    guard.close()
    assert [e["field"] for e in _events(events)] == [name]


def test_a_learnt_vocab_size_is_restored_silently(make_guard, tmp_path, caplog):
    """The V a guard learnt from its teacher (its configuration left it None) comes back with
    the state, before any teacher is attached again."""
    teacher = SGLangHTTPTeacher("http://127.0.0.1:9", timeout_s=0.5, max_retries=0, vocab_size=512)
    first = make_guard(run=RunSpec(loss=LossKind.JSD), teacher=teacher, canary=Canary())
    assert first.run.vocab_size == 512  # learnt from the teacher
    state = json.loads(json.dumps(first.state_dict()))
    events = tmp_path / "resumed.jsonl"
    resumed = make_guard(run=RunSpec(loss=LossKind.JSD), events=events)
    with caplog.at_level(logging.WARNING, logger="distill_guard"):
        resumed.load_state_dict(state)
    assert resumed.run.vocab_size == 512
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    resumed.close()
    assert _events(events) == []


def test_a_vocab_size_learnt_from_a_teacher_attached_before_the_load_is_kept(
    make_guard, saved, caplog
):
    """A guard built without ``run`` takes the saved facts, but not over the V its teacher
    just told it: that one is the run's now, and the saved one is said."""
    teacher = SGLangHTTPTeacher("http://127.0.0.1:9", timeout_s=0.5, max_retries=0, vocab_size=512)
    guard = make_guard(teacher=teacher, canary=Canary(), events=None)
    assert guard.run.vocab_size == 512
    state = copy.deepcopy(saved)
    state["run"] |= {"vocab_size": 1000, "beta": 0.3}
    with caplog.at_level(logging.WARNING, logger="distill_guard"):
        guard.load_state_dict(state)
    assert (guard.run.vocab_size, guard.run.beta) == (512, 0.3)  # beta was not configured
    (warning,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "run.vocab_size is 1000, this guard's is 512" in warning.getMessage()


def test_a_learnt_teacher_temperature_is_restored(make_guard, saved):
    state = copy.deepcopy(saved)
    state["run"]["teacher_temperature"] = 0.7
    guard = make_guard(run=RUN, events=None)
    guard.load_state_dict(state)
    assert guard.run.teacher_temperature == 0.7


def test_a_guard_built_without_a_run_takes_the_saved_one(make_guard, saved):
    state = copy.deepcopy(saved)
    state["run"] |= {"loss": "reverse_kl", "beta": 0.0, "loss_scale": 2.0}
    guard = make_guard(events=None)
    guard.load_state_dict(state)
    assert guard.run == RunSpec(
        vocab_size=QWEN3_V, loss=LossKind.REVERSE_KL, beta=0.0, loss_scale=2.0
    )


def test_a_resume_with_the_same_configuration_is_silent(make_guard, tmp_path, caplog):
    run = RunSpec(vocab_size=QWEN3_V, loss=LossKind.JSD, beta=0.3, teacher_temperature=0.9)
    first = make_guard(run=run, policy=Policy(), events=None)
    drive(first, range(0, 35))
    state = json.loads(json.dumps(first.state_dict()))
    events = tmp_path / "resumed.jsonl"
    resumed = make_guard(run=run, policy=Policy(), events=events)
    with caplog.at_level(logging.INFO, logger="distill_guard"):
        resumed.load_state_dict(state)
    assert [r.getMessage() for r in caplog.records] == []
    assert resumed.state_dict() == first.state_dict()
    assert drive(resumed, range(35, 50)) == drive(first, range(35, 50))
    resumed.close()
    assert _events(events) == []


# --------------------------------------------------------------------- states still loading


STATE_0_1_0 = {
    "checks": {
        "teacher_collapse": {},
        "jsd_ceiling": {},
        "reverse_kl_signature": {},
        "entropy_drift": {
            "warmup": [],
            "mean": 1.0,
            "sigma": 0.07254762501100119,
            "up": 403.710665000311,
            "down": 0.0,
            "up_run": 20,
            "down_run": 0,
        },
        "truncation": {"run": 0},
        "nonfinite_metrics": {},
    },
    "policy": {
        "critical": {"run": 0, "last_step": 79, "last_hit": False},
        "warn": {"run": 18, "last_step": 79, "last_hit": True},
    },
    "summary": {
        "first": {"student.truncation": 42, "student.entropy_drift": 62, "loss.jsd_ceiling": 70},
        "count": {"student.truncation": 8, "student.entropy_drift": 18, "loss.jsd_ceiling": 2},
        "severity": {
            "student.truncation": "warn",
            "student.entropy_drift": "warn",
            "loss.jsd_ceiling": "critical",
        },
        "first_action": {"alert": 42, "rewake": 70},
        "repairs": 0,
        "halt": None,
    },
    "run": {"vocab_size": 151936, "loss": "jsd", "beta": 0.5, "loss_scale": 1.0},
}
"""What distill_guard 0.1.0's ``state_dict()`` saved after 80 steps (its CUSUM entropy drift)."""

STATE_0_2_0 = {
    "checks": {
        "teacher_collapse": {"recent_means": []},
        "jsd_ceiling": {},
        "reverse_kl_signature": {},
        "entropy_drift": {
            "reference": {"median": 1.0, "sigma": 0.07413000000000006, "pending": []},
            "recent": {"values": [2.4, 2.5, 2.6, 2.45, 2.55], "past": [1.0, 1.05, 1.1, 2.4]},
            "falling": False,
        },
        "truncation": {"recent": {"values": [0.05, 0.05, 0.05, 0.05, 0.05], "past": []}},
        "loss_shift": {
            "reference": {"median": None, "sigma": None, "pending": []},
            "recent": {"values": [], "past": []},
        },
        "eval_accuracy": {
            "reference": {"median": 0.5, "sigma": 1e-12, "pending": []},
            "recent": {"values": [0.5, 0.5, 0.5], "past": []},
        },
        "token_pairing": {},
        "loss_signal": {
            "said_beta": False,
            "judged": True,
            "warmup": {"median": 0.02, "sigma": 1e-12, "pending": []},
        },
        "topk_truncation": {
            "clamp": {"values": [], "past": []},
            "mass": {"values": [], "past": []},
            "mass_ref": {"median": None, "sigma": None, "pending": []},
        },
        "nonfinite_metrics": {},
    },
    "policy": {
        "critical": {"run": 0, "last_step": 79, "last_hit": False},
        "warn": {"run": 18, "last_step": 79, "last_hit": True},
    },
    "summary": {
        "first": {"student.truncation": 42, "student.entropy_drift": 62, "loss.jsd_ceiling": 70},
        "count": {"student.truncation": 10, "student.entropy_drift": 18, "loss.jsd_ceiling": 2},
        "warn_findings": 30,
        "skipped_updates": 0,
        "halt": None,
    },
    "run": {
        "vocab_size": 151936,
        "loss": "jsd",
        "beta": 0.5,
        "loss_scale": 1.0,
        "student_vocab_size": None,
    },
}
"""What distill_guard 0.2.0's ``state_dict()`` saved after 80 steps (before the anchor, the
follow-up, the accuracy's best level and the open incident existed)."""


def test_a_state_of_distill_guard_0_1_0_still_loads(make_guard, caplog):
    guard = make_guard(run=RUN, events=None)
    with caplog.at_level(logging.INFO, logger="distill_guard"):
        guard.load_state_dict(copy.deepcopy(STATE_0_1_0))
    assert guard.summary.count == STATE_0_1_0["summary"]["count"]
    assert guard.policy.state_dict() == STATE_0_1_0["policy"]
    entropy = {c.name: c for c in guard.checks}["entropy_drift"]
    assert entropy.state_dict()["reference"]["median"] is None  # its CUSUM cannot be carried
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "checks.entropy_drift of the loaded state holds down, down_run" in said
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    drive(guard, range(80, 90))


def test_a_state_of_distill_guard_0_2_0_still_loads(make_guard, caplog):
    guard = make_guard(run=RUN, events=None)
    with caplog.at_level(logging.INFO, logger="distill_guard"):
        guard.load_state_dict(copy.deepcopy(STATE_0_2_0))
    assert caplog.records == []
    by_name = {c.name: c.state_dict() for c in guard.checks}
    assert by_name["entropy_drift"]["reference"]["anchor"] == 1.0  # its median: no anchor then
    assert by_name["eval_accuracy"]["best"] == 0.5  # its warm-up reference, as the best level
    assert guard.summary.state_dict() == STATE_0_2_0["summary"]
    assert guard.open_incident is None
    drive(guard, range(80, 90))


def test_a_state_of_this_version_round_trips_with_a_live_teacher(make_guard):
    teacher = SGLangHTTPTeacher("http://127.0.0.1:9", timeout_s=0.5, max_retries=0, vocab_size=512)
    first = make_guard(run=RUN, teacher=teacher, canary=Canary(), events=None)
    drive(first, range(0, 35))
    first.colocated.canary.canary_tokens(teacher)  # tokens drawn, as at a first sleep
    state = json.loads(json.dumps(first.state_dict()))
    assert state["canary"]["tokens"] and "incidents" in state
    again = SGLangHTTPTeacher("http://127.0.0.1:9", timeout_s=0.5, max_retries=0, vocab_size=512)
    resumed = make_guard(run=RUN, events=None)
    resumed.load_state_dict(state)
    resumed.attach_teacher(again, Canary())
    assert resumed.state_dict() == first.state_dict()
