import pytest
import torch


@pytest.fixture(autouse=True, scope="package")
def _one_torch_thread():
    """Tiny models on a shared 2-core box: one intra-op thread is several times faster."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
