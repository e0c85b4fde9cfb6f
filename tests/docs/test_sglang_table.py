"""The SGLang version tables in the docs are the package's own data, verbatim: the table the
clients, capabilities and reference server are derived from, and what the guard does per version."""

from __future__ import annotations

from pathlib import Path

from distill_guard.teachers.capabilities import guard_table
from distill_guard.teachers.sglang_versions import FACTS, markdown

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_the_contract_holds_the_version_table_as_the_code_has_it() -> None:
    text = (DOCS / "sglang-contract.md").read_text()
    assert markdown() in text, "regenerate: python -m distill_guard.teachers.version_docs"
    for fact in FACTS:  # a row per fact, each with where it was read
        assert f"| {fact.what} |" in text and fact.cite


def test_teachers_md_says_what_the_guard_does_on_each_version() -> None:
    assert guard_table() in (DOCS / "teachers.md").read_text()
