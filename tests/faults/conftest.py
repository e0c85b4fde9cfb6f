import pytest

from distill_guard.testing.tiny import build_tiny_qwen3


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    return build_tiny_qwen3(tmp_path_factory.mktemp("faults_tiny"), vocab_size=64)
