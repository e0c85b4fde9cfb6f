"""The code blocks of README.md and docs/*.md, as the tests run them.

A fenced block tagged ``python``, ``bash`` (``sh``, ``shell``, ``console``) or ``yaml`` is a
snippet (a config: it must parse, and the setup of a snippet that uses it reads it); an untagged
block is output or a diagram and is not run. The line before a snippet may name it,
``<!-- snippet: NAME -->``; ``tests/docs/setups.py`` has what the test does around it under that
name (the placeholders it shows, such as a server URL or a model directory, a server to answer,
and what running it must have done), never a name for its code: a Python snippet runs in a
namespace of its own, with nothing in it. Every Python snippet is named.

What a snippet needs from the user's side (a teacher, a loader, an optimizer) the docs show, in
a Python block marked ``<!-- snippet: NAME setup -->`` above it: that block is the snippet's
*set-up*, run first in the same namespace, and not a test of its own.
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
_MARKER = re.compile(r"<!--\s*snippet:\s*([\w.-]+)(\s+setup)?\s*-->\s*$")


@dataclass(frozen=True)
class Snippet:
    doc: str
    """The file, relative to the repository root."""
    line: int
    """The line of the opening fence."""
    kind: str
    """``python``, ``shell`` or ``yaml``."""
    setup: str | None
    """The name the marker above it gives, if any (its setup in ``tests/docs/setups.py``)."""
    code: str
    prelude: str = ""
    """The code of its set-up blocks (``<!-- snippet: NAME setup -->``), in order: run first."""

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}" + (f"[{self.setup}]" if self.setup else "")


def snippets(docs: tuple[str, ...] = DOCS) -> list[Snippet]:
    """The snippets of ``docs``, each with its set-up blocks as its prelude. A set-up block that
    is not Python, or that no snippet of its name follows in the same file, is an error."""
    found = []
    for doc in docs:
        text = (ROOT / doc).read_text(encoding="utf-8")
        pending: dict[str, list[str]] = {}
        for m in _FENCE.finditer(text):
            kind = RUN_LANGS.get(m.group(1))
            if kind is None:
                continue
            before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
            marker = _MARKER.search(before)
            line = text.count("\n", 0, m.start()) + 1
            name = marker.group(1) if marker else None
            if marker and marker.group(2):
                if kind != "python":
                    raise ValueError(f"{doc}:{line}: a set-up block ({name}) must be python")
                pending.setdefault(name, []).append(m.group(2))
                continue
            prelude = "".join(pending.pop(name, [])) if name else ""
            found.append(Snippet(doc, line, kind, name, m.group(2), prelude))
        if pending:
            raise ValueError(
                f"{doc}: set-up blocks with no snippet of their name after them: {sorted(pending)}"
            )
    return found


def snippet(setup: str, doc: str = "README.md") -> str:
    """The code of the one snippet of ``doc`` with this setup (without its set-up blocks)."""
    (found,) = [s for s in snippets((doc,)) if s.setup == setup]
    return found.code
