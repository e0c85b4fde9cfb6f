"""Packaging: the code under test is this checkout's; the wheel and sdist carry what the docs
tell users to use (the config groups, py.typed, the CLI, LICENSE, CHANGELOG)."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import distill_guard

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "distill_guard" / "conf"


def test_imports_come_from_this_checkout():
    """Any other distill_guard directory on sys.path (an old install) must not shadow or merge
    into this checkout's: every path is this checkout's."""
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


def test_one_version() -> None:
    """pyproject reads the version from distill_guard/_version.py; the CLI prints the same."""
    tomllib = pytest.importorskip("tomllib")
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"] and "version" in pyproject["project"]["dynamic"]
    attr = pyproject["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    module, _, name = attr.rpartition(".")
    assert getattr(importlib.import_module(module), name) == distill_guard.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+", distill_guard.__version__)
    changelog = (REPO / "CHANGELOG.md").read_text()
    assert f"## [{distill_guard.__version__}] - " in changelog


GROUPS = tuple(sorted(p.name for p in CONF.iterdir() if p.is_dir() and p.name != "__pycache__"))
_G = "|".join(GROUPS)
DOC_MENTIONS = (  # in code spans and blocks only: the config files a reader is told to use
    re.compile(rf"(?:distill_guard/)?(?:conf/)?\b({_G})/(\{{[\w,]+\}}|[\w*]+)\.yaml"),  # a path
    re.compile(rf"^\s*- ({_G}): (\w+)", re.M),  # a defaults list entry
    re.compile(rf"^[^(]*?(?:^|(?<=[\s`]))\+?({_G})=(\w+)", re.M),  # a command-line override
)


def _documented_configs() -> set[str]:
    """``<group>/<name>.yaml`` for every config README.md and docs/*.md point users to."""
    found: set[str] = set()
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for span in re.findall(r"```.*?```|`[^`\n]+`", doc.read_text(), re.S):
            for pattern in DOC_MENTIONS:
                for group, names in pattern.findall(span.strip("`")):
                    for name in names.strip("{}").split(","):
                        found |= {
                            f"{group}/{p.name}" for p in (CONF / group).glob(f"{name}.yaml")
                        } or {f"{group}/{name}.yaml"}  # a name that matches nothing stays, to fail
    return found


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> tuple[zipfile.ZipFile, tarfile.TarFile]:
    """The wheel and sdist of the working tree (tracked and new files, in a copy: no stale
    egg-info, no build/ in the checkout), built by setuptools' own PEP 517 hooks."""
    tmp = tmp_path_factory.mktemp("dist")
    src, out = tmp / "src", tmp / "out"
    src.mkdir()
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for rel in filter(None, files):
        if (REPO / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            (src / rel).write_bytes((REPO / rel).read_bytes())
    for hook in ("build_wheel", "build_sdist"):  # one process each: the hooks keep state
        subprocess.run(
            [sys.executable, "-c", f"import sys, setuptools.build_meta as b; b.{hook}(sys.argv[1])", str(out)],
            cwd=src, check=True, capture_output=True, timeout=120,
        )  # fmt: skip
    (wheel,) = out.glob("*.whl")
    (sdist,) = out.glob("*.tar.gz")
    return zipfile.ZipFile(wheel), tarfile.open(sdist)


def test_the_docs_name_configs_of_every_group() -> None:
    documented = _documented_configs()
    assert {c.split("/")[0] for c in documented} == set(GROUPS) == {"callbacks", "guard", "teacher"}
    assert {"guard/default.yaml", "guard/strict.yaml", "callbacks/default.yaml"} <= documented


def test_the_wheel_carries_what_the_docs_name_and_the_cli(dists) -> None:
    wheel, _ = dists
    names = set(wheel.namelist())
    shipped = {n.removeprefix("distill_guard/conf/") for n in names if n.endswith(".yaml")}
    missing = sorted(_documented_configs() - shipped)
    assert missing == [], f"configs the docs name but the wheel lacks: {missing}"
    every = {str(p.relative_to(CONF)) for p in CONF.rglob("*.yaml")}
    assert every <= shipped
    assert "distill_guard/py.typed" in names and "distill_guard/conf/__init__.py" in names
    dist_info = next(n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info"))
    assert dist_info == f"distill_guard-{distill_guard.__version__}.dist-info"
    entry_points = wheel.read(f"{dist_info}/entry_points.txt").decode()
    assert re.search(r"^distill-guard = distill_guard\.cli:main$", entry_points, re.M)
    assert wheel.read(f"{dist_info}/licenses/LICENSE") == (REPO / "LICENSE").read_bytes()
    metadata = wheel.read(f"{dist_info}/METADATA").decode()
    assert "License-Expression: Apache-2.0" in metadata
    requires = re.findall(r"^Requires-Dist: ([\w-]+)(.*)$", metadata, re.M)
    core = {name for name, rest in requires if "extra ==" not in rest}
    assert core == {"torch", "numpy", "hydra-core", "httpx"}  # wandb is not core


def test_the_sdist_carries_license_changelog_readme(dists) -> None:
    _, sdist = dists
    top = f"distill_guard-{distill_guard.__version__}"
    names = set(sdist.getnames())
    for name in ("LICENSE", "CHANGELOG.md", "README.md", "pyproject.toml"):
        assert f"{top}/{name}" in names, name
    assert f"{top}/distill_guard/conf/callbacks/default.yaml" in names


def test_license_is_the_full_apache_2_text() -> None:
    text = (REPO / "LICENSE").read_text()
    assert text.count("\n") == 202 and "END OF TERMS AND CONDITIONS" in text
    assert "Version 2.0, January 2004" in text and "9. Accepting Warranty or Additional" in text
