"""Loading a saved guard state whole or not at all (:meth:`DistillGuard.load_state_dict`).

Every part of the state is checked and loaded into a staged copy first (each check's sub-state
into a deep copy of the check, the policy's into a copy of the policy, the summary into a new
one, ``run`` into a new :class:`~distill_guard.observations.RunSpec`, the teachers' part into
fresh canaries and incident trackers that hold no teacher client), and the guard takes the
staged copies only once all of them loaded. A state it cannot take whole raises one
:class:`~distill_guard.errors.GuardStateError` naming the key path that was wrong, and the guard
is exactly as it was.

Missing keys are fine (a state from before a field existed loads with that field's default);
unknown keys are not (a state from another version, or a corrupted one), except the few that a
released version saved and this one no longer reads (:data:`RETIRED_KEYS`, :data:`OLD_KEYS`).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from distill_guard.checks.canary import CanaryMeasurement
from distill_guard.errors import GuardError, GuardStateError
from distill_guard.live.canary import Canary
from distill_guard.live.incidents import IncidentTracker, WeightLossIncident
from distill_guard.live.teacher_reference import TeacherReference, TeacherReferenceError
from distill_guard.observations import RunSpec
from distill_guard.policy import Policy
from distill_guard.summary import GuardSummary
from distill_guard.watched_teachers import TEACHER_STATE_KEYS

if TYPE_CHECKING:
    from distill_guard.checks import Check
    from distill_guard.guard import DistillGuard

log = logging.getLogger("distill_guard")

GUARD_STATE_KEYS = ("checks", "policy", "summary", "run", "open_incident", *TEACHER_STATE_KEYS)
"""Every top-level key of :meth:`DistillGuard.state_dict`; any other is refused."""

RETIRED_KEYS: dict[str, frozenset[str]] = {
    # 0.1.0: the summary's per-code severity and first action, and its repair count (the
    # repairs are the live teacher's incidents now)
    "summary": frozenset({"severity", "first_action", "repairs"}),
    # 0.1.0: the CUSUM entropy drift, and the truncation check's run counter (both replaced by
    # a rolling median against a frozen warm-up reference)
    "checks.entropy_drift": frozenset(
        {"warmup", "mean", "sigma", "up", "down", "up_run", "down_run"}
    ),
    "checks.truncation": frozenset({"run"}),
}
"""Keys a released version saved that this one no longer reads: accepted and dropped (said at
INFO; what they held starts over: a check takes its warm-up again)."""

OLD_KEYS: dict[str, frozenset[str]] = {
    # 0.2.0: the accuracy check's warm-up reference, read as its best level
    "checks.eval_accuracy": frozenset({"reference"}),
}
"""Keys a released version saved that this one reads in another form (the part's own
``load_state_dict`` converts them)."""

ADVICE = (
    "Nothing was loaded: the guard is as it was. Resume from a checkpoint whose guard state this "
    "version of distill_guard saved (or with the version that saved it), or without the guard "
    "state (its references are then taken again)"
)

KEPT_ADVICE = {
    "vocab_size": "check that the teacher is the checkpoint's: the uniform-teacher bound is "
    "-ln V, so a wrong V reads a dead teacher as merely near-uniform",
    "student_vocab_size": "check that the student is the checkpoint's (its vocabulary bounds the "
    "teacher ids that can be its tokens)",
    "loss": "check that the trainer's loss is the checkpoint's: the loss checks (the JSD ceiling, "
    "the reverse-KL signature) are judged by it",
    "beta": "check that the trainer's beta is the checkpoint's: the JSD ceiling H(beta) is judged "
    "by it",
    "loss_scale": "check the factor the trainer applies to the loss: it is undone before the loss "
    "is compared with its bound",
    "teacher_temperature": "check the temperature the teacher is consumed at: the teacher's "
    "reference is taken and judged at it",
}


@dataclass
class StagedState:
    """A guard state, loaded into copies that the guard takes only once all of them loaded."""

    checks: dict[int, Check] = field(default_factory=dict)
    """Index in ``guard.checks`` → the loaded copy of that check."""
    policy: Policy | None = None
    summary: GuardSummary | None = None
    run: RunSpec | None = None
    """The run to take (None: the state has no ``run``; the guard's stays)."""
    kept: list[tuple[str, Any, Any]] = field(default_factory=list)
    """``(field, saved, configured)`` of each run field whose configured value was kept."""
    open_incident: int | None = None
    teachers: dict[str, Any] = field(default_factory=dict)
    """The teachers' part of the state (plain dicts and lists, a copy), checked on fresh canaries:
    what :meth:`WatchedTeachers.load_state_dict` is given."""
    not_run: list[str] = field(default_factory=list)
    """Checks in the state that this guard does not run (their states are not loaded)."""
    retired: dict[str, list[str]] = field(default_factory=dict)
    """Path → the :data:`RETIRED_KEYS` found there (dropped)."""


def stage_state(guard: DistillGuard, state: Any) -> StagedState:
    """``state`` checked and loaded into copies of ``guard``'s parts; nothing of ``guard``
    changes. Raises :class:`GuardStateError` naming the key path that was wrong."""
    if not isinstance(state, Mapping):
        raise _refuse(
            f"the state must be a mapping (what DistillGuard.state_dict() returns), got "
            f"{_kind(state)}"
        )
    _no_unknown(state, GUARD_STATE_KEYS, "")
    staged = StagedState()
    if "checks" in state:
        _stage_checks(guard.checks, state["checks"], staged)
    policy = copy.deepcopy(guard.policy)
    _stage_part(policy, state.get("policy", {}), "policy", staged)
    staged.policy = policy
    staged.summary = _stage_summary(state.get("summary", {}), staged)
    if "run" in state:
        staged.run, staged.kept = _stage_run(guard, state["run"])
    staged.teachers = {k: _plain_copy(state[k]) for k in TEACHER_STATE_KEYS if k in state}
    _check_teachers(staged.teachers)
    staged.open_incident = _step(state.get("open_incident"), "open_incident")
    return staged


def say_staged(guard: DistillGuard, staged: StagedState) -> None:
    """Once the guard took ``staged``: each configured run value kept against a different saved
    one (a WARNING and an event record), and what was not carried over (INFO)."""
    for name, saved, configured in staged.kept:
        advice = KEPT_ADVICE.get(name, "check that the run resumed is the checkpoint's")
        message = (
            f"the loaded state's run.{name} is {_plain(saved)!r}, this guard's is "
            f"{_plain(configured)!r}: keeping {_plain(configured)!r} (a checkpoint never "
            f"overrides the configuration); {advice}. If the checkpoint's value is the right "
            f"one, set run.{name} to it."
        )
        log.warning("distill_guard: %s", message)
        guard.events.write(
            "state_run_kept",
            field=name,
            saved=_plain(saved),
            configured=_plain(configured),
            message=message,
        )
    for name in staged.not_run:
        log.info(
            "distill_guard: the loaded state has a state for check %r, which this guard does not "
            "run: not loaded",
            name,
        )
    for path, keys in staged.retired.items():
        log.info(
            "distill_guard: %s of the loaded state holds %s, saved by an earlier distill_guard and "
            "no longer read: not carried over%s",
            path,
            ", ".join(sorted(keys)),
            " (the check takes its warm-up again)" if path.startswith("checks.") else "",
        )


# ---------------------------------------------------------------------------------- the parts


def _stage_checks(checks: list[Check], saved: Any, staged: StagedState) -> None:
    saved = _mapping(saved, "checks")
    by_name = {c.name: i for i, c in enumerate(checks)}  # the last of a name, as state_dict
    for name, sub in saved.items():
        if name not in by_name:
            staged.not_run.append(str(name))
            continue
        i = by_name[name]
        check = copy.deepcopy(checks[i])
        _stage_part(check, sub, f"checks.{name}", staged)
        staged.checks[i] = check


def _stage_part(part: Any, saved: Any, path: str, staged: StagedState) -> None:
    """Load ``saved`` into ``part`` (a staged copy) after checking it has the shape of what
    ``part.state_dict()`` writes: no unknown key, a mapping or a list where it has one. The
    values themselves are the part's own ``load_state_dict``'s to check (the robust references
    refuse a number that is not one: :func:`~distill_guard.checks.robust.loaded_number`)."""
    _shape(saved, part.state_dict(), path, staged)
    state = copy.deepcopy(dict(saved))  # the staged part must not share the caller's lists
    _load(path, lambda: part.load_state_dict(state))


def _shape(value: Any, template: Mapping[str, Any], path: str, staged: StagedState) -> None:
    value = _mapping(value, path)
    retired = RETIRED_KEYS.get(path, frozenset())
    old = OLD_KEYS.get(path, frozenset())
    _no_unknown(value, template, path, retired | old)
    found = sorted(k for k in value if k in retired and k not in template)
    if found:
        staged.retired[path] = found
    for key, sub in value.items():
        if key not in template:
            continue
        expected = template[key]
        where = f"{path}.{key}"
        if isinstance(expected, Mapping) and expected:
            _shape(sub, expected, where, staged)
        elif isinstance(expected, Mapping):  # keyed by what was seen: any key is known
            _mapping(sub, where)
        elif isinstance(expected, list) and not isinstance(sub, (list, tuple)):
            raise _refuse(f"{where!r} must be a list, got {_kind(sub)}")


def _stage_summary(saved: Any, staged: StagedState) -> GuardSummary:
    path = "summary"
    saved = _mapping(saved, path)
    summary = GuardSummary()
    known = summary.state_dict()
    retired = RETIRED_KEYS[path]
    _no_unknown(saved, known, path, retired)
    found = sorted(k for k in saved if k in retired)
    if found:
        staged.retired[path] = found
    for key, read in (("first", _step), ("count", _count)):
        if key in saved:
            for code, value in _mapping(saved[key], f"{path}.{key}").items():
                if not isinstance(code, str):
                    raise _refuse(f"{path}.{key}: key {code!r} is not a finding code")
                read(value, f"{path}.{key}.{code}")
    for key in ("warn_findings", "skipped_updates"):
        if key in saved:
            _count(saved[key], f"{path}.{key}")
    if saved.get("halt") is not None:
        _check_halt(saved["halt"], f"{path}.halt")
    state = copy.deepcopy({k: v for k, v in saved.items() if k in known})
    _load(path, lambda: summary.load_state_dict(state))
    return summary


def _check_halt(halt: Any, path: str) -> None:
    halt = _mapping(halt, path)
    _no_unknown(halt, ("step", "stage", "message", "codes"), path)
    for key in ("stage", "message"):
        if key not in halt:
            raise _refuse(f"{path}: missing {key!r}")
        if not isinstance(halt[key], str):
            raise _refuse(f"{path}.{key} must be a string, got {_kind(halt[key])}")
    _step(halt.get("step"), f"{path}.step")
    codes = halt.get("codes", [])
    if not isinstance(codes, (list, tuple)) or not all(isinstance(c, str) for c in codes):
        raise _refuse(f"{path}.codes must be a list of finding codes, got {codes!r}")


def _stage_run(guard: DistillGuard, saved: Any) -> tuple[RunSpec, list[tuple[str, Any, Any]]]:
    """The run to take: each value the guard already holds (configured, or learnt from its
    teacher in this process) is kept, and said when the saved one differs; each it does not
    hold (None, or an unconfigured default) is the saved one."""
    saved = _mapping(saved, "run")
    spec_type = type(guard.run)
    fields = dataclasses.fields(spec_type)
    _no_unknown(saved, {f.name for f in fields}, "run", what="field")
    for name, value in saved.items():  # one at a time, so a refusal names its field
        try:
            spec_type(**{name: value})
        except (GuardError, TypeError, ValueError) as exc:
            raise _refuse(f"run.{name}: {_reason(exc)}") from exc
    try:
        loaded = spec_type(**dict(saved))
    except (GuardError, TypeError, ValueError) as exc:
        raise _refuse(f"run: {_reason(exc)}") from exc
    configured = getattr(guard, "_run_configured", True)
    restored: dict[str, Any] = {}
    kept: list[tuple[str, Any, Any]] = []
    for f in fields:
        if f.name not in saved:
            continue
        mine, theirs = getattr(guard.run, f.name), getattr(loaded, f.name)
        held = mine is not None and (configured or f.default is None or mine != f.default)
        if not held:
            restored[f.name] = theirs
        elif theirs is not None and not _same(mine, theirs):
            kept.append((f.name, theirs, mine))
    return (dataclasses.replace(guard.run, **restored) if restored else guard.run), kept


def _check_teachers(state: Mapping[str, Any]) -> None:
    """The teachers' part, loaded into fresh canaries and incident trackers: the live teacher's
    own objects (which hold its client) are not touched, nor copied."""
    reference = None
    if state.get("teacher_reference"):  # falsy: no reference (WatchedTeachers.load_state_dict)
        reference = _reference(state["teacher_reference"], "teacher_reference")
    if "canary" in state:
        _stage_canary(state["canary"], "canary", reference)
    if "incidents" in state:
        _stage_incidents(state["incidents"], "incidents")
    if state.get("module_canary") is not None:
        _stage_canary(state["module_canary"], "module_canary", reference)
    if state.get("replicas") is not None:  # a teacher made of replicas: each one's own
        fleet = _mapping(state["replicas"], "replicas")
        members = _mapping(fleet.get("replicas", {}), "replicas.replicas")
        for url, saved in members.items():
            where = f"replicas.replicas.{url}.colocated"
            colocated = _mapping(
                _mapping(saved, f"replicas.replicas.{url}").get("colocated", {}), where
            )
            if "canary" in colocated:
                _stage_canary(colocated["canary"], f"{where}.canary", reference)
            if "incidents" in colocated:
                _stage_incidents(colocated["incidents"], f"{where}.incidents")


def _stage_canary(saved: Any, path: str, reference: TeacherReference | None) -> None:
    saved = _mapping(saved, path)
    canary = Canary()
    _no_unknown(saved, canary.state_dict(), path)
    tokens = saved.get("tokens")
    if tokens is not None and not _ids(tokens):
        raise _refuse(f"{path}.tokens must be a list of token ids, got {_short(tokens)}")
    vocab = saved.get("vocab_size")
    if vocab is not None and not (_integer(vocab) and vocab >= 2):
        raise _refuse(f"{path}.vocab_size must be an int >= 2 or None, got {vocab!r}")
    fingerprint = saved.get("fingerprint")
    if fingerprint:
        where = f"{path}.fingerprint"
        fingerprint = _mapping(fingerprint, where)
        names = {f.name for f in dataclasses.fields(CanaryMeasurement)}
        _no_unknown(fingerprint, names, where, what="field")
        if not _ids(fingerprint.get("tokens")):
            raise _refuse(f"{where}.tokens must be a list of token ids")
        if not isinstance(fingerprint.get("token_logprobs"), (list, tuple)):
            raise _refuse(f"{where}.token_logprobs must be a list of logprobs")
    if saved.get("reference"):
        _reference(saved["reference"], f"{path}.reference")
    state = copy.deepcopy(dict(saved))
    _load(path, lambda: canary.load_state_dict(state))
    if reference is not None:
        _load(path, lambda: canary.use_reference(reference))


def _stage_incidents(saved: Any, path: str) -> None:
    saved = _mapping(saved, path)
    _no_unknown(saved, ("current", "closed", "closed_count", "closed_repairs"), path)
    for key in ("closed_count", "closed_repairs"):
        if key in saved:
            _count(saved[key], f"{path}.{key}")
    if saved.get("current") is not None:
        _check_incident(saved["current"], f"{path}.current")
    closed = saved.get("closed", [])
    if not isinstance(closed, (list, tuple)):
        raise _refuse(f"{path + '.closed'!r} must be a list, got {_kind(closed)}")
    for i, incident in enumerate(closed):
        _check_incident(incident, f"{path}.closed[{i}]")
    state = copy.deepcopy(dict(saved))
    _load(path, lambda: IncidentTracker().load_state_dict(state))


def _check_incident(saved: Any, path: str) -> None:
    saved = _mapping(saved, path)
    names = {f.name for f in dataclasses.fields(WeightLossIncident)}
    _no_unknown(saved, names, path, what="field")
    for key in ("first_step", "last_step"):
        _step(saved.get(key), f"{path}.{key}")
    for key in ("repairs", "failures"):
        if key in saved:
            _count(saved[key], f"{path}.{key}")


def _reference(saved: Any, path: str) -> TeacherReference:
    saved = _mapping(saved, path)
    try:
        return TeacherReference.from_dict(dict(saved), where=path)
    except TeacherReferenceError as exc:
        raise _refuse(str(exc)) from exc
    except Exception as exc:  # noqa: BLE001 - any fault of the saved data is a refused state
        raise _refuse(f"{path}: {_reason(exc)}") from exc


# ---------------------------------------------------------------------------------- helpers


def _refuse(problem: str) -> GuardStateError:
    return GuardStateError(f"guard state: {problem}. {ADVICE}.")


def _load(path: str, load: Callable[[], Any]) -> None:
    """Run a staged part's own load; whatever it raises is a refused state naming ``path``."""
    try:
        load()
    except GuardStateError:
        raise
    except Exception as exc:  # noqa: BLE001 - any fault of the saved data is a refused state
        raise _refuse(f"{path}: {_reason(exc)}") from exc


def _mapping(value: Any, path: str) -> Mapping[Any, Any]:
    if not isinstance(value, Mapping):
        raise _refuse(f"{path!r} must be a mapping, got {_kind(value)}")
    return value


def _no_unknown(
    value: Mapping[Any, Any],
    known: Any,
    path: str,
    accepted: frozenset[str] = frozenset(),
    what: str = "key",
) -> None:
    for key in value:
        if key not in known and key not in accepted:
            where = f"{path}: " if path else ""
            raise _refuse(f"{where}unknown {what} {key!r} (from another version of distill_guard?)")


def _integer(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _ids(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and all(_integer(x) and x >= 0 for x in value)


def _step(value: Any, path: str) -> int | None:
    if value is not None and not _integer(value):
        raise _refuse(f"{path} must be a step (an int) or None, got {_short(value)}")
    return None if value is None else int(value)


def _count(value: Any, path: str) -> int:
    if not (_integer(value) and value >= 0):
        raise _refuse(f"{path} must be a count (an int >= 0), got {_short(value)}")
    return int(value)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        try:
            return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)
        except (TypeError, ValueError):
            return False
    return bool(a == b)


def _plain_copy(value: Any) -> Any:
    """A deep copy with every mapping a dict and every sequence a list (what JSON gives back)."""
    if isinstance(value, Mapping):
        return {k: _plain_copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain_copy(v) for v in value]
    return copy.deepcopy(value)


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, Enum) else value


def _kind(value: Any) -> str:
    return type(value).__name__


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _reason(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, GuardError) else f"{type(exc).__name__}: {exc}"
