"""What a checkpoint saved after a halt keeps of the teacher (``integrations/callback.py``)."""

from __future__ import annotations

import torch

from distill_guard.integrations.callback import leave_teacher_out, teacher_in_model


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


def test_a_teacher_inside_a_model_saved_whole_is_said_to_be_in_it():
    """What the HF callback records (and warns of) for a Trainer whose ``model`` holds the
    teacher: the checkpoint has its weights, and the resume must load them from the source."""
    pair = Pair(torch.nn.Linear(2, 3), torch.nn.Linear(2, 3))
    inside = teacher_in_model(pair, pair.teacher)
    assert inside["in_checkpoint"] is True and inside["modules"] == ["teacher"]
    assert "load the teacher's weights from its own checkpoint" in inside["why"]
    assert teacher_in_model(pair.student, pair.teacher)["in_checkpoint"] is False
