"""Count host syncs on CPU: every way a tensor's value reaches Python is a GPU round trip there."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

READS = ("tolist", "item", "__float__", "__int__", "__bool__", "__index__", "cpu", "numpy")
"""The tensor methods that hand a value to the host (boolean indexing syncs on CUDA too, but
shows no call here: the hot paths index with no mask)."""


@contextlib.contextmanager
def host_reads() -> Iterator[list[str]]:
    """The names of the host reads made inside the block, in order (one entry per call)."""
    calls: list[str] = []
    originals = {name: getattr(torch.Tensor, name) for name in READS}

    def counted(name: str):
        def read(self, *args, **kwargs):
            calls.append(name)
            return originals[name](self, *args, **kwargs)

        return read

    try:
        for name in READS:
            setattr(torch.Tensor, name, counted(name))
        yield calls
    finally:
        for name, method in originals.items():
            setattr(torch.Tensor, name, method)
