"""Packaging: the code under test is this checkout's, and an install carries the presets."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

import distill_guard

REPO = Path(__file__).resolve().parents[1]


def test_imports_come_from_this_checkout():
    """distill_guard is a namespace package (no __init__.py), so Python would merge any other
    distill_guard directory on sys.path into it: make sure every path is this checkout's."""
    paths = {Path(p).resolve() for p in distill_guard.__path__}
    assert paths == {REPO / "distill_guard"}
    for name in ("signals", "guard", "policy", "checks", "config", "cli"):
        module = importlib.import_module(f"distill_guard.{name}")
        assert Path(module.__file__).resolve().is_relative_to(REPO / "distill_guard")


def test_package_data_carries_the_hydra_presets():
    """compose_guard_config reads conf/*.yaml through pkg://distill_guard.conf; a wheel that
    leaves them out breaks every preset (and the replay CLI) once installed."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    package_data: dict[str, list[str]] = pyproject["tool"]["setuptools"].get("package-data", {})
    pkg_root = REPO / "distill_guard"
    needed = sorted(pkg_root.rglob("*.yaml"))
    assert needed, "no presets found: the test no longer looks in the right place"
    for f in needed:
        covered = any(  # setuptools globs each pattern relative to its package's directory
            f in set((REPO / Path(*package.split("."))).glob(pattern))
            for package, patterns in package_data.items()
            for pattern in patterns
        )
        assert covered, f"{f.relative_to(REPO)} is not in [tool.setuptools.package-data]"
