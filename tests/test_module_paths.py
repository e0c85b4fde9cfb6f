"""Old import paths keep working after the modules were split by job: each old name is the very
object its new module holds (no copy that could drift)."""

from __future__ import annotations

import importlib

import pytest

MOVED = [
    # (old module, name, new module)
    ("distill_guard.integrations.plain", "StepGuard", "distill_guard.integrations.step_guard"),
    ("distill_guard.integrations.plain", "GuardedCallback", "distill_guard.integrations.callback"),
    ("distill_guard.integrations.plain", "refuse_unexpected", "distill_guard.integrations.callback"),
    ("distill_guard.integrations.plain", "vocab_width", "distill_guard.integrations.teacher_taps"),
    ("distill_guard.integrations.transformers", "GuardedDistillationMixin", "distill_guard.integrations.trl"),
    ("distill_guard.integrations.transformers", "guard_trainer", "distill_guard.integrations.trl"),
    ("distill_guard.integrations.transformers", "watch_trainer_teacher", "distill_guard.integrations.trl"),
    ("distill_guard.live.preflight", "parse_launch_command", "distill_guard.live.launch_command"),
    ("distill_guard.live.preflight", "measure_temperature", "distill_guard.live.teacher_temperature"),
    ("distill_guard.live.preflight", "preflight_teacher_temperature", "distill_guard.live.teacher_temperature"),
    ("distill_guard.cli", "UsageError", "distill_guard.cli.base"),
    ("distill_guard.teachers.sglang_http", "RETRY_STATUSES", "distill_guard.teachers.sglang_transport"),
    ("distill_guard.teachers.sglang_http", "error_message", "distill_guard.teachers.sglang_transport"),
    ("distill_guard.teachers.sglang_http", "checksum_of", "distill_guard.teachers.sglang_traffic"),
    ("distill_guard.triton_kernels", "triton_entropy", "distill_guard.kernels.signals"),
    ("distill_guard.triton_kernels", "triton_loss_grad", "distill_guard.kernels.fused_loss"),
    ("distill_guard.testing.reference_server.engine", "ContractError", "distill_guard.testing.reference_server.errors"),
    ("distill_guard", "StepGuard", "distill_guard.integrations.step_guard"),
    ("distill_guard", "distill_loss", "distill_guard.losses"),
    ("distill_guard", "DistillLoss", "distill_guard.losses"),
    ("distill_guard", "GuardError", "distill_guard.errors"),
]  # fmt: skip


@pytest.mark.parametrize(("old", "name", "new"), MOVED, ids=[f"{o}.{n}" for o, n, _ in MOVED])
def test_the_old_path_gives_the_new_modules_object(old, name, new):
    if "triton" in old or "kernels" in new:
        pytest.importorskip("triton")
    if "transformers" in old:
        pytest.importorskip("transformers")
    assert getattr(importlib.import_module(old), name) is getattr(
        importlib.import_module(new), name
    )


def test_the_readme_names_are_top_level_exports():
    import distill_guard

    for name in ("StepGuard", "distill_loss", "DistillLoss", "GuardError", "build_guard"):
        assert name in distill_guard.__all__ and getattr(distill_guard, name) is not None
