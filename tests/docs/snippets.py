"""The code blocks of README.md and docs/*.md, as the tests run them.

A fenced block tagged ``python``, ``bash`` (``sh``, ``shell``, ``console``) or ``yaml`` is a
snippet (a config: it must parse, and the setup of a snippet that uses it reads it); an untagged
block is output or a diagram and is not run. The line before a snippet may name its
setup, ``<!-- snippet: NAME -->`` (``tests/docs/setups.py``): the names the snippet takes from
its surroundings (a teacher, a loader), the placeholders it shows (a server URL, a model
directory) and what running it must have done. Every Python snippet names one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")))
RUN_LANGS = {
    "python": "python",
    "bash": "shell",
    "sh": "shell",
    "shell": "shell",
    "console": "shell",
    "yaml": "yaml",
}

_FENCE = re.compile(r"^```(\w*)[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
_MARKER = re.compile(r"<!--\s*snippet:\s*([\w.-]+)\s*-->\s*$")


@dataclass(frozen=True)
class Snippet:
    doc: str
    """The file, relative to the repository root."""
    line: int
    """The line of the opening fence."""
    kind: str
    """``python``, ``shell`` or ``yaml``."""
    setup: str | None
    """The setup named by the marker above it, if any."""
    code: str

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}" + (f"[{self.setup}]" if self.setup else "")


def snippets(docs: tuple[str, ...] = DOCS) -> list[Snippet]:
    found = []
    for doc in docs:
        text = (ROOT / doc).read_text(encoding="utf-8")
        for m in _FENCE.finditer(text):
            kind = RUN_LANGS.get(m.group(1))
            if kind is None:
                continue
            before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
            marker = _MARKER.search(before)
            line = text.count("\n", 0, m.start()) + 1
            found.append(Snippet(doc, line, kind, marker.group(1) if marker else None, m.group(2)))
    return found


def snippet(setup: str, doc: str = "README.md") -> str:
    """The code of the one snippet of ``doc`` with this setup."""
    (found,) = [s for s in snippets((doc,)) if s.setup == setup]
    return found.code
