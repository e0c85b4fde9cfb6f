"""Preflight: a teacher's configuration (``/server_info``, ``get_server_info()`` or a launch command
line) read before training, and what will go wrong at wake. Re-exports the modules it draws on."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from distill_guard.findings import Code, Finding, Severity
from distill_guard.live.launch_command import (
    PREFLIGHT_FLAGS,
    misspelt_flags,
    parse_flags,
    parse_launch_command,
    truthy,
)
from distill_guard.live.teacher_temperature import (
    CONFIG_TEACHER_TEMPERATURE_IGNORED,
    SGLANG_RELEASES_READ,
    TEMPERATURE_IGNORED_ATOL,
    check_teacher_temperature,
    measure_temperature,
    preflight_teacher_temperature,
    takes_temperature,
)
from distill_guard.teachers.base import Teacher

if TYPE_CHECKING:
    from distill_guard.live.canary import Canary

__all__ = [
    "CONFIG_TEACHER_TEMPERATURE_IGNORED",
    "SGLANG_RELEASES_READ",
    "TEMPERATURE_IGNORED_ATOL",
    "check_teacher_temperature",
    "measure_temperature",
    "parse_flags",
    "parse_launch_command",
    "preflight_server_args",
    "preflight_teacher",
    "preflight_teacher_temperature",
    "takes_temperature",
]


def preflight_server_args(
    args: Mapping[str, Any],
    *,
    step: int | None = None,
    teacher_temperature: float | None = None,
) -> list[Finding]:
    """Findings from a teacher's server arguments (``/server_info``, ``get_server_info()``, or
    :func:`parse_launch_command`): what will happen to its weights at wake, and how exact the
    canary can be. With the run's ``teacher_temperature`` (None: not configured, i.e. 1), also
    whether the teacher will score at it (:func:`preflight_teacher_temperature`, from the
    version or launch command only). Raises ``ValueError`` for a temperature that is not a
    finite number > 0."""
    teacher_temperature = check_teacher_temperature(teacher_temperature)
    findings = _misspelt_findings(args, step) + _server_args_findings(args, step)
    findings += preflight_teacher_temperature(teacher_temperature, args, step=step)
    return findings


_WAKE_FLAGS = PREFLIGHT_FLAGS & {
    "enable_memory_saver",
    "enable_weights_cpu_backup",
    "weight_cache_mode",
}
"""The flags of preflight's verdict on the weights at wake (its critical findings)."""


def _misspelt_findings(args: Mapping[str, Any], step: int | None) -> list[Finding]:
    """A launch command's flags (``args["flags"]``) that look like misspellings of SGLang
    flags: critical for one the wake verdict reads (memory saver, weights backup, cache mode:
    the command would fail to launch, and the verdict was formed without it), warn for
    another. Relax's ``--teacher-sglang-*`` and
    ``--sglang-*`` flags are SGLang's under a prefix."""
    flags = args.get("flags")
    if not isinstance(flags, Mapping):
        return []
    relax = args.get("launcher") == "relax"
    named: dict[str, str] = {}  # SGLang name -> the flag as written
    for key in flags:
        for prefix in ("teacher_sglang_", "sglang_") if relax else ("",):
            if key.startswith(prefix):
                named[key.removeprefix(prefix)] = key
                break
    findings = []
    for bare, meant in misspelt_flags(dict.fromkeys(named)).items():
        written = named[bare]
        prefix = written[: len(written) - len(bare)]
        given, fix = (f"--{(prefix + n).replace('_', '-')}" for n in (bare, meant))
        verdict = meant in _WAKE_FLAGS
        findings.append(
            Finding(
                Code.CONFIG_UNKNOWN_FLAG,
                Severity.CRITICAL if verdict else Severity.WARN,
                f"{given} is not an SGLang flag preflight knows; did you mean {fix}? SGLang refuses an unknown "
                "flag at launch, and preflight read this command without it"
                + (
                    f": its verdict on {fix} does not hold until the spelling is fixed."
                    if verdict
                    else "."
                ),
                step,
                {"flag": given, "close_match": fix, "launcher": args.get("launcher")},
            )
        )
    return findings


def keeps_weights(args: Mapping[str, Any]) -> bool:
    """Whether a release keeps the teacher's weights, from its server arguments: the memory
    saver off (nothing is freed), or its weights CPU backup on and not forced off by a weight
    cache mode (``docs/sglang-contract.md`` §2.4). SGLang does not keep them otherwise (§2.5)."""
    if not truthy(args.get("enable_memory_saver", False)):
        return True
    cache_mode = str(args.get("weight_cache_mode") or "off")
    return truthy(args.get("enable_weights_cpu_backup", False)) and cache_mode == "off"


def _server_args_findings(args: Mapping[str, Any], step: int | None) -> list[Finding]:
    launcher = args.get("launcher", "server")
    relax = launcher == "relax"
    findings: list[Finding] = []
    if relax and not args.get("teacher_managed"):
        findings.append(
            Finding(
                Code.CONFIG_UNCHECKED,
                Severity.INFO,
                "This Relax command starts no managed SGLang teacher (it needs --use-opd, "
                "--opd-type sglang, --teacher-hf-checkpoint and a 'teacher' entry in --resource): "
                "check the external teacher itself with `distill-guard preflight --url URL`.",
                step,
                {"launcher": launcher},
            )
        )
        return findings
    saver = truthy(args.get("enable_memory_saver", False))
    has_backup_key = "enable_weights_cpu_backup" in args
    backup = truthy(args.get("enable_weights_cpu_backup", False))
    cache_mode = str(args.get("weight_cache_mode") or "off")
    flag = "--teacher-sglang-enable-weights-cpu-backup" if relax else "--enable-weights-cpu-backup"
    values = {
        "enable_memory_saver": saver,
        "enable_weights_cpu_backup": backup if has_backup_key else None,
        "weight_cache_mode": cache_mode,
        "launcher": launcher,
    }
    if saver and not has_backup_key and launcher == "server":
        findings.append(
            Finding(
                Code.CONFIG_NO_WEIGHTS_BACKUP,
                Severity.CRITICAL,
                "The teacher runs with enable_memory_saver on and reports no "
                "enable_weights_cpu_backup at all (SGLang before 0.5.3 has none): every release "
                "drops the weights and every resume brings back zeros or garbage. Upgrade SGLang "
                "and add --enable-weights-cpu-backup, or reload the weights after every wake (the "
                "guard's rewake does this).",
                step,
                values,
            )
        )
    elif saver and not backup:
        where = (
            f"Add {flag} to the Relax launch (Relax's teacher inherits the student's --sglang-* "
            "flags, so --sglang-enable-weights-cpu-backup would also reach it; --teacher-sglang-* "
            "takes precedence). Relax turns the teacher's memory saver on by itself for a "
            "colocated managed teacher; there is no flag to turn it off."
            if relax
            else f"Add {flag} to the SGLang launch."
        )
        findings.append(
            Finding(
                Code.CONFIG_NO_WEIGHTS_BACKUP,
                Severity.CRITICAL,
                "The teacher runs with the memory saver on and the weights CPU backup off: every "
                "/release_memory_occupation drops its weights and /resume_memory_occupation brings "
                "back zeros (a uniform teacher, every logprob −ln V) or garbage, with no error. "
                f"{where} Until then the guard's rewake reloads the weights after every wake.",
                step,
                {**values, "flag": flag},
            )
        )
    elif saver and backup and cache_mode != "off":
        findings.append(
            Finding(
                Code.CONFIG_BACKUP_DISABLED_BY_CACHE_MODE,
                Severity.WARN,
                f"weight_cache_mode={cache_mode!r} silently forces the weights CPU backup off in "
                "SGLang (zero-copy IPC weights): the backup flag is set but will not protect the "
                "weights at wake. Use weight_cache_mode 'off' for a sleeping teacher, or rely on "
                "the guard's rewake (a reload after every wake).",
                step,
                values,
            )
        )
    if not truthy(args.get("enable_deterministic_inference", False)):
        det_flag = (
            "--teacher-sglang-enable-deterministic-inference"
            if relax
            else "--enable-deterministic-inference"
        )
        findings.append(
            Finding(
                Code.CONFIG_NONDETERMINISTIC,
                Severity.INFO,
                "Deterministic inference is off: the canary compares with a noise tolerance "
                "(mean |Δ logprob| 0.1, max 1.0 nats by default) instead of bit-exactly. "
                f"{det_flag} makes the comparison exact, at a 25–45% inference cost.",
                step,
                {"enable_deterministic_inference": False, "flag": det_flag},
            )
        )
    return findings


def preflight_teacher(
    teacher: Teacher,
    *,
    step: int | None = None,
    teacher_temperature: float | None = None,
    canary: Canary | None = None,
) -> list[Finding]:
    """:func:`preflight_server_args` on the teacher's own server info (raises ``TeacherError``).

    With the run's ``teacher_temperature`` ≠ 1 and a teacher whose ``score`` takes a
    ``temperature`` (the SGLang clients), the temperature rule is measured: ``canary`` (default
    ``Canary()``) is scored at 1, at T and at 1 again, three calls of ``canary.length`` tokens.
    Raises ``ValueError`` for a temperature that is not a finite number > 0, before any call.
    """
    teacher_temperature = check_teacher_temperature(teacher_temperature)
    info = teacher.server_info()
    findings = _version_findings(teacher, step) + _server_args_findings(info, step)
    findings += preflight_teacher_temperature(
        teacher_temperature, info, teacher=teacher, canary=canary, step=step
    )
    return findings


def _version_findings(teacher: Teacher, step: int | None) -> list[Finding]:
    """An SGLang teacher that reports a version the table does not cover (not a string, a
    pre-release, unparseable, newer than the newest read) is run conservatively: said, never
    healthy by silence. A teacher that is not SGLang (no ``capabilities``) has no such row."""
    caps = getattr(teacher, "capabilities", None)
    if caps is None or caps.known:
        return []
    return [
        Finding(
            Code.CONFIG_UNCHECKED,
            Severity.WARN,
            f"The teacher reports {caps.note}. Check which SGLang it runs; the guard's sleep, "
            "wake and repair follow that conservative reading until it reports a release the "
            "table covers.",
            step,
            {"version": caps.version, "known": False},
        )
    ]
