"""Teachers the guard can talk to: SGLang over HTTP, an in-process sglang.Engine, a torch model."""

from distill_guard.teachers.base import (
    ALL_TAGS,
    ScoreResult,
    SleepState,
    Teacher,
    TeacherError,
    TeacherHTTPError,
    TeacherStateError,
    TeacherUnreachable,
    TrackedTeacher,
)
from distill_guard.teachers.sglang_engine import SGLangEngineTeacher
from distill_guard.teachers.sglang_http import SGLangHTTPTeacher
from distill_guard.teachers.torch_teacher import TorchTeacher, read_vocab_size

__all__ = [
    "ALL_TAGS",
    "SGLangEngineTeacher",
    "SGLangHTTPTeacher",
    "ScoreResult",
    "SleepState",
    "Teacher",
    "TeacherError",
    "TeacherHTTPError",
    "TeacherStateError",
    "TeacherUnreachable",
    "TorchTeacher",
    "TrackedTeacher",
    "read_vocab_size",
]
