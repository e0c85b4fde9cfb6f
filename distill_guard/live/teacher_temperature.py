"""Whether a teacher scores at the run's teacher temperature: an SGLang teacher applies none to
its input logprobs (``docs/sglang-contract.md`` §1.8), told from its version or launch command, or
measured on the canary when its client can send a temperature."""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from distill_guard.errors import GuardValueError
from distill_guard.findings import Code, Finding, Severity
from distill_guard.teachers.base import ScoreResult
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
    raise GuardValueError(
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
