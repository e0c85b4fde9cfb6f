"""A resumed guard keeps its module canary's reference even when the teacher is watched after
the state was loaded (the transformers mixin attaches the canary at the first training step)."""

from __future__ import annotations

import pytest
import torch

from distill_guard.testing.standins import student_of, tiny_random_qwen3


def test_a_canary_watched_after_load_state_dict_keeps_the_saved_reference(make_guard):
    teacher = tiny_random_qwen3()
    saved = make_guard()
    saved.watch_module_teacher(teacher)
    assert saved.on_teacher_scores(0).action.value == "continue"  # its reference, healthy
    state = saved.state_dict()

    broken = student_of(teacher)  # another model where the teacher was: not the reference
    with torch.no_grad():
        for p in broken.parameters():
            p.add_(torch.randn_like(p) * p.std().clamp_min(1e-3))
    resumed = make_guard()
    resumed.load_state_dict(state)
    resumed.watch_module_teacher(broken)  # watched after the load, as the HF mixin does
    decision = resumed.on_teacher_scores(1)
    assert decision.acts, decision.message
    assert "teacher.fingerprint_mismatch" in {f.code for f in decision.reasons}


def test_a_live_teacher_attached_after_load_state_dict_keeps_the_saved_fingerprint(
    make_guard, tmp_path
):
    """The same for a live teacher: a guard that loads its state, then gets its teacher (a
    launcher that builds the teacher handle after the resume), judges the first wake against
    the saved fingerprint, so a teacher that came back as garbage is caught there."""
    pytest.importorskip("transformers")
    from distill_guard.teachers import TorchTeacher

    from .integrations._tiny import garble

    tiny_random_qwen3().save_pretrained(tmp_path / "t")
    teacher = TorchTeacher.from_pretrained(tmp_path / "t", enable_cpu_backup=True)
    saved = make_guard(teacher=teacher)
    assert saved.sleep(0).action.value == "continue"  # the fingerprint, then the release
    state = saved.state_dict()
    assert state["canary"]["fingerprint"] is not None

    again = TorchTeacher.from_pretrained(tmp_path / "t", enable_cpu_backup=True)
    garble(again.model)
    resumed = make_guard()
    resumed.load_state_dict(state)
    resumed.attach_teacher(again)  # attached after the load
    decision = resumed.wake(1)
    assert "teacher.fingerprint_mismatch" in {f.code for f in decision.reasons}, decision
