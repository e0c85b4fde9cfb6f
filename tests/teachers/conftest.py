"""Shared fixtures for teacher tests: tiny models on disk and reference servers on loopback."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from distill_guard.teachers import TorchTeacher
from distill_guard.testing.servers import reference_teacher
from distill_guard.testing.tiny import QWEN3_VOCAB, build_tiny_qwen3


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen3 with V = 512 (fast)."""
    return build_tiny_qwen3(tmp_path_factory.mktemp("tiny512"), vocab_size=512)


@pytest.fixture(scope="session")
def qwen_vocab_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen3 with Qwen3's real V = 151936 and a tiny hidden size (realism)."""
    return build_tiny_qwen3(tmp_path_factory.mktemp("tinyqwen"), vocab_size=QWEN3_VOCAB)


ServeFn = Callable[..., tuple[str, TorchTeacher]]


@pytest.fixture
def serve() -> Iterator[ServeFn]:
    """``serve(model_dir, version=..., api_key=..., latency_s=..., **TorchTeacher kwargs) -> (url,
    teacher)``: a
    reference server in a background thread on a free 127.0.0.1 port, stopped after the test."""
    with contextlib.ExitStack() as stack:

        def _serve(model_dir: Path, **kw: object) -> tuple[str, TorchTeacher]:
            return stack.enter_context(reference_teacher(model_dir, **kw))  # type: ignore[arg-type]

        yield _serve
