"""Probe every replica of a teacher, each at its own address: ``distill-guard probe --url A
--url B ...`` or ``--router URL`` (its workers' addresses, ``GET /workers``).

Each replica gets the probe of one teacher (:func:`~distill_guard.live.probe.run_probe`:
preflight, sleep/wake cycles with its own canary, a repair of what a cycle broke), one after the
other, so a probe never leaves a replica worse than it found it. Through the router a canary
would reach one replica of several; the router is only read, never told anything.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from distill_guard.findings import Severity
from distill_guard.live.canary import Canary
from distill_guard.live.probe import CycleReport, ProbeReport, cycle_result, run_probe
from distill_guard.teachers.base import Teacher, TeacherError

Connect = Callable[[str], AbstractContextManager[Teacher]]
"""Opens the client of one replica from its address."""


@dataclass
class ReplicaProbe:
    """One replica's probe: its report, or why it could not be probed."""

    url: str
    report: ProbeReport | None = None
    error: str | None = None
    """Set when the replica could not be probed (no answer, no release possible): failed."""

    @property
    def ok(self) -> bool:
        return self.error is None and self.report is not None and self.report.ok

    @property
    def result(self) -> str:
        """The table's result column: ``healthy``, the codes it failed on, or the error."""
        if self.error is not None:
            return f"NOT PROBED: {self.error}"
        assert self.report is not None
        if self.report.ok:
            return "healthy"
        lost = next((c for c in self.report.cycles if c.lost_weights), None)
        codes = cycle_result(lost) if lost is not None else ""
        if not codes:
            bad = {f.code for f in self.report.findings if f.severity >= Severity.CRITICAL}
            codes = ", ".join(sorted(bad))
        repaired = " (repaired and verified)" if self.report.repaired else ""
        return f"UNHEALTHY: {codes}{repaired}"

    def to_json(self) -> dict[str, Any]:
        body = self.report.to_json() if self.report is not None else {}
        return {"url": self.url, **body, "ok": self.ok, "error": self.error}


@dataclass
class FleetProbe:
    """Every replica's probe; ``to_json()`` is ``probe --json`` with several replicas."""

    replicas: list[ReplicaProbe] = field(default_factory=list)
    router: str | None = None
    """The router the addresses were read from, if any."""

    @property
    def ok(self) -> bool:
        return bool(self.replicas) and all(r.ok for r in self.replicas)

    @property
    def exit_code(self) -> int:
        """0 every replica healthy; 1 any failed, or could not be probed."""
        return 0 if self.ok else 1

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "router": self.router,
            "replicas": [r.to_json() for r in self.replicas],
        }


def probe_replicas(
    urls: Sequence[str],
    connect: Connect,
    *,
    cycles: int,
    canary: Canary,
    tags: Sequence[str] | None = None,
    repair: bool = True,
    router: str | None = None,
    on_replica: Callable[[str], None] | None = None,
    on_cycle: Callable[[str, CycleReport], None] | None = None,
) -> FleetProbe:
    """Probe each replica in turn, each with a canary of its own (``canary``'s check): a
    replica that cannot be probed is reported and the others still are."""
    fleet = FleetProbe(router=router)
    for url in urls:
        if on_replica is not None:
            on_replica(url)
        own = Canary(canary.check)
        hook = (lambda c, _u=url: on_cycle(_u, c)) if on_cycle is not None else None
        try:
            with connect(url) as teacher:
                report = run_probe(teacher, cycles, tags, own, repair=repair, on_cycle=hook)
        except TeacherError as e:
            fleet.replicas.append(ReplicaProbe(url, error=f"{type(e).__name__}: {e}"))
            continue
        fleet.replicas.append(ReplicaProbe(url, report))
    return fleet


def format_fleet(fleet: FleetProbe, cycles: int, canary: Canary) -> str:
    """What ``distill-guard probe`` prints for several replicas: a row per replica, then each
    failed replica's findings, then the verdict."""
    source = f" (the workers of router {fleet.router})" if fleet.router else ""
    lines = [
        f"probe of {len(fleet.replicas)} replica(s){source}, each at its own address: "
        f"{cycles} sleep/wake cycle(s), canary of {canary.length} tokens, top-{canary.top_k}"
    ]
    width = max(len("replica"), *(len(r.url) for r in fleet.replicas))
    head = f"{'replica':<{width}}  {'cycles':>6}  {'lost weights':>12}  {'repaired':>8}  result"
    lines += [head, "-" * len(head)]
    for r in fleet.replicas:
        rep = r.report
        ran = str(len(rep.cycles)) if rep else "-"
        lost = ("yes" if any(c.lost_weights for c in rep.cycles) else "no") if rep else "-"
        fixed = ("yes" if rep.repaired else "no") if rep else "-"
        lines.append(f"{r.url:<{width}}  {ran:>6}  {lost:>12}  {fixed:>8}  {r.result}")
    for r in fleet.replicas:
        if r.ok or r.report is None:
            continue
        lines.append(f"findings of {r.url}:")
        lines += [
            f"  [{f.severity.value.upper():8}] {f.code}: {f.message}" for f in r.report.findings
        ]
    failed = [r.url for r in fleet.replicas if not r.ok]
    verdict = (
        "healthy"
        if fleet.ok
        else f"UNHEALTHY: {len(failed)} of {len(fleet.replicas)} replica(s) failed "
        f"({', '.join(failed)})"
    )
    lines.append(f"result: {verdict} (exit {fleet.exit_code})")
    return "\n".join(lines)
