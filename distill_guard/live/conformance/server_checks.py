"""The checks of the server itself, each sending only requests that change nothing: the version
it names and the capability row the guard uses for it, the routes that version has (the pause
route probed with ``POST /continue_generation {}`` alone; ``/weights_checker`` only with
``checksum`` and only where the version has it), its API keys, and the weights backup its
arguments report."""

from __future__ import annotations

from typing import Any

from distill_guard.findings import Severity
from distill_guard.live.conformance.report import ConformanceRow, Result
from distill_guard.live.conformance.state import Run, codes
from distill_guard.teachers._sglang_wire import score_request
from distill_guard.teachers.base import TeacherHTTPError
from distill_guard.teachers.capabilities import plan_sleep
from distill_guard.teachers.sglang_http import SGLangHTTPTeacher
from distill_guard.teachers.sglang_versions import NEWEST_READ, OLDEST_READ, Checksum, Pause

IN_PROCESS = "in process: no HTTP"
TABLE_SPAN = f"{'.'.join(map(str, OLDEST_READ))}–{'.'.join(map(str, NEWEST_READ))}"


def check_version(run: Run) -> list[ConformanceRow]:
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


def check_routes(run: Run) -> list[ConformanceRow]:
    """The routes the version has, probed with requests that change nothing."""
    if run.http is None:
        return [ConformanceRow("routes", "the version's HTTP routes", IN_PROCESS, Result.SKIPPED)]
    return [_server_info_route(run), _pause_route(run), _checksum_route(run)]


def _server_info_route(run: Run) -> ConformanceRow:
    assert run.http is not None
    want = run.caps.server_info
    assumes = (
        "`/server_info` present (0.5.6+)" if want else "`/server_info` absent: `/get_server_info`"
    )
    try:
        status = run.http.request("GET", "/server_info", idempotent=True, allow_404=True)
    except TeacherHTTPError as e:
        return ConformanceRow("route /server_info", assumes, f"HTTP {e.status}", Result.FAIL)
    code = status.status_code
    observed = "present (200)" if code == 200 else "absent (404)" if code == 404 else f"HTTP {code}"
    return ConformanceRow(
        "route /server_info", assumes, observed, run.agree(code == (200 if want else 404))
    )


def _pause_route(run: Run) -> ConformanceRow:
    """``POST /continue_generation {}``: a no-op when nothing is paused, on every version that
    has it, and 404 where there is none. ``/pause_generation`` itself is never sent here."""
    assert run.http is not None
    want = run.caps.pause is not Pause.NONE
    name = "route pause (POST /continue_generation {})"
    assumes = f"present: {run.caps.pause.value}" if want else "absent (no /pause_generation)"
    try:
        resp = run.http.request("POST", "/continue_generation", json={}, admin=True, allow_404=True)
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


def _checksum_route(run: Run) -> ConformanceRow:
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
    if not run.awake:
        return ConformanceRow(name, assumes, "not sent: not known awake", Result.SKIPPED)
    try:
        resp = run.http.request(
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


def check_auth(run: Run) -> list[ConformanceRow]:
    """Which keys are sent (by name), whether the server needs them, whether the admin key works."""
    if run.http is None:
        return [ConformanceRow("auth", "the server's API keys", IN_PROCESS, Result.SKIPPED)]
    return [_scoring_auth(run), _admin_auth(run)]


def _scoring_auth(run: Run) -> ConformanceRow:
    """With a key configured, a 2-token scoring call without it must be refused (the teacher is
    known awake, so a forward is safe)."""
    http = run.http
    assert http is not None
    name = "auth: scoring"
    keys = _key_names(http)
    if not http.key_sources.api_key_set:
        observed = f"{keys}; the canary was scored without a key"
        return ConformanceRow(name, "the key the user configures, if any", observed, Result.PASS)
    assumes = "`--api-key`: /generate without it is refused (401)"
    if not run.awake:
        return ConformanceRow(name, assumes, f"{keys}; not sent: not awake", Result.SKIPPED)
    two = score_request([run.first.tokens[:2]], 0, 0)
    code = http.status_without_key("POST", "/generate", two)
    if code == 401:
        return ConformanceRow(name, assumes, f"{keys}; refused without it (401)", Result.PASS)
    if code == 200:
        observed = f"{keys}; served WITHOUT a key (200): the key is not needed"
        return ConformanceRow(name, assumes, observed, Result.WARN)
    return ConformanceRow(name, assumes, f"{keys}; HTTP {code} without a key", Result.FAIL)


def _admin_auth(run: Run) -> ConformanceRow:
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
    without = (
        http.status_without_key("POST", "/continue_generation", {})
        if http.key_sources.admin_key_sent
        else with_key
    )
    if without == 200:
        observed = (
            "OPEN: /continue_generation answered 200 without any key: anyone who reaches the "
            "server can release it (launch it with --api-key and --admin-api-key)"
        )
        return ConformanceRow(name, assumes, observed, Result.WARN)
    return ConformanceRow(
        name, assumes, f"takes the key; refused without one ({without})", Result.PASS
    )


def check_backup(run: Run) -> list[ConformanceRow]:
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
        observed += f": {codes(bad)}: every wake loses the weights (the guard repairs each)"
        return [ConformanceRow("backup", assumes, observed, Result.WARN)]
    return [ConformanceRow("backup", assumes, observed + ": the weights are kept", Result.PASS)]


def _key_names(http: SGLangHTTPTeacher) -> str:
    """Which keys the client sends, by the names of their variables (never their values)."""
    keys = http.key_sources
    api = f"${keys.api_key_env}" if keys.api_key_env else "no variable"
    api += " (set)" if keys.api_key_set else " (unset: no key sent)"
    admin = (
        f"${keys.admin_key_env} on admin routes"
        if keys.admin_key_set
        else "no admin key (admin routes get the api key)"
    )
    return f"{api}; {admin}"
