"""The conformance suite's drivers as a fixture: every scenario file runs on every adapter."""

from __future__ import annotations

import pytest

from .adapters import Driver, HFTrainer, Lightning, PlainLoop, RelaxHarness

ADAPTERS = ("plain", "transformers", "trl_gkd", "trl_distillation", "lightning", "relax")


def make_driver(name: str, request: pytest.FixtureRequest) -> Driver:
    if name == "plain":
        return PlainLoop()
    if name == "transformers":
        return HFTrainer(name, "stand_in", needs="transformers")
    if name == "trl_gkd":
        return HFTrainer(name, "trl", needs="trl.experimental.gkd")
    if name == "trl_distillation":
        # the tiny student never ends an answer: every completion is clipped at
        # max_completion_length, which the truncation check rightly reports (test_trl.py)
        return HFTrainer(
            name, "distillation", needs="trl", overrides=("checks.truncation.enabled=false",)
        )
    if name == "lightning":
        pytest.importorskip("lightning.pytorch")
        return Lightning()
    from distill_guard.testing.tiny import build_tiny_qwen3

    from ..relax_harness import VOCAB as RELAX_VOCAB

    teacher_dir = build_tiny_qwen3(
        request.getfixturevalue("tmp_path_factory").mktemp("relax_teacher"),
        vocab_size=RELAX_VOCAB,
        embed_std=0.3,
        max_positions=128,  # above the 64-token canary, as in test_relax.py
    )
    return RelaxHarness(teacher_dir, context=request.getfixturevalue("forkserver"))


@pytest.fixture(scope="module", params=ADAPTERS)
def driver(request) -> Driver:
    return make_driver(request.param, request)
