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
and an interrupted run puts the teacher back (:func:`distill_guard.live.probe._restore`).
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from distill_guard._version import __version__
from distill_guard.checks.canary import CanaryMeasurement
from distill_guard.findings import Code, Finding, Severity
from distill_guard.live.canary import Canary
from distill_guard.live.colocate import ColocatedTeacher
from distill_guard.live.preflight import preflight_teacher
from distill_guard.live.probe import ProbeReport, _restore
from distill_guard.live.teacher_temperature import measure_temperature, takes_temperature
from distill_guard.teachers._sglang_wire import score_request
from distill_guard.teachers.base import Teacher, TeacherError, TeacherHTTPError, TeacherStateError
from distill_guard.teachers.capabilities import (
    Capabilities,
    SleepPlan,
    capabilities_for,
    plan_sleep,
)
from distill_guard.teachers.sglang_engine import SGLangEngineTeacher
from distill_guard.teachers.sglang_http import SGLangHTTPTeacher
from distill_guard.teachers.sglang_versions import NEWEST_READ, OLDEST_READ, Checksum, Pause

PRECONDITION = (
    "the teacher must be awake when probed, and nothing else may release or pause it meanwhile "
    "(SGLang cannot be asked whether it is released, and a scoring call on a released server "
    "kills it)"
)
IN_PROCESS = "in process: no HTTP"
TABLE_SPAN = f"{'.'.join(map(str, OLDEST_READ))}–{'.'.join(map(str, NEWEST_READ))}"


class Result(enum.Enum):
    """A row's verdict."""

    PASS = "pass"
    FAIL = "FAIL"
    SKIPPED = "skipped"
    WARN = "warn"


@dataclass(frozen=True)
class ConformanceRow:
    """One check: what the guard assumes of the server, what the server did."""

    check: str
    assumes: str
    observed: str
    result: Result

    def to_dict(self) -> dict[str, str]:
        return {
            "check": self.check,
            "assumes": self.assumes,
            "observed": self.observed,
            "result": self.result.value,
        }


@dataclass
class ConformanceReport:
    """The rows of one conformance run and what identifies the server (secrets redacted)."""

    url: str
    sglang_version: str | None
    model: str | None
    rows: list[ConformanceRow] = field(default_factory=list)
    distill_guard_version: str = __version__

    @property
    def failed(self) -> list[ConformanceRow]:
        return [r for r in self.rows if r.result is Result.FAIL]

    @property
    def exit_code(self) -> int:
        """0 when nothing FAILs, 1 when something does."""
        return 1 if self.failed else 0

    @property
    def verdict(self) -> str:
        counts = {r: sum(row.result is r for row in self.rows) for r in Result}
        tally = ", ".join(f"{n} {r.value}" for r, n in counts.items() if n)
        if self.failed:
            names = ", ".join(r.check for r in self.failed)
            return (
                f"verdict: FAIL: the server does not behave as the guard assumes ({names}); "
                f"{tally} (exit 1)"
            )
        return f"verdict: the server behaves as the guard assumes; {tally} (exit 0)"

    def to_json(self) -> dict[str, Any]:
        return {
            "distill_guard": self.distill_guard_version,
            "url": self.url,
            "sglang_version": self.sglang_version,
            "model": self.model,
            "precondition": PRECONDITION,
            "ok": not self.failed,
            "rows": [r.to_dict() for r in self.rows],
            "verdict": self.verdict,
        }


# -- the run's state -------------------------------------------------------------------------


@dataclass
class _Cycle:
    """What one guard sleep and wake did."""

    skipped: str | None = None
    """Not released: the guard's sleep found it unsafe this time (never forced)."""
    failed: str | None = None
    """The guard's own sleep or wake failed, or the wake could not be verified."""
    lost: list[Finding] = field(default_factory=list)
    """What showed the weights lost after the wake (the canary, the checksum, the config)."""
    repair: str | None = None
    """How the repair went, where one ran."""
    repaired: bool = True
    max_delta: float | None = None
    checksum_before: str | None = None
    checksum_after: str | None = None


@dataclass
class _Run:
    """One conformance run: the teacher, what it said at the start, and what the checks saw."""

    teacher: Teacher
    canary: Canary
    caps: Capabilities
    info: dict[str, Any]
    http: SGLangHTTPTeacher | None
    first: CanaryMeasurement
    broken: list[Finding]
    preflight: list[Finding]
    cycles: int
    temperature: float
    step: int = 0
    colocated: list[ColocatedTeacher] = field(default_factory=list)
    done: list[_Cycle] = field(default_factory=list)
    continue_status: int | None = None
    halted: str | None = None
    """Why nothing more is sent (the sleep state cannot be known)."""

    @property
    def keeps_weights(self) -> bool:
        """The server keeps its weights across a release, by its own arguments (preflight)."""
        lost = (Code.CONFIG_NO_WEIGHTS_BACKUP, Code.CONFIG_BACKUP_DISABLED_BY_CACHE_MODE)
        return not any(f.code in lost for f in self.preflight)

    def agree(self, ok: bool) -> Result:
        """A disagreement with the table FAILs where the table covers the version; on another
        version the guard already assumes the least, so it is a warning."""
        return Result.PASS if ok else Result.FAIL if self.caps.known else Result.WARN


# -- small helpers ---------------------------------------------------------------------------


def redact_url(url: str | None) -> str:
    """The URL with any userinfo and query replaced (a password or token may sit there)."""
    if not url:
        return "in process"
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port else "")
    if parts.username or parts.password:
        netloc = "<redacted>@" + netloc
    query = "<redacted>" if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def url_secrets(url: str | None) -> list[str]:
    """The userinfo of a URL, in every form a message may quote it."""
    if not url:
        return []
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0] if "@" in parts.netloc else ""
    found = [userinfo, parts.password or "", parts.query]
    return sorted({s for s in found if s}, key=len, reverse=True)


def scrub(text: str, secrets: list[str]) -> str:
    """Every secret in ``text`` replaced; one shorter than 6 characters only where it stands as
    a token of its own, so that it does not eat the letters of the words around it."""
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) >= 6:
            text = text.replace(secret, "<redacted>")
        else:
            text = re.sub(rf"(?<![\w.~+=-]){re.escape(secret)}(?![\w.~+=-])", "<redacted>", text)
    return text


def model_name(path: Any) -> str | None:
    """The served model's last path part: the rest of a path may name a user or a mount."""
    if not path:
        return None
    return PurePosixPath(str(path).replace("\\", "/").rstrip("/")).name or None


def _num(x: float | None) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.3g}"


def _codes(findings: list[Finding]) -> str:
    return ", ".join(sorted({f.code for f in findings})) or "no finding"


def _tolerance(run: _Run) -> str:
    check = run.canary.check
    if run.canary.is_deterministic(run.teacher):
        return f"bit-exact (≤ {check.deterministic_tolerance:g}, deterministic inference)"
    return f"mean {check.tolerance_mean:g}, max {check.tolerance_max:g} nats"


def _awake(run: _Run) -> bool:
    """Known awake by the guard's own tracking: only then may anything reach its memory."""
    return not run.teacher.asleep and not getattr(run.teacher, "state_unknown", None)


def _status(http: SGLangHTTPTeacher, path: str, body: Any, headers: dict[str, str]) -> int:
    """One POST outside the client (its own headers, no retry); only the status is kept, so
    nothing of the answer (a key a server echoes) can reach the output."""
    try:
        resp = http._client.post(path, json=body, headers=headers, timeout=http.timeout_s)
    except httpx.TransportError as e:
        raise TeacherError(f"{path}: no answer ({type(e).__name__})") from None
    return resp.status_code


def _key_names(http: SGLangHTTPTeacher) -> str:
    """Which keys the client sends, by the names of their variables (never their values)."""
    api = f"${http._key_env}" if http._key_env else "no variable"
    api += " (set)" if http._headers else " (unset: no key sent)"
    admin = (
        f"${http._admin_key_env} on admin routes"
        if http._admin_key_env
        else "no admin key (admin routes get the api key)"
    )
    return f"{api}; {admin}"


# -- the guard's sleep and wake, one cycle -----------------------------------------------------


def _checksum(run: _Run) -> str | None:
    """The weights checksum, where the version has one and the teacher is known awake."""
    read = getattr(run.teacher, "checksum", None)
    if not callable(read) or not run.caps.checksum or not _awake(run):
        return None
    try:
        return read()
    except TeacherError:
        return None


def _cycle(run: _Run, tags: list[str] | None) -> _Cycle:
    """One guard sleep and wake of ``tags``; whatever the wake broke is repaired at once."""
    run.step += 1
    colocated = ColocatedTeacher(
        run.teacher, run.canary, repair_attempts=3, repair_backoff_s=0.5, tags=tags
    )
    run.colocated.append(colocated)
    out = _Cycle(checksum_before=_checksum(run))
    slept = colocated.sleep(run.step)
    if _halt_if_unknown(run, out):
        return out
    if not colocated.asleep:
        skipped = [f for f in slept if f.code == Code.TEACHER_RELEASE_SKIPPED]
        if skipped:
            out.skipped = skipped[0].message
        else:
            out.failed = "not released: " + (slept[-1].message if slept else "no finding")
        return out
    run.canary.last_comparison = None
    woke = colocated.wake(run.step)
    if _halt_if_unknown(run, out):
        return out
    cmp = run.canary.last_comparison
    out.max_delta = cmp.max_abs_delta if cmp is not None else None
    critical = [f for f in woke if f.severity >= Severity.CRITICAL]
    if colocated.asleep:
        out.failed = "the resume failed: " + (critical[0].message if critical else "asleep")
    elif critical or colocated.held:
        out.lost = critical
    elif cmp is None:
        out.failed = "the wake was not verified: " + (woke[0].message if woke else "no canary")
        return out
    else:
        out.checksum_after = _checksum(run)
        return out
    _repair(run, colocated, out, woke)
    return out


def _repair(run: _Run, colocated: ColocatedTeacher, out: _Cycle, cause: list[Finding]) -> None:
    """The guard's repair (resume, reload, checksum, flush, canary), as its wake would run it."""
    outcome, _ = colocated.repair(run.step, cause)
    out.repaired = outcome.ok
    if outcome.ok:
        out.repair = f"repaired in {outcome.attempts} attempt(s), {outcome.seconds:.2f} s"
        out.checksum_after = _checksum(run)
    else:
        why = outcome.findings[0].message if outcome.findings else "no finding"
        out.repair = f"NOT repaired ({why})"
    _halt_if_unknown(run, out)


def _halt_if_unknown(run: _Run, out: _Cycle) -> bool:
    """The sleep state cannot be known any more: nothing more is sent to the teacher."""
    unknown = getattr(run.teacher, "state_unknown", None)
    if unknown:
        run.halted = str(unknown)
        out.failed = out.failed or f"the sleep state is unknown: {unknown}"
    return bool(unknown)


def _why_not_cycled(run: _Run) -> str | None:
    """Why no release is tried at all: a teacher broken before, or a version on which the
    guard's sleep never releases (never forced)."""
    if run.broken:
        return f"the teacher was broken before the first sleep ({_codes(run.broken)}): not cycled"
    if run.http is not None and plan_sleep(run.caps) is SleepPlan.NEVER:
        return f"{run.caps.note}: the guard's sleep is {SleepPlan.NEVER.value}"
    return None


def _lost_text(out: _Cycle) -> str:
    return f"lost, {out.repair} ({_codes(out.lost)})"


def _cycle_row(name: str, assumes: str, out: _Cycle) -> ConformanceRow | None:
    """The row of a cycle that was not released or did not complete; None when it did."""
    if out.skipped:
        return ConformanceRow(name, assumes, f"not released: {out.skipped}", Result.SKIPPED)
    if out.failed:
        repaired = f"; {out.repair}" if out.repair else ""
        return ConformanceRow(name, assumes, out.failed + repaired, Result.FAIL)
    return None


# -- the checks, in order ------------------------------------------------------------------------


def check_version(run: _Run) -> list[ConformanceRow]:
    """The version the server names, and the capability row the guard will use for it."""
    caps = run.caps
    if run.http is not None:
        sleep = f"sleep {plan_sleep(caps).name}"
    else:
        sleep = "in process: released at once where the trainer calls sleep (no pause)"
    checksum = caps.checksum_shape.value if run.http is not None else "none in process"
    tags = f"honoured ({', '.join(caps.memory_tags)})" if caps.tags else "ignored"
    emulated = f" [{run.info['emulated_by']}]" if run.info.get("emulated_by") else ""
    known = "in the table" if caps.known else "NOT in the table"
    observed = (
        f"{caps.version!r} ({known}){emulated}; {sleep}; checksum: {checksum}; "
        f"/flush_cache?timeout=: {'yes' if caps.flush_timeout else 'no'}; tags {tags}"
    )
    if not caps.known:
        observed += f". {caps.note}"
    assumes = f"`version` in /get_server_info is a release the table covers ({TABLE_SPAN})"
    return [
        ConformanceRow("version", assumes, observed, Result.PASS if caps.known else Result.WARN)
    ]


def check_routes(run: _Run) -> list[ConformanceRow]:
    """The routes the version has, probed with requests that change nothing."""
    if run.http is None:
        return [ConformanceRow("routes", "the version's HTTP routes", IN_PROCESS, Result.SKIPPED)]
    return [_server_info_route(run), _pause_route(run), _checksum_route(run)]


def _server_info_route(run: _Run) -> ConformanceRow:
    assert run.http is not None
    want = run.caps.server_info
    assumes = (
        "`/server_info` present (0.5.6+)" if want else "`/server_info` absent: `/get_server_info`"
    )
    try:
        status = run.http._request("GET", "/server_info", idempotent=True, allow_404=True)
    except TeacherHTTPError as e:
        return ConformanceRow("route /server_info", assumes, f"HTTP {e.status}", Result.FAIL)
    code = status.status_code
    observed = "present (200)" if code == 200 else "absent (404)" if code == 404 else f"HTTP {code}"
    return ConformanceRow(
        "route /server_info", assumes, observed, run.agree(code == (200 if want else 404))
    )


def _pause_route(run: _Run) -> ConformanceRow:
    """``POST /continue_generation {}``: a no-op when nothing is paused, on every version that
    has it, and 404 where there is none. ``/pause_generation`` itself is never sent here."""
    assert run.http is not None
    want = run.caps.pause is not Pause.NONE
    name = "route pause (POST /continue_generation {})"
    assumes = f"present: {run.caps.pause.value}" if want else "absent (no /pause_generation)"
    try:
        resp = run.http._request(
            "POST", "/continue_generation", json={}, admin=True, allow_404=True
        )
        run.continue_status = resp.status_code
    except TeacherHTTPError as e:
        run.continue_status = e.status
        if e.status == 401:
            observed = "answered 401 (the admin key: see auth): presence not told"
            return ConformanceRow(name, assumes, observed, Result.SKIPPED)
        return ConformanceRow(name, assumes, f"HTTP {e.status}: {e.message}", Result.FAIL)
    code = run.continue_status
    observed = "present (200)" if code == 200 else "absent (404)" if code == 404 else f"HTTP {code}"
    return ConformanceRow(name, assumes, observed, run.agree(code == (200 if want else 404)))


def checksum_shape(body: Any) -> Checksum | None:
    """The shape of a ``/weights_checker`` checksum answer; None when it is neither of SGLang's."""
    if not isinstance(body, dict):
        return None
    if "per_engine_checksum" in body:
        total = body["per_engine_checksum"]
        return Checksum.PER_ENGINE_STRING if isinstance(total, str) and total else None
    ranks = body.get("ranks")
    if isinstance(ranks, list) and ranks:
        sums = [r.get("checksums") if isinstance(r, dict) else None for r in ranks]
        if all(isinstance(s, dict) and s for s in sums):
            return Checksum.PER_TENSOR
    return None


def _describe_body(body: Any) -> str:
    """What a checksum answer holds, by its fields' names and types (no values)."""
    if not isinstance(body, dict):
        return f"a {type(body).__name__}, not an object"
    fields = ", ".join(f"{k}: {type(v).__name__}" for k, v in sorted(body.items()))
    return f"neither shape ({fields})"


def _checksum_route(run: _Run) -> ConformanceRow:
    """``/weights_checker {"action": "checksum"}`` where the version has it, and its shape. Where
    it has none nothing is sent: an action a version does not know reaches its scheduler."""
    assert run.http is not None
    name = "route /weights_checker checksum"
    want = run.caps.checksum_shape
    if want is Checksum.NONE:
        why = "the table has no checksum on this version" if run.caps.known else run.caps.note
        observed = f"not sent ({why}; an action a version does not know reaches its scheduler)"
        return ConformanceRow(name, "none (the guard reads no checksum)", observed, Result.SKIPPED)
    assumes = f"answers: {want.value}"
    if not _awake(run):
        return ConformanceRow(name, assumes, "not sent: not known awake", Result.SKIPPED)
    try:
        resp = run.http._request(
            "POST", "/weights_checker", json={"action": "checksum"}, admin=True, allow_404=True
        )
        body = resp.json() if resp.status_code != 404 else None
    except (TeacherHTTPError, ValueError) as e:
        return ConformanceRow(name, assumes, f"error: {e}", Result.FAIL)
    if body is None:
        return ConformanceRow(name, assumes, "absent (404)", Result.FAIL)
    shape = checksum_shape(body)
    observed = shape.value if shape is not None else _describe_body(body)
    return ConformanceRow(name, assumes, observed, Result.PASS if shape is want else Result.FAIL)


def check_auth(run: _Run) -> list[ConformanceRow]:
    """Which keys are sent (by name), whether the server needs them, whether the admin key works."""
    if run.http is None:
        return [ConformanceRow("auth", "the server's API keys", IN_PROCESS, Result.SKIPPED)]
    return [_scoring_auth(run), _admin_auth(run)]


def _scoring_auth(run: _Run) -> ConformanceRow:
    """With a key configured, a 2-token scoring call without it must be refused (the teacher is
    known awake, so a forward is safe)."""
    http = run.http
    assert http is not None
    name = "auth: scoring"
    keys = _key_names(http)
    if not http._headers:
        observed = f"{keys}; the canary was scored without a key"
        return ConformanceRow(name, "the key the user configures, if any", observed, Result.PASS)
    assumes = "`--api-key`: /generate without it is refused (401)"
    if not _awake(run):
        return ConformanceRow(name, assumes, f"{keys}; not sent: not awake", Result.SKIPPED)
    two = score_request([run.first.tokens[:2]], 0, 0)
    code = _status(http, "/generate", two, {})
    if code == 401:
        return ConformanceRow(name, assumes, f"{keys}; refused without it (401)", Result.PASS)
    if code == 200:
        observed = f"{keys}; served WITHOUT a key (200): the key is not needed"
        return ConformanceRow(name, assumes, observed, Result.WARN)
    return ConformanceRow(name, assumes, f"{keys}; HTTP {code} without a key", Result.FAIL)


def _admin_auth(run: _Run) -> ConformanceRow:
    """The admin key on the harmless ``/continue_generation {}``; an admin route that needs no
    key is a warning: anyone who reaches the server can release it."""
    http = run.http
    assert http is not None
    name = "auth: admin"
    assumes = "admin routes take the key the guard sends, and refuse none"
    if run.caps.pause is Pause.NONE:
        observed = "not tried: no harmless admin route on this version (no /continue_generation)"
        return ConformanceRow(name, assumes, observed, Result.SKIPPED)
    with_key = run.continue_status
    if with_key == 401:
        observed = (
            f"{_key_names(http)}; refused (401): the guard's pause, release, resume, reload and "
            "flush would be refused. Set the variable to the server's --admin-api-key"
        )
        return ConformanceRow(name, assumes, observed, Result.FAIL)
    if with_key != 200:
        observed = f"/continue_generation answered {with_key} with the key"
        return ConformanceRow(name, assumes, observed, Result.SKIPPED)
    without = _status(http, "/continue_generation", {}, {}) if http._admin_headers else with_key
    if without == 200:
        observed = (
            "OPEN: /continue_generation answered 200 without any key: anyone who reaches the "
            "server can release it (launch it with --api-key and --admin-api-key)"
        )
        return ConformanceRow(name, assumes, observed, Result.WARN)
    return ConformanceRow(
        name, assumes, f"takes the key; refused without one ({without})", Result.PASS
    )


def check_backup(run: _Run) -> list[ConformanceRow]:
    """The memory saver and weights CPU backup the server reports (preflight's findings)."""
    info = run.info
    backup = info.get("enable_weights_cpu_backup", "not reported")
    observed = (
        f"enable_memory_saver={info.get('enable_memory_saver', 'not reported')}, "
        f"enable_weights_cpu_backup={backup}, "
        f"weight_cache_mode={info.get('weight_cache_mode') or 'off'}"
    )
    assumes = (
        "read from the server's arguments: with the memory saver on and no effective backup "
        "every release loses the weights, and the guard's repair reloads them"
    )
    bad = [f for f in run.preflight if f.severity >= Severity.WARN]
    if bad:
        observed += f": {_codes(bad)}: every wake loses the weights (the guard repairs each)"
        return [ConformanceRow("backup", assumes, observed, Result.WARN)]
    return [ConformanceRow("backup", assumes, observed + ": the weights are kept", Result.PASS)]


def check_tags(run: _Run) -> list[ConformanceRow]:
    """Each memory tag but ``weights`` released alone by the guard's sleep: the weights stay
    (without the backup, a server that ignored the tag would lose them, and the canary shows it)."""
    rows = []
    for tag in (t for t in run.caps.memory_tags if t != "weights"):
        if run.halted:
            break
        rows.append(_tag_row(run, tag))
    return rows


def _tag_row(run: _Run, tag: str) -> ConformanceRow:
    name = f"tag {tag}"
    assumes = f"a release of `{tag}` alone keeps the weights (tags honoured from 0.4.8)"
    why = _why_not_cycled(run) or (
        None
        if run.caps.tags
        else "the guard sends no tags to this version: every release acts on everything"
    )
    if why:
        return ConformanceRow(name, assumes, why, Result.SKIPPED)
    out = _cycle(run, [tag])
    run.done.append(out)
    row = _cycle_row(name, assumes, out)
    if row is not None:
        return row
    if out.lost:
        observed = f"the weights were {_lost_text(out)}: the server does not honour `{tag}`"
        return ConformanceRow(name, assumes, observed, Result.FAIL)
    observed = f"weights kept: canary unchanged (max |Δ logprob| {_num(out.max_delta)})"
    if run.keeps_weights:
        observed += "; with the backup on, an ignored tag would look the same"
    return ConformanceRow(name, assumes, observed, Result.PASS)


def check_weights(run: _Run) -> list[ConformanceRow]:
    """``weights`` released alone: lost and repaired without the backup (expected), kept with it."""
    name = "tag weights"
    if run.keeps_weights:
        assumes = "kept across a release (the server keeps them, by its arguments)"
    else:
        assumes = "lost at the wake (no backup): the guard repairs (reload, verify)"
    why = _why_not_cycled(run)
    if why:
        return [ConformanceRow(name, assumes, why, Result.SKIPPED)]
    out = _cycle(run, ["weights"])
    run.done.append(out)
    return [_weights_result(run, name, assumes, out, "")]


def _weights_result(run: _Run, name: str, assumes: str, out: _Cycle, kept: str) -> ConformanceRow:
    """A cycle that released the weights, against whether the server keeps them."""
    row = _cycle_row(name, assumes, out)
    if row is not None:
        return row
    if out.lost:
        if run.keeps_weights:
            observed = f"{_lost_text(out)}, although its arguments say the server keeps them"
            return ConformanceRow(name, assumes, observed, Result.FAIL)
        return ConformanceRow(
            name, assumes, _lost_text(out), Result.PASS if out.repaired else Result.FAIL
        )
    observed = kept or f"kept: canary unchanged (max |Δ logprob| {_num(out.max_delta)})"
    if not run.keeps_weights:
        return ConformanceRow(
            name, assumes, observed + ", although the server reports no backup", Result.WARN
        )
    return ConformanceRow(name, assumes, observed, Result.PASS)


def check_cycles(run: _Run) -> list[ConformanceRow]:
    """The guard's default sleep (every tag), ``cycles`` times as ``probe`` does: the canary
    after each wake within its tolerance of the one before the sleep."""
    name = f"full sleep/wake ×{run.cycles}"
    assumes = f"logprobs after the wake within the canary's tolerance ({_tolerance(run)})"
    if not run.keeps_weights:
        assumes = "the weights lost at the wake (no backup), repaired and verified"
    why = _why_not_cycled(run) or (None if run.cycles else "--cycles 0")
    if why:
        return [ConformanceRow(name, assumes, why, Result.SKIPPED)]
    outs: list[_Cycle] = []
    for _ in range(run.cycles):
        out = _cycle(run, None)
        outs.append(out)
        run.done.append(out)
        if out.skipped or out.failed or out.lost or run.halted:
            break
    ran = [o for o in outs if not o.skipped]
    if not ran:  # the first was not released: its reason
        return [ConformanceRow(name, assumes, f"not released: {outs[0].skipped}", Result.SKIPPED)]
    deltas = [o.max_delta for o in ran if o.max_delta is not None]
    kept = f"{len(ran)} cycle(s): max |Δ logprob| {_num(max(deltas) if deltas else None)}"
    if outs[-1].skipped:
        kept += f"; cycle {len(outs)} not released ({outs[-1].skipped})"
    return [_weights_result(run, name, assumes, ran[-1], kept)]


def check_checksum(run: _Run) -> list[ConformanceRow]:
    """Two reads agree; across each sleep the checksum after the wake (or after the repair)
    equals the one before."""
    name = "checksum"
    assumes = "two reads agree; with the backup, the same after a wake (after a repair, without)"
    if not callable(getattr(run.teacher, "checksum", None)):
        observed = (
            "in process: sglang.Engine has no /weights_checker"
            if isinstance(run.teacher, SGLangEngineTeacher)
            else "this teacher has no checksum"
        )
        return [ConformanceRow(name, assumes, observed, Result.SKIPPED)]
    if not run.caps.checksum:
        return [ConformanceRow(name, assumes, "no checksum on this version", Result.SKIPPED)]
    if not _awake(run):
        return [ConformanceRow(name, assumes, "not read: not known awake", Result.SKIPPED)]
    a, b = _checksum(run), _checksum(run)
    if a is None or b is None:
        observed = "unreadable: the guard finds no checksum in the answer"
        return [ConformanceRow(name, assumes, observed, Result.FAIL)]
    pairs = [(o.checksum_before, o.checksum_after) for o in run.done if o.checksum_after]
    moved = sum(before != after for before, after in pairs)
    across = (
        f"across {len(pairs)} sleep(s): {f'{moved} changed' if moved else 'the same'}"
        if pairs
        else "no sleep completed to compare across"
    )
    observed = f"two reads {'agree' if a == b else 'DIFFER'} ({a[:12]}…); {across}"
    return [
        ConformanceRow(
            name, assumes, observed, Result.PASS if a == b and not moved else Result.FAIL
        )
    ]


def check_temperature(run: _Run) -> list[ConformanceRow]:
    """The canary at 1, at T, at 1: no SGLang release applies ``sampling_params.temperature`` to
    input logprobs, and the guard relies on it (``docs/sglang-contract.md`` §1.8)."""
    name = "temperature on input logprobs"
    assumes = "not applied: input logprobs are at T = 1 whatever `sampling_params.temperature`"
    if not takes_temperature(run.teacher):
        return [ConformanceRow(name, assumes, "this client sends no temperature", Result.SKIPPED)]
    if not _awake(run):
        return [ConformanceRow(name, assumes, "not measured: not known awake", Result.SKIPPED)]
    m = measure_temperature(run.teacher, run.temperature, run.canary)
    if m is None:
        observed = "the canary is flat: a uniform distribution is the same at every temperature"
        return [ConformanceRow(name, assumes, observed, Result.SKIPPED)]
    t = f"T = {run.temperature:g} against 1: max |Δ| {_num(m['max_abs_delta'])}"
    if m["ignored"]:
        observed = f"not applied ({t}, within {_num(m['bound'])})"
        return [ConformanceRow(name, assumes, observed, Result.PASS)]
    observed = f"APPLIED ({t} > {_num(m['bound'])}, repeat noise {_num(m['repeat_noise'])})"
    return [ConformanceRow(name, assumes, observed, Result.FAIL)]


def check_left_as_found(run: _Run) -> ConformanceRow:
    """Last: the teacher awake, its traffic not held, and the canary as at the first measurement;
    anything else is put back as ``probe`` puts it back."""
    name = "left as found"
    assumes = "awake, traffic not held, canary as at the start"
    if run.halted:
        observed = (
            f"UNKNOWN: {run.halted}. Nothing more was sent. Check the server (its log says "
            "whether the last release or resume ran) before using it"
        )
        return ConformanceRow(name, assumes, observed, Result.FAIL)
    restored = ""
    if run.teacher.asleep or any(c.held for c in run.colocated):
        colocated = run.colocated[-1]
        report = ProbeReport(cycles=[])
        _restore(colocated, report, None)
        restored = f"put back: {report.interrupted}; "
        if not _awake(run) or any(c.held for c in run.colocated):
            return ConformanceRow(name, assumes, restored + "not awake", Result.FAIL)
    if run.broken:
        observed = f"{restored}awake; broken before the probe ({_codes(run.broken)}), as found"
        return ConformanceRow(name, assumes, observed, Result.FAIL)
    run.canary.accept(run.first)
    found = run.canary.verify(run.teacher, step=run.step + 1)
    cmp = run.canary.last_comparison
    delta = _num(cmp.max_abs_delta if cmp is not None else None)
    if found:
        out = _Cycle()
        colocated = (
            run.colocated[-1] if run.colocated else ColocatedTeacher(run.teacher, run.canary)
        )
        _repair(run, colocated, out, found)
        observed = f"{restored}the canary differed from the start ({_codes(found)}): {out.repair}"
        return ConformanceRow(name, assumes, observed, Result.FAIL)
    observed = f"{restored}awake, traffic not held, canary as at the start (max |Δ| {delta})"
    return ConformanceRow(name, assumes, observed, Result.FAIL if restored else Result.PASS)


CHECKS: tuple[Callable[[_Run], list[ConformanceRow]], ...] = (
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


# -- the run -----------------------------------------------------------------------------------


def _start(teacher: Teacher, canary: Canary, cycles: int, temperature: float) -> _Run:
    """What the teacher is before anything is released; a failure here raises
    (:class:`TeacherError`: nothing was touched)."""
    if teacher.asleep or getattr(teacher, "state_unknown", None):
        raise TeacherStateError(
            f"the conformance probe needs a teacher known awake: {PRECONDITION}"
        )
    http = teacher if isinstance(teacher, SGLangHTTPTeacher) else None
    info = teacher.server_info()
    caps = http.capabilities if http is not None else capabilities_for(info.get("version"))
    preflight = preflight_teacher(teacher)
    first = canary.measure(teacher, step=0)
    broken = canary.judge(first, teacher)
    return _Run(teacher, canary, caps, info, http, first, broken, preflight, cycles, temperature)


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
    secrets = [
        *(http._secrets if http is not None else []),
        *url_secrets(getattr(http, "url", None)),
    ]
    report = ConformanceReport(
        url=redact_url(getattr(http, "url", None)),
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
            _restore(run.colocated[-1], ProbeReport(), None)
        raise
    report.rows = [
        ConformanceRow(r.check, r.assumes, scrub(r.observed, secrets), r.result)
        for r in report.rows
    ]
    return report


# -- output ------------------------------------------------------------------------------------


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def format_conformance(report: ConformanceReport) -> str:
    """The header, the markdown table, the verdict: what ``probe --conformance`` prints."""
    lines = [
        f"conformance probe: {PRECONDITION}.",
        f"distill_guard {report.distill_guard_version} · teacher {report.url} · SGLang "
        f"{report.sglang_version or 'unknown'} · model {report.model or 'unknown'}",
        "",
        "| check | the guard assumes | observed | result |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {_cell(r.check)} | {_cell(r.assumes)} | {_cell(r.observed)} | {r.result.value} |"
        for r in report.rows
    ]
    lines += ["", report.verdict]
    return "\n".join(lines)
