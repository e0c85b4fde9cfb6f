"""One conformance suite every check exported from ``distill_guard.checks`` must pass.

Composer-style: the suite is parametrized over the package's own export list, so a new check
is tested the moment it is exported. A check that raises findings needs a *provocation* below:
a short stream of observations that makes it speak.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import math
import re
import textwrap
from collections.abc import Callable

import pytest
import torch

import distill_guard.checks as checks_pkg
from distill_guard.checks import (
    Check,
    EntropyDriftCheck,
    EvalAccuracyCheck,
    JSDCeilingCheck,
    LossRiseCheck,
    LossShiftCheck,
    LossSignalCheck,
    NonfiniteMetricsCheck,
    ReverseKLSignatureCheck,
    TeacherCollapseCheck,
    TokenPairingCheck,
    TopKTruncationCheck,
    TruncationCheck,
)
from distill_guard.findings import Code, Finding, Severity
from distill_guard.observations import LossKind, RunSpec, StepMetrics, TeacherScores
from tests.conftest import LN_QWEN3_V, QWEN3_V

CHECK_CLASSES = sorted(
    (
        obj
        for name in checks_pkg.__all__
        if inspect.isclass(obj := getattr(checks_pkg, name))
        and issubclass(obj, Check)
        and obj is not Check
    ),
    key=lambda c: c.__name__,
)
ALL_CODES = {v for k, v in vars(Code).items() if k.isupper() and isinstance(v, str)}

Obs = StepMetrics | TeacherScores
Provocation = Callable[[], tuple[RunSpec, list[Obs]]]


def _entropy_stream() -> tuple[RunSpec, list[Obs]]:
    values = [1.0 + 0.05 * ((i * 7) % 5 - 2) for i in range(60)] + [
        3.0 + 0.01 * i for i in range(80)
    ]
    return RunSpec(vocab_size=QWEN3_V), [
        StepMetrics(i, {"student_entropy": v}) for i, v in enumerate(values)
    ]


PROVOCATIONS: dict[type, Provocation] = {
    TeacherCollapseCheck: lambda: (
        RunSpec(vocab_size=QWEN3_V),
        [
            TeacherScores(0, topk_logprobs=torch.full((8, 4), -LN_QWEN3_V)),
            TeacherScores(1, token_logprobs=torch.tensor([-0.1, math.nan, -0.3])),
            StepMetrics(2, {"teacher_logprob": -LN_QWEN3_V}),
        ],
    ),
    JSDCeilingCheck: lambda: (
        RunSpec(beta=0.5),
        [StepMetrics(0, {"loss": 0.688}), StepMetrics(1, {"loss": 2.0})],
    ),
    ReverseKLSignatureCheck: lambda: (
        RunSpec(vocab_size=QWEN3_V, loss=LossKind.REVERSE_KL),
        [StepMetrics(0, {"loss": LN_QWEN3_V - 0.7, "student_entropy": 0.7})],
    ),
    EntropyDriftCheck: _entropy_stream,
    TruncationCheck: lambda: (
        RunSpec(),
        [StepMetrics(i, {"truncated_ratio": 0.03 if i < 5 else 0.97}) for i in range(11)],
    ),
    LossShiftCheck: lambda: (
        RunSpec(loss=LossKind.FORWARD_KL),
        [StepMetrics(i, {"loss": 0.05 + 0.001 * (i % 3)}) for i in range(60)]
        + [StepMetrics(60 + i, {"loss": 3.0}) for i in range(5)],
    ),
    LossRiseCheck: lambda: (
        RunSpec(),
        [StepMetrics(i, {"loss": 0.03 * 1.2 ** min(i, 12)}, True) for i in range(20)],
    ),
    EvalAccuracyCheck: lambda: (
        RunSpec(),
        [StepMetrics(i, {"eval_accuracy": a}) for i, a in enumerate([0.4, 0.42, 0.41, 0.0, 0.0])],
    ),
    TokenPairingCheck: lambda: (
        RunSpec(vocab_size=QWEN3_V, student_vocab_size=1000),
        [TeacherScores(0, topk_ids=torch.full((8, 4), 5000, dtype=torch.long))],
    ),
    LossSignalCheck: lambda: (RunSpec(beta=1e-6), [StepMetrics(0, {"loss": 1e-6})]),
    TopKTruncationCheck: lambda: (
        RunSpec(),
        [StepMetrics(i, {"topk_clamp_fraction": 0.9}) for i in range(6)],
    ),
    NonfiniteMetricsCheck: lambda: (
        RunSpec(),
        [StepMetrics(0, {"loss": math.nan, "student_entropy": math.inf})],
    ),
}


def observe(check: Check, run: RunSpec, obs: Obs) -> list[Finding]:
    if isinstance(obs, TeacherScores):
        return check.on_teacher_scores(obs, run)
    return check.on_step_metrics(obs, run)


def provoke(check: Check) -> list[list[Finding]]:
    if type(check) not in PROVOCATIONS:
        pytest.fail(
            f"{type(check).__name__} is exported from distill_guard.checks but has no provocation "
            "in tests/checks/test_conformance.py: add a stream that makes it report a finding"
        )
    run, stream = PROVOCATIONS[type(check)]()
    return [observe(check, run, o) for o in stream]


@pytest.fixture(params=CHECK_CLASSES, ids=lambda c: c.__name__)
def check_cls(request) -> type[Check]:
    return request.param


def test_the_suite_sees_every_exported_check():
    assert {c.__name__ for c in CHECK_CLASSES} >= {
        "TeacherCollapseCheck",
        "JSDCeilingCheck",
        "ReverseKLSignatureCheck",
        "EntropyDriftCheck",
        "TruncationCheck",
        "NonfiniteMetricsCheck",
    }


def test_names_are_unique_because_state_is_keyed_by_name():
    names = [c.name for c in CHECK_CLASSES]
    assert len(set(names)) == len(names)
    assert "check" not in names  # every check overrides the base name


def test_constructible_with_defaults(check_cls):
    check = check_cls()
    assert isinstance(check, Check)
    assert check.enabled is True


def test_is_a_dataclass_with_an_enabled_switch_and_documented_fields(check_cls):
    assert dataclasses.is_dataclass(check_cls)
    fields = {f.name for f in dataclasses.fields(check_cls)}
    assert "enabled" in fields
    assert not any(name.startswith("_") for name in fields), "private state must not be config"
    # attribute docstrings (OLMo-core style): each public field is followed by a string literal
    tree = ast.parse(textwrap.dedent(inspect.getsource(check_cls)))
    body = tree.body[0].body
    documented = {
        node.target.id
        for node, nxt in zip(body, body[1:])
        if isinstance(node, ast.AnnAssign)
        and isinstance(node.target, ast.Name)
        and isinstance(nxt, ast.Expr)
        and isinstance(nxt.value, ast.Constant)
        and isinstance(nxt.value.value, str)
        and nxt.value.value.strip()
    }
    assert fields <= documented, f"undocumented fields: {sorted(fields - documented)}"


def test_provocation_makes_it_report(check_cls):
    found = [f for fs in provoke(check_cls()) for f in fs]
    assert found, "the provocation no longer provokes: the suite would test nothing"


def test_disabled_yields_no_findings(check_cls):
    assert all(fs == [] for fs in provoke(check_cls(enabled=False)))


@pytest.mark.parametrize("run", [RunSpec(), RunSpec(vocab_size=QWEN3_V, loss=LossKind.REVERSE_KL)])
def test_empty_observations_yield_nothing_and_do_not_raise(check_cls, run):
    check = check_cls()
    for step in range(30):
        assert check.on_step_metrics(StepMetrics(step, {}), run) == []
        assert check.on_teacher_scores(TeacherScores(step), run) == []
    empty = TeacherScores(30, torch.zeros(0), torch.zeros(0, 4), torch.zeros(0, dtype=torch.bool))
    assert check.on_teacher_scores(empty, run) == []


def test_findings_are_well_formed(check_cls):
    for step_findings in provoke(check_cls()):
        for f in step_findings:
            assert isinstance(f, Finding)
            assert f.code in ALL_CODES, f"{f.code!r} is not a stable code from Code"
            assert isinstance(f.severity, Severity)
            assert isinstance(f.step, int)
            assert f.message.strip() and re.search(r"\d", f.message), f.message
            json.dumps(f.to_dict(), allow_nan=False)  # the event log can carry it


def test_state_dict_round_trips_through_json(check_cls):
    check = check_cls()
    stream = provoke(check)  # leave it mid-stream with non-trivial state
    assert stream
    state = check.state_dict()
    restored_state = json.loads(json.dumps(state, allow_nan=False))
    fresh = check_cls()
    fresh.load_state_dict(restored_state)
    assert fresh.state_dict() == state
    # both continue identically on the same data
    run, more = PROVOCATIONS[check_cls]()
    for obs in more:
        assert observe(check, run, obs) == observe(fresh, run, obs)


def test_load_of_an_empty_state_is_a_fresh_check(check_cls):
    check = check_cls()
    provoke(check)
    check.load_state_dict({})
    assert check.state_dict() == check_cls().state_dict()
