"""A pytest plugin that sends every float32 view of the teacher-collapse check through its
Triton kernel (``-p tests.checks._fused_stats``), on CPU tensors through Triton's interpreter:
the check's own tests then run on the fused path as they run on the PyTorch one. It prints how
many views took the kernel, so that a run where none did is seen."""

from __future__ import annotations

import torch

import distill_guard.checks.teacher_collapse as teacher_collapse

_calls = [0]


def _fusable_anywhere(view) -> bool:
    return view.values.dtype == torch.float32 and not (view.topk and view.x.dtype != torch.float32)


def pytest_configure(config) -> None:
    fused = teacher_collapse.TeacherCollapseCheck._fused_parts

    def counted(self, views, run):
        _calls[0] += len(views)
        return fused(self, views, run)

    teacher_collapse._fusable = _fusable_anywhere
    teacher_collapse.TeacherCollapseCheck._fused_parts = counted


def pytest_unconfigure(config) -> None:
    print(f"fused views: {_calls[0]}")
