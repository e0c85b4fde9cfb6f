"""One base: every exception distill_guard raises on purpose is a GuardError (and keeps its
built-in type, so ``except ValueError`` still catches bad input)."""

from __future__ import annotations

import ast
import builtins
import importlib
from pathlib import Path

import pytest
import torch

import distill_guard
from distill_guard.errors import GuardError, GuardRuntimeError, GuardTypeError, GuardValueError

PACKAGE = Path(distill_guard.__file__).parent

NOT_ERRORS = {
    "SystemExit",
    "KeyboardInterrupt",
    "StopIteration",
    "NotImplementedError",
    "ProcessKilled",
}
"""Raised on purpose but not errors of the caller's: exit codes, signals, the iterator protocol,
an abstract method, and the Engine stand-in's death of its host process
(``testing.engine_standin.ProcessKilled``, a BaseException so that nothing can catch it as an
error)."""


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _raised_names(tree: ast.AST) -> list[tuple[str, int, str | None]]:
    """``(exception name, line, enclosing function)`` of every ``raise Name(...)``/``raise Name``."""
    found = []

    def visit(node: ast.AST, func: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            inner = (
                child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else func
            )
            if isinstance(child, ast.Raise) and child.exc is not None:
                exc = child.exc.func if isinstance(child.exc, ast.Call) else child.exc
                if isinstance(exc, ast.Name) and exc.id[:1].isupper():
                    found.append((exc.id, child.lineno, func))
            visit(child, inner)

    visit(tree, None)
    return found


def _raises() -> list[tuple[str, str, int, str | None]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        out += [(_module_name(path), *r) for r in _raised_names(tree)]
    return out


def test_the_scan_sees_the_package():
    names = {name for _, name, _, _ in _raises()}
    assert {"GuardValueError", "TeacherError", "HistoryError"} <= names


def test_every_exception_raised_on_purpose_is_a_guard_error():
    offenders = []
    for module_name, name, line, func in _raises():
        if name in NOT_ERRORS:
            continue
        if name == "AttributeError" and func == "__getattr__":
            continue  # a module's lazy attributes: Python's own protocol (hasattr relies on it)
        module = importlib.import_module(module_name)
        cls = getattr(module, name, getattr(builtins, name, None))
        if not (isinstance(cls, type) and issubclass(cls, GuardError)):
            offenders.append(f"{module_name}:{line} raises {name}")
    assert offenders == []


@pytest.mark.parametrize(
    ("cls", "builtin"),
    [(GuardValueError, ValueError), (GuardTypeError, TypeError), (GuardRuntimeError, RuntimeError)],
)
def test_each_kind_is_both_a_guard_error_and_its_builtin(cls, builtin):
    with pytest.raises(GuardError):
        raise cls("x")
    with pytest.raises(builtin):
        raise cls("x")


def test_bad_input_from_a_public_call_is_caught_by_guard_error():
    logits = torch.zeros(1, 4)
    with pytest.raises(GuardError, match="beta must lie in"):
        distill_guard.distill_loss(logits, logits, beta=2.0)
    with pytest.raises(ValueError, match="beta must lie in"):  # and by what callers catch today
        distill_guard.distill_loss(logits, logits, beta=2.0)
