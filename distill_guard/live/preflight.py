"""Preflight: read a teacher's configuration before training and say what will go wrong at wake.

Three sources, one judgement: a live server's ``/server_info`` (flat SGLang server arguments), an
``sglang.Engine``'s ``get_server_info()``, or a launch command line, SGLang's own
(``python -m sglang.launch_server ...``) or Relax's (``--teacher-sglang-*``, inherited
``--sglang-*``, ``--colocate``, ``--offload-rollout``).

One rule also reads the run's own configuration: a teacher temperature T ≠ 1 that an SGLang
teacher will not apply (its input logprobs are at T = 1 in every release,
``docs/sglang-contract.md`` §1.8), told from the server's version or launch command and, on a
live teacher whose client can send a temperature, measured on the canary.
"""

from __future__ import annotations

import inspect
import json
import math
import shlex
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from distill_guard.findings import Code, Finding, Severity
from distill_guard.teachers.base import ScoreResult, Teacher
from distill_guard.teachers.capabilities import parse_version

if TYPE_CHECKING:
    from distill_guard.live.canary import Canary

CONFIG_TEACHER_TEMPERATURE_IGNORED = Code.CONFIG_TEACHER_TEMPERATURE_IGNORED
"""``config.teacher_temperature_ignored``: the run's teacher temperature is not the one the
teacher scores at."""

TEMPERATURE_IGNORED_ATOL = 1e-6
"""Canary logprobs requested at T and at 1 that agree within this (nats), or within the noise of
a repeat at 1 when that is larger: the teacher ignored T."""

SGLANG_RELEASES_READ = "0.5.23"
"""The newest SGLang release whose input-logprob path was read (``docs/sglang-contract.md``
§1.8): none through it applies ``sampling_params.temperature`` to input logprobs."""

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
    findings = _server_args_findings(args, step)
    findings += preflight_teacher_temperature(teacher_temperature, args, step=step)
    return findings


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
    findings = _server_args_findings(info, step)
    findings += preflight_teacher_temperature(
        teacher_temperature, info, teacher=teacher, canary=canary, step=step
    )
    return findings


# ---------------------------------------------------------------------------------- temperature


def check_teacher_temperature(value: Any, *, name: str = "teacher_temperature") -> float | None:
    """The run's teacher temperature as a float (None: not configured). Anything but a finite
    number > 0 raises ``ValueError`` naming ``name`` (the CLI passes ``--teacher-temperature``)."""
    if value is None:
        return None
    try:
        t = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        t = math.nan
    if math.isfinite(t) and t > 0:
        return t
    why = (
        " (a sampling temperature of 0 means greedy decoding; it is no temperature for a "
        "teacher's distribution, and SGLang scores input logprobs at 1 for it: write 1)"
        if t == 0
        else ""
    )
    raise ValueError(
        f"{name} must be a finite number > 0, the temperature the teacher's distribution is "
        f"meant to be at (1: the model's own), got {value!r}{why}"
    )


def takes_temperature(teacher: Any) -> bool:
    """Whether ``teacher.score`` accepts ``temperature=`` (the SGLang clients do; the
    :class:`~distill_guard.teachers.Teacher` protocol does not ask for it)."""
    try:
        params = inspect.signature(teacher.score).parameters
    except (TypeError, ValueError, AttributeError):
        return False
    return "temperature" in params  # not **kwargs: a wrapper may drop it, and measure nothing


def _sglang_identity(args: Mapping[str, Any]) -> tuple[bool, str | None, str]:
    """(whether the teacher is SGLang, its version if known, how it was told)."""
    launcher = args.get("launcher")
    if launcher == "sglang":
        return True, None, "SGLang (from its launch command)"
    if launcher == "relax":
        flags = args.get("flags") or {}
        if str(flags.get("opd_type", "sglang")) == "sglang":
            return True, None, "SGLang (from the Relax launch command: --opd-type sglang)"
        return False, None, "not SGLang (from the Relax launch command)"
    version = args.get("version")
    if version is not None and parse_version(str(version)) is not None:
        emulated = " (emulated by the reference server)" if args.get("emulated_by") else ""
        return True, str(version), f"SGLang {version}{emulated}"
    return False, None if version is None else str(version), "not known to be SGLang"


def _flat(res: ScoreResult) -> list[float]:
    values = res.token_logprobs[0].tolist()
    if res.topk_logprobs is not None:
        values += res.topk_logprobs[0].flatten().tolist()
    return values


def _max_abs_delta(a: list[float], b: list[float]) -> float:
    """Largest |a - b|; a NaN on either side, or a length mismatch, is infinitely far."""
    if len(a) != len(b):
        return math.inf
    worst = 0.0
    for x, y in zip(a, b):
        d = abs(x - y)
        if math.isnan(d):
            if math.isnan(x) and math.isnan(y):
                continue
            return math.inf
        worst = max(worst, d)
    return worst


def measure_temperature(
    teacher: Any, temperature: float, canary: Canary | None = None
) -> dict[str, Any] | None:
    """What a teacher does with a requested temperature, on the canary: scored at 1, at
    ``temperature``, at 1 again. Returns ``max_abs_delta`` (T against 1, token and top-k
    logprobs), ``repeat_noise`` (1 against 1), ``bound`` (the larger of
    :data:`TEMPERATURE_IGNORED_ATOL` and the noise), ``ignored`` (delta within the bound), and
    the canary's size; None when ``teacher.score`` takes no temperature or the canary is flat
    (a uniform distribution is the same at every temperature, so it cannot tell).
    Raises ``TeacherError`` when the teacher cannot be scored."""
    if not takes_temperature(teacher):
        return None
    if canary is None:
        from distill_guard.live.canary import Canary

        canary = Canary()
    tokens = canary.canary_tokens(teacher)
    top_k = canary.top_k

    def score(t: float) -> ScoreResult:
        return teacher.score([tokens], top_k=top_k, logprob_start_len=0, temperature=t)

    first = score(1.0)
    if first.topk_logprobs is not None and top_k >= 2:
        top = first.topk_logprobs[0]
        spread = float((top[:, 0] - top[:, -1]).max()) if top.numel() else 0.0
        if not spread > TEMPERATURE_IGNORED_ATOL:
            return None
    tempered, again = score(temperature), score(1.0)
    base = _flat(first)
    delta = _max_abs_delta(base, _flat(tempered))
    noise = _max_abs_delta(base, _flat(again))
    bound = max(TEMPERATURE_IGNORED_ATOL, noise)
    return {
        "max_abs_delta": delta,
        "repeat_noise": noise,
        "bound": bound,
        "ignored": delta <= bound,
        "canary_tokens": len(tokens) - 1,
        "top_k": top_k if first.topk_logprobs is not None else 0,
    }


def preflight_teacher_temperature(
    teacher_temperature: float | None,
    server_args: Mapping[str, Any],
    *,
    teacher: Any = None,
    canary: Canary | None = None,
    step: int | None = None,
) -> list[Finding]:
    """``config.teacher_temperature_ignored`` (warn) when the run is configured with a teacher
    temperature T ≠ 1 and the teacher will score at T = 1 all the same.

    Evidence, best first: the canary measured at T and at 1 through ``teacher`` (when its
    ``score`` takes a temperature: identical logprobs mean T was ignored, different ones that it
    was applied, and then nothing is reported); else the teacher is SGLang, by its version
    (``server_args["version"]``) or launch command, and no SGLang release applies
    ``sampling_params.temperature`` to input logprobs (``docs/sglang-contract.md`` §1.8). A
    teacher that is neither SGLang nor measurable is not judged."""
    t = check_teacher_temperature(teacher_temperature)
    if t is None or math.isclose(t, 1.0, rel_tol=0.0, abs_tol=1e-9):
        return []
    is_sglang, version, where = _sglang_identity(server_args)
    measured = measure_temperature(teacher, t, canary) if teacher is not None else None
    if measured is not None and not measured["ignored"]:
        return []
    if measured is None and not is_sglang:
        return []
    evidence = "version" if version is not None else "launch command"
    values: dict[str, Any] = {
        "teacher_temperature": t,
        "scored_at": 1.0,
        "sglang_version": version,
        "evidence": "canary" if measured is not None else evidence,
        "max_abs_delta": None,
        "bound": None,
    }
    releases = (
        f"no SGLang release through {SGLANG_RELEASES_READ} applies sampling_params.temperature "
        "to input (prefill) logprobs (docs/sglang-contract.md §1.8)"
    )
    fix = (
        f"The run distills toward the T = 1 teacher, not the T = {t:g} one in its config. "
        f"Divide the teacher's logits by {t:g} yourself: score at T = 1 and temper in the "
        f"trainer (log_softmax(logprobs / {t:g}): exact over the full vocabulary, a "
        "renormalization over a top-k support; a single token's logprob cannot be tempered), or "
        "set the teacher temperature to 1 in the config so that it says what happens."
    )
    if measured is not None:
        values.update(measured)
        values.pop("ignored", None)
        n, k = measured["canary_tokens"], measured["top_k"]
        size = f"{n} token and {n}×{k} top-{k}" if k else f"{n} token"
        noise = (
            ", the noise of a repeat at T = 1"
            if measured["bound"] > TEMPERATURE_IGNORED_ATOL
            else ""
        )
        why = f" This teacher is {where}; {releases}." if is_sglang else ""
        message = (
            f"The run's teacher temperature is {t:g}, but the teacher scores the same whatever "
            f"temperature it is sent: the canary's {size} logprobs requested with temperature "
            f"{t:g} and with 1 differ by max |Δ| = {measured['max_abs_delta']:.3g} nats, within "
            f"the bound {measured['bound']:.3g}{noise} (within it, the temperature was "
            f"ignored).{why} {fix}"
        )
    else:
        if server_args.get("launcher") in ("sglang", "relax"):
            how = "read from a launch command"
        elif teacher is None:
            how = "read from the server arguments only"
        elif not takes_temperature(teacher):
            how = "this teacher's client sends no temperature"
        else:
            how = "the canary is flat, and a uniform distribution is the same at every temperature"
        message = (
            f"The run's teacher temperature is {t:g}, but this teacher is {where}, which scores "
            f"at T = 1 whatever temperature it is sent: {releases}. Not measured ({how}); "
            f"`distill-guard preflight --url URL --teacher-temperature {t:g}` measures it on the "
            f"canary. {fix}"
        )
    return [Finding(CONFIG_TEACHER_TEMPERATURE_IGNORED, Severity.WARN, message, step, values)]
