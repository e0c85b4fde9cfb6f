"""What a checkpoint saved after a halt keeps of the teacher (``integrations/callback.py``)."""

from __future__ import annotations

import torch

from distill_guard.integrations.callback import leave_teacher_out


class Pair(torch.nn.Module):
    def __init__(self, teacher: torch.nn.Module, student: torch.nn.Module):
        super().__init__()
        self.teacher, self.student = teacher, student


def test_the_teacher_is_left_out_and_the_student_kept():
    pair = Pair(torch.nn.Linear(2, 3), torch.nn.Linear(2, 3))
    state = pair.state_dict()
    record = leave_teacher_out(pair, pair.teacher, state)
    assert sorted(state) == ["student.bias", "student.weight"]
    assert record["in_checkpoint"] is False and record["modules"] == ["teacher"]
    assert record["tensors"] == 2


def test_a_teacher_that_is_the_student_stays():
    """Self-distillation: the teacher's weights are the student's, so they are the run's."""
    shared = torch.nn.Linear(2, 3)
    pair = Pair(shared, shared)
    state = pair.state_dict()
    record = leave_teacher_out(pair, pair.teacher, state)
    assert len(state) == 4 and record["in_checkpoint"] is True and record["tensors"] == 0


def test_a_teacher_outside_the_model_and_no_teacher_are_said():
    student = torch.nn.Linear(2, 3)
    state = student.state_dict()
    apart = leave_teacher_out(student, torch.nn.Linear(2, 3), state)
    unknown = leave_teacher_out(student, None, state)
    assert len(state) == 2
    assert (
        apart["in_checkpoint"] is False and apart["modules"] == [] and "not a part" in apart["why"]
    )
    assert unknown["in_checkpoint"] is None
