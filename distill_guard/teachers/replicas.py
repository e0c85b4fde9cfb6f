"""A teacher made of replicas: each replica's direct address and the client that talks to it.

Behind a router, a canary sent through the router reaches one replica of several, and a repair
sent through it cannot aim at the one that needs it. So the guard knows every replica's own
address, given by the user or read from the router's worker list (``GET /workers``), and checks,
repairs and sleeps each one there, never through the router; the router is told only which
replicas get traffic (:mod:`distill_guard.live.replicas`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from distill_guard.errors import GuardValueError
from distill_guard.teachers.base import Teacher

if TYPE_CHECKING:
    from distill_guard.teachers.sglang_router import SGLangRouter

TeacherFactory = Callable[[str], Teacher]
"""Makes the client of one replica from its direct address (default:
:class:`~distill_guard.teachers.sglang_http.SGLangHTTPTeacher`)."""


@dataclass
class Replica:
    """One replica of the teacher."""

    url: str
    """Its direct address (the router's worker URL), never the router's."""
    teacher: Teacher
    """The client the guard scores, sleeps, wakes and reloads it through."""

    @property
    def name(self) -> str:
        """``host:port``, for tables and messages."""
        return self.url.split("://", 1)[-1]


def replica_urls(urls: Iterable[str] = (), router: SGLangRouter | None = None) -> list[str]:
    """The replicas' direct addresses: ``urls`` in order, then the router's workers not among
    them. None at all, or a URL given twice, is a :class:`GuardValueError` (one replica checked
    twice would be slept twice, and a second release kills SGLang)."""
    out: list[str] = []
    for url in urls:
        base = url.rstrip("/")
        if base in out:
            raise GuardValueError(f"replica {base} is given twice: each replica is named once")
        out.append(base)
    if router is not None:
        out += [w.url for w in router.workers() if w.url not in out]
    if not out:
        where = f" and router {router.url} lists no worker" if router is not None else ""
        raise GuardValueError(f"a replicated teacher needs at least one replica URL{where}")
    return out


def make_replicas(
    urls: Sequence[str], factory: TeacherFactory | None = None, **teacher_kw: object
) -> list[Replica]:
    """One :class:`Replica` per address, each with its own client (``factory(url)``, default
    :class:`~distill_guard.teachers.sglang_http.SGLangHTTPTeacher` with ``teacher_kw``)."""
    if factory is None:
        from distill_guard.teachers.sglang_http import SGLangHTTPTeacher

        def factory(url: str) -> Teacher:
            return SGLangHTTPTeacher(url, **teacher_kw)  # type: ignore[arg-type]

    return [Replica(url, factory(url)) for url in replica_urls(urls)]
