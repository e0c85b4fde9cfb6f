"""What an SGLang server can do, from the ``version`` in ``/get_server_info`` (every version has it).

The table is read from SGLang's released wheels (``docs/sglang-contract.md`` §7.2). Whether a
server has ``/server_info`` does not tell whether it honours memory tags: 0.4.8–0.5.5 honour tags
and have no ``/server_info``. An unknown version gets the conservative reading, and says so: tags
ignored (every release and resume acts on everything), no ``/model_info``, no checksum.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ALL_THREE = ("weights", "kv_cache", "cuda_graph")


@dataclass(frozen=True)
class Capabilities:
    """The SGLang features the guard relies on, for one server version."""

    version: str | None
    known: bool
    """The version parsed as an SGLang release the table covers."""
    tags: bool
    """``release`` / ``resume_memory_occupation`` honour ``tags`` (else they act on everything)."""
    default_tags: tuple[str, ...]
    """What an untagged release or resume acts on."""
    cuda_graph_tag: bool
    """``cuda_graph`` is a memory tag."""
    weights_cpu_backup: bool
    """The ``enable_weights_cpu_backup`` server argument exists."""
    server_info: bool
    """``/server_info`` and ``/model_info`` exist (else ``/get_server_info``, ``/get_model_info``)."""
    checksum: bool
    """``/weights_checker {"action": "checksum"}`` exists."""

    @property
    def memory_tags(self) -> tuple[str, ...]:
        """The tags a request may name on this version."""
        return ALL_THREE if self.cuda_graph_tag else ("weights", "kv_cache")

    @property
    def note(self) -> str:
        if self.known:
            return f"SGLang {self.version}"
        return (
            f"unknown server version {self.version!r}: treated conservatively (memory tags "
            "ignored, so every release and resume acts on everything; no /model_info; no checksum)"
        )


def parse_version(text: str | None) -> tuple[int, int, int] | None:
    """``"0.5.23"``, ``"v0.5.6.post2"``, ``"0.5.5rc1"`` → (0, 5, 23) …; None if not a version."""
    m = re.fullmatch(
        r"\s*v?(\d+)\.(\d+)\.(\d+)(?:[.+\-]?(?:post|rc|dev|a|b)?\d*.*)?\s*", text or ""
    )
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def capabilities_for(version: str | None) -> Capabilities:
    """The capability row of ``version`` (``docs/sglang-contract.md`` §7.2)."""
    v = parse_version(version)
    if v is None or v < (0, 4, 7):
        return Capabilities(version, False, False, ALL_THREE[:2], False, False, False, False)
    return Capabilities(
        version=version,
        known=True,
        tags=v >= (0, 4, 8),
        default_tags=ALL_THREE[:2] if v < (0, 5, 5) else ALL_THREE,
        cuda_graph_tag=v >= (0, 5, 5),
        weights_cpu_backup=v >= (0, 5, 3),
        server_info=v >= (0, 5, 6),
        checksum=v >= (0, 5, 23),
    )
