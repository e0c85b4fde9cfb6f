"""Print the docs' SGLang tables from the version table: ``python -m
distill_guard.teachers.version_docs`` gives ``docs/sglang-contract.md`` §7.2, ``--guard`` gives
``docs/teachers.md`` §7.1 (``tests/docs/test_sglang_table.py`` checks both are in the docs as
printed)."""

from __future__ import annotations

import sys

from distill_guard.teachers.capabilities import guard_table
from distill_guard.teachers.sglang_versions import markdown

if __name__ == "__main__":
    print(guard_table() if "--guard" in sys.argv[1:] else markdown())
