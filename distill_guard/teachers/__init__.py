"""Teachers the guard can talk to: SGLang over HTTP, an in-process ``sglang.Engine``, a torch model.

The protocol, its result and error types come from :mod:`.base` (torch only). Each backend is
imported when first named, so ``import distill_guard.teachers`` pulls in neither httpx nor
transformers nor sglang.
"""

from importlib import import_module
from typing import Any

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
    read_vocab_size,
)

_BACKENDS = {
    "SGLangEngineTeacher": "distill_guard.teachers.sglang_engine",
    "SGLangHTTPTeacher": "distill_guard.teachers.sglang_http",
    "TorchTeacher": "distill_guard.teachers.torch_teacher",
}

# fmt: off
__all__ = [
    "ALL_TAGS", "SGLangEngineTeacher", "SGLangHTTPTeacher", "ScoreResult", "SleepState",
    "Teacher", "TeacherError", "TeacherHTTPError", "TeacherStateError", "TeacherUnreachable",
    "TorchTeacher", "TrackedTeacher", "read_vocab_size",
]
# fmt: on


def __getattr__(name: str) -> Any:
    if name in _BACKENDS:
        return getattr(import_module(_BACKENDS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
