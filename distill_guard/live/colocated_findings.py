"""The findings of the colocated step's own checks: a sleep state that cannot be known, a release
the version cannot make safe, weights a release did not keep, a checksum that changed.

Each says what was seen, against what, and what to do (``docs/teachers.md`` §7)."""

from __future__ import annotations

from distill_guard.findings import Code, Finding, Severity


def state_unknown(step: int | None, why: str) -> Finding:
    """``teacher.state_unknown`` (critical; the run halts): nothing more is sent to the teacher."""
    return Finding(
        Code.TEACHER_STATE_UNKNOWN,
        Severity.CRITICAL,
        f"Whether the teacher is released cannot be known: {why}. SGLang cannot be asked, "
        "and a resume of an awake teacher or a forward on a released one kills it, so the "
        "guard sends it nothing (no resume, no canary, no repair) and the run halts. Check "
        "the server (its log says whether the last release or resume ran), then resume "
        "the run with its state said: teacher.mark_resumed() if it is awake, "
        "teacher.mark_released(by_host=False) if the guard's own release went through.",
        step,
        {"why": why},
    )


def release_skipped(step: int | None, kind: str, message: str) -> Finding:
    """``teacher.release_skipped`` (warn): the guard did not release, and ``message`` says why."""
    return Finding(Code.TEACHER_RELEASE_SKIPPED, Severity.WARN, message, step, {"kind": kind})


def weights_not_kept(step: int | None) -> Finding:
    """``teacher.weights_not_kept`` (critical): its server keeps no weights across a release."""
    return Finding(
        Code.TEACHER_WEIGHTS_NOT_KEPT,
        Severity.CRITICAL,
        "The teacher was released with the memory saver on and no weights CPU backup "
        "(its server arguments say so): SGLang does not keep its parameters, so it woke "
        "without them (zeroed, or whatever the memory held). Its traffic stays held until it is reloaded and verified "
        "(a halt leaves it paused). Relaunch it with --enable-weights-cpu-backup.",
        step,
        {"source": "server_info"},
    )


def checksum_changed(step: int | None, before: str, after: str) -> Finding:
    """``teacher.fingerprint_mismatch`` from ``/weights_checker``: bit-exact, forward-free."""
    return Finding(
        Code.TEACHER_FINGERPRINT_MISMATCH,
        Severity.CRITICAL,
        "The teacher's weights checksum (/weights_checker) changed across sleep and wake: "
        f"{before[:16]}… before, {after[:16]}… after (bound: bit-exact). Its weights are "
        "not the ones it slept with; traffic the guard's pause holds stays held until it "
        "is reloaded and verified. Rewake it (reload, verify) and relaunch it with "
        "--enable-weights-cpu-backup.",
        step,
        {"checksum_before": before, "checksum_after": after, "source": "weights_checker"},
    )


def check_unavailable(step: int | None, check: str, error: Exception, still: str) -> Finding:
    """``teacher.check_unavailable`` (warn): one of the wake's checks could not run (an endpoint
    missing, refused or answering in a shape it should not); the others still judge, and
    ``still`` names them. Said once per episode: later failures in a row are logged at INFO."""
    return Finding(
        Code.TEACHER_CHECK_UNAVAILABLE,
        Severity.WARN,
        f"The {check} could not be read: {type(error).__name__}: {error}. It is not a verdict "
        f"on the teacher: {still}. Check the endpoint on this server (a version that claims "
        "the route but does not serve it, a proxy in between, an auth key missing for it).",
        step,
        {"check": check, "error": str(error), "error_type": type(error).__name__},
    )
