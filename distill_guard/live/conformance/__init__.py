"""``distill-guard probe --conformance``: every assumption the guard makes of a live SGLang teacher,
checked on the user's own server without harming it, as a table to paste into a bug report.

The assumptions are the version table's (:mod:`distill_guard.teachers.sglang_versions`) and the
capability row derived from it (:func:`~distill_guard.teachers.capabilities.capabilities_for`).
Each check is a function of the run that returns its rows; the teacher calls are in the checks,
the formatting (:func:`format_conformance`) makes none.

Nothing that can harm the server is sent: every release and resume is the guard's own
(:class:`~distill_guard.live.colocate.ColocatedTeacher`, so ``/pause_generation`` only inside
its sleep, and no release where that version's sleep is not safe); ``/weights_checker`` only
with ``checksum`` and only where the version has it (an action a version does not know reaches
its scheduler); the pause route is probed with ``POST /continue_generation {}`` alone; nothing at
all once the sleep state cannot be known. What a cycle broke is repaired before the next check,
and an interrupted run puts the teacher back (:func:`distill_guard.live.probe.restore`).

The package, one job a module: :mod:`.report` (the rows, the report, the table, redaction),
:mod:`.state` (what the checks share of a run), :mod:`.cycle` (one guard sleep and wake, and its
repair), :mod:`.server_checks` (version, routes, auth, backup) and :mod:`.cycle_checks` (tags,
weights, full cycles, checksum, temperature, left as found); here, the order they run in
(:data:`CHECKS`) and the run (:func:`run_conformance`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from distill_guard.live.canary import Canary
from distill_guard.live.conformance.cycle_checks import (
    check_checksum,
    check_cycles,
    check_left_as_found,
    check_tags,
    check_temperature,
    check_weights,
)
from distill_guard.live.conformance.report import (
    PRECONDITION,
    ConformanceReport,
    ConformanceRow,
    Result,
    format_conformance,
    model_name,
    redact_url,
    scrub,
    url_secrets,
)
from distill_guard.live.conformance.server_checks import (
    check_auth,
    check_backup,
    check_routes,
    check_version,
    checksum_shape,
)
from distill_guard.live.conformance.state import Run
from distill_guard.live.preflight import preflight_teacher
from distill_guard.live.probe import ProbeReport, restore
from distill_guard.teachers.base import Teacher, TeacherError, TeacherStateError, unknown_state
from distill_guard.teachers.capabilities import capabilities_for
from distill_guard.teachers.sglang_http import SGLangHTTPTeacher

__all__ = [
    "CHECKS",
    "PRECONDITION",
    "ConformanceReport",
    "ConformanceRow",
    "Result",
    "check_auth",
    "check_backup",
    "check_checksum",
    "check_cycles",
    "check_left_as_found",
    "check_routes",
    "check_tags",
    "check_temperature",
    "check_version",
    "check_weights",
    "checksum_shape",
    "format_conformance",
    "model_name",
    "redact_url",
    "run_conformance",
    "scrub",
    "url_secrets",
]

CHECKS: tuple[Callable[[Run], list[ConformanceRow]], ...] = (
    check_version,
    check_routes,
    check_auth,
    check_backup,
    check_tags,
    check_weights,
    check_cycles,
    check_checksum,
    check_temperature,
)
"""The checks, in the order they run; ``check_left_as_found`` always runs last."""


def _start(teacher: Teacher, canary: Canary, cycles: int, temperature: float) -> Run:
    """What the teacher is before anything is released; a failure here raises
    (:class:`TeacherError`: nothing was touched)."""
    if teacher.asleep or unknown_state(teacher):
        raise TeacherStateError(
            f"the conformance probe needs a teacher known awake: {PRECONDITION}"
        )
    http = teacher if isinstance(teacher, SGLangHTTPTeacher) else None
    info = teacher.server_info()
    caps = http.capabilities if http is not None else capabilities_for(info.get("version"))
    preflight = preflight_teacher(teacher)
    first = canary.measure(teacher, step=0)
    broken = canary.judge(first, teacher)
    return Run(teacher, canary, caps, info, http, first, broken, preflight, cycles, temperature)


def _check_name(check: Callable[..., Any]) -> str:
    return check.__name__.removeprefix("check_")


def run_conformance(
    teacher: Teacher,
    canary: Canary | None = None,
    *,
    cycles: int = 1,
    temperature: float = 2.0,
) -> ConformanceReport:
    """Every check of :data:`CHECKS` on ``teacher``, then :func:`check_left_as_found`.

    Works on any :class:`~distill_guard.teachers.Teacher`; the HTTP rows (routes, auth) are
    skipped in process. Raises :class:`TeacherError` when the probe cannot start (no answer, a
    401 on ``/get_server_info``, a canary that cannot be scored): nothing was released then. A
    check whose teacher call fails is a FAIL row; on an interruption (Ctrl-C) or any other
    exception the teacher is put back as ``probe`` puts it back, and the exception goes on.
    """
    canary = canary if canary is not None else Canary()
    run = _start(teacher, canary, cycles, temperature)
    http = run.http
    url = http.url if http is not None else None
    in_url = url_secrets(url)
    report = ConformanceReport(
        url=redact_url(url),
        sglang_version=run.caps.version,
        model=model_name(run.info.get("model_path")),
    )
    try:
        for check in CHECKS:
            if run.halted:
                break
            try:
                report.rows += check(run)
            except TeacherError as e:
                report.rows.append(
                    ConformanceRow(_check_name(check), "", f"error: {e}", Result.FAIL)
                )
        report.rows.append(check_left_as_found(run))
    except BaseException:
        if run.colocated:
            restore(run.colocated[-1], ProbeReport(), None)
        raise
    report.rows = [
        ConformanceRow(r.check, r.assumes, _redacted(r.observed, http, in_url), r.result)
        for r in report.rows
    ]
    return report


def _redacted(text: str, http: SGLangHTTPTeacher | None, in_url: list[str]) -> str:
    """``text`` without the client's keys (:meth:`SGLangHTTPTeacher.scrub`, first, so that a
    key is replaced whole) and without the URL's userinfo and query."""
    return scrub(http.scrub(text) if http is not None else text, in_url)
