"""docs/architecture.md matches the tree: every module of the package is in its Modules table,
and every module the table names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "distill_guard"
NOT_LISTED = {"__init__.py", "__main__.py", "_version.py"}


def _modules_table() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    return text.split("## Modules", 1)[1].split("\n## ", 1)[0]


def _named(table: str) -> set[str]:
    return set(re.findall(r"`([A-Za-z_]+\.py)`", table))


def test_every_module_is_in_the_table():
    named = _named(_modules_table())
    missing = sorted(
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if p.name not in NOT_LISTED and p.name not in named
    )
    assert missing == []


def test_every_module_the_table_names_exists():
    present = {p.name for p in PACKAGE.rglob("*.py")}
    assert sorted(_named(_modules_table()) - present) == []


def test_every_package_folder_is_in_the_table():
    table = _modules_table()
    folders = sorted(
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("__init__.py")
        if p.parent != PACKAGE and p.parent.name != "conf"
    )
    assert [f for f in folders if f"`{Path(f).parent.name}/`" not in table] == []
