"""A pytest plugin that sends every float32 tensor the teacher checks can fuse through their
Triton kernels (``-p tests.checks._fused_stats``): the teacher-collapse statistics, the rows'
top-1 and the pairing check's gaps. The checks' own tests then run on the fused path as they run
on the PyTorch one. On a CUDA machine each kernel's inputs are copied to the GPU and the
compiled kernel reads them (its output comes back to the CPU, by ``.to``, which the host-read
counters do not count: a test's reads are the check's own); elsewhere the CPU tensors go through
Triton's interpreter. It prints how many launches each kernel took, so that a run where one took
none is seen."""

from __future__ import annotations

import collections

import torch

import distill_guard.kernels.teacher_stats as teacher_stats
import distill_guard.signals as signals

KERNELS = ("triton_view_parts", "triton_row_max", "triton_gap_parts")
_launches: collections.Counter[str] = collections.Counter()


def _float32_anywhere(*tensors: torch.Tensor) -> bool:
    return all(t.dtype == torch.float32 for t in tensors)


def _counted(name: str):
    kernel = getattr(teacher_stats, name)
    on_gpu = torch.cuda.is_available()

    def launch(*args, **kwargs):
        _launches[name] += 1
        if not on_gpu:
            return kernel(*args, **kwargs)
        moved = [a.cuda() if isinstance(a, torch.Tensor) else a for a in args]
        return kernel(*moved, **kwargs).to("cpu")

    return launch


def pytest_configure(config) -> None:
    signals.fusable_float32 = _float32_anywhere
    for name in KERNELS:
        setattr(teacher_stats, name, _counted(name))


def pytest_unconfigure(config) -> None:
    print("fused launches: " + ", ".join(f"{name} {_launches[name]}" for name in KERNELS))
