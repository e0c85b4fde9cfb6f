"""GPU tests: skipped cleanly without CUDA, or without torch_memory_saver unless the module sets
``NEEDS_TORCH_MEMORY_SAVER = False``."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from distill_guard.testing.tiny import QWEN3_VOCAB, build_tiny_qwen3


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.gpu)
            if not torch.cuda.is_available():
                item.add_marker(pytest.mark.skip(reason="needs CUDA"))
            elif (
                getattr(item.module, "NEEDS_TORCH_MEMORY_SAVER", True)
                and importlib.util.find_spec("torch_memory_saver") is None
            ):
                item.add_marker(pytest.mark.skip(reason="needs torch_memory_saver"))


@pytest.fixture(scope="session")
def qwen_vocab_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen3-architecture checkpoint with Qwen3's real V = 151936."""
    return build_tiny_qwen3(tmp_path_factory.mktemp("tinyqwen_gpu"), vocab_size=QWEN3_VOCAB)
