"""Preflight: read a teacher's configuration before training and say what will go wrong at wake.

Three sources, one judgement: a live server's ``/server_info`` (flat SGLang server arguments), an
``sglang.Engine``'s ``get_server_info()``, or a launch command line, SGLang's own
(``python -m sglang.launch_server ...``) or Relax's (``--teacher-sglang-*``, inherited
``--sglang-*``, ``--colocate``, ``--offload-rollout``).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from typing import Any

from distill_guard.findings import Code, Finding, Severity
from distill_guard.teachers.base import Teacher

_BOOL_PREFIXES = ("enable_", "disable_", "use_", "skip_", "sglang_enable_", "sglang_disable_")
_BOOL_NAMES = frozenset(
    {
        "colocate",
        "hybrid",
        "offload_rollout",
        "offload_train",
        "debug_train_only",
        "trust_remote_code",
    }
)
_RELAX_MARKERS = frozenset(
    {
        "use_opd",
        "opd_type",
        "teacher_hf_checkpoint",
        "opd_teacher_routes",
        "opd_teacher_url",
        "colocate",
        "offload_rollout",
        "resource",
    }
)


def _is_bool(name: str) -> bool:
    bare = name.removeprefix("teacher_")
    return bare in _BOOL_NAMES or bare.startswith(_BOOL_PREFIXES)


def parse_flags(tokens: list[str]) -> dict[str, Any]:
    """``--some-flag value`` / ``--some-flag=value`` / bare ``--switch`` into ``{"some_flag": ...}``.

    Bare switches are True; ``--no-x`` sets ``x`` False. Tokens before the first flag (the program,
    ``-m module``, environment assignments) and stray positionals are ignored; the last repeat wins.
    """
    flags: dict[str, Any] = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        i += 1
        if not tok.startswith("--") or tok == "--":
            continue
        name, eq, value = tok[2:].partition("=")
        key = name.replace("-", "_")
        if eq:
            flags[key] = value
        elif key.startswith("no_") and _is_bool(key[3:]):
            flags[key[3:]] = False
        elif _is_bool(key) or i >= len(tokens) or tokens[i].startswith("--"):
            flags[key] = True
        else:
            flags[key] = tokens[i]
            i += 1
    return flags


def _truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() not in ("", "0", "false", "no", "off", "none")
    return bool(value)


def parse_launch_command(cmd: str) -> dict[str, Any]:
    """The teacher's effective server arguments from a launch command line.

    Returns SGLang server-argument keys (``enable_memory_saver``, ``enable_weights_cpu_backup``,
    ``weight_cache_mode``, ``enable_deterministic_inference``, ``model_path``) plus ``launcher``
    (``"sglang"`` or ``"relax"``) and, for Relax, how it was derived: ``teacher_managed``,
    ``colocate``, ``offload_rollout``, ``backup_source``. For Relax the rules of
    ``build_teacher_overrides`` apply: the teacher's memory saver is on exactly for a managed
    teacher colocated with the actor (``--colocate``, not ``--hybrid``); its backup comes from
    ``--teacher-sglang-enable-weights-cpu-backup``, else from the student's inherited
    ``--sglang-enable-weights-cpu-backup``, else it is off.
    """
    tokens = shlex.split(cmd.replace("\\\n", " "))
    flags = parse_flags(tokens)
    relax = any(k in _RELAX_MARKERS or k.startswith("teacher_sglang_") for k in flags)
    if not relax:
        return {
            "launcher": "sglang",
            "model_path": flags.get("model_path") or flags.get("model"),
            "enable_memory_saver": _truthy(flags.get("enable_memory_saver", False)),
            "enable_weights_cpu_backup": _truthy(flags.get("enable_weights_cpu_backup", False)),
            "weight_cache_mode": flags.get("weight_cache_mode", "off"),
            "enable_deterministic_inference": _truthy(
                flags.get("enable_deterministic_inference", False)
            )
            or flags.get("rl_on_policy_target") == "fsdp",
            "flags": flags,
        }
    return _relax_teacher_args(flags)


def _relax_teacher_args(flags: dict[str, Any]) -> dict[str, Any]:
    def teacher_or_student(name: str) -> tuple[Any, str | None]:
        for prefix in ("teacher_sglang_", "sglang_"):
            if prefix + name in flags:
                return flags[prefix + name], "--" + (prefix + name).replace("_", "-")
        return None, None

    resource: dict[str, Any] = {}
    if isinstance(flags.get("resource"), str):
        try:
            resource = json.loads(flags["resource"])
        except ValueError:
            resource = {}
    has_teacher_resource = "teacher" in resource if resource else True  # unknown: assume present
    managed = (
        _truthy(flags.get("use_opd", False))
        and str(flags.get("opd_type", "sglang")) == "sglang"
        and bool(flags.get("teacher_hf_checkpoint") or flags.get("opd_teacher_routes"))
        and has_teacher_resource
        and not _truthy(flags.get("debug_train_only", False))
    )
    colocate = (
        managed
        and _truthy(flags.get("colocate", False))
        and not _truthy(flags.get("hybrid", False))
        and (not resource or ("actor" in resource and "rollout" in resource))
    )
    backup, backup_source = teacher_or_student("enable_weights_cpu_backup")
    cache_mode, _ = teacher_or_student("weight_cache_mode")
    det, _ = teacher_or_student("enable_deterministic_inference")
    target, _ = teacher_or_student("rl_on_policy_target")
    return {
        "launcher": "relax",
        "model_path": flags.get("teacher_hf_checkpoint"),
        "teacher_managed": managed,
        "colocate": colocate,
        "offload_rollout": _truthy(flags.get("offload_rollout", colocate)),
        "enable_memory_saver": colocate,
        "enable_weights_cpu_backup": _truthy(backup) if backup is not None else False,
        "backup_source": backup_source,
        "weight_cache_mode": cache_mode or "off",
        "enable_deterministic_inference": (_truthy(det) if det is not None else False)
        or target == "fsdp",
        "flags": flags,
    }


def preflight_server_args(args: Mapping[str, Any], *, step: int | None = None) -> list[Finding]:
    """Findings from a teacher's server arguments (``/server_info``, ``get_server_info()``, or
    :func:`parse_launch_command`): what will happen to its weights at wake, and how exact the
    canary can be."""
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
    saver = _truthy(args.get("enable_memory_saver", False))
    has_backup_key = "enable_weights_cpu_backup" in args
    backup = _truthy(args.get("enable_weights_cpu_backup", False))
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
    if not _truthy(args.get("enable_deterministic_inference", False)):
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


def preflight_teacher(teacher: Teacher, *, step: int | None = None) -> list[Finding]:
    """:func:`preflight_server_args` on the teacher's own server info (raises ``TeacherError``)."""
    return preflight_server_args(teacher.server_info(), step=step)
