"""Relax: keep a dead teacher out of the trainer, through Relax's own function-path hooks.

Relax queues a step's training data before its rollout log hook runs, and its trainer releases
and resumes the teacher itself between steps (``docs/relax.md`` §3.2). So the guard acts where
the data and the update can still be stopped, on both Relax lines (current redai-studio and the
redai-infra SDPO branch); nothing in Relax is patched::

    --dynamic-sampling-filter-path distill_guard.integrations.relax.dynamic_sampling_filter
    --custom-convert-samples-to-train-data-path distill_guard.integrations.relax.convert_samples_to_train_data
    --custom-megatron-before-train-step-hook-path distill_guard.integrations.relax.before_train_step_hook
    --custom-rollout-log-function-path distill_guard.integrations.relax.rollout_log_function
    --custom-eval-rollout-log-function-path distill_guard.integrations.relax.eval_rollout_log_function
    # SDPO branch only:
    --opd-feedback-class distill_guard.integrations.relax.GuardedGoldenAnswerSDPOFeedback

- :func:`dynamic_sampling_filter` is the gate before the queue (:mod:`.gate`): every group is
  judged after teacher scoring, dead samples are masked (or re-scored after a verified repair),
  and the step's verdict is posted for the trainer.
- :func:`convert_samples_to_train_data` is the gate where the values enter the queue: Relax's
  conversion, on every path (the abort path under partial rollout, a deferred-OPD flush whose
  teacher scores after the filter ran); it judges what no gate judged, then converts as Relax does.
- :func:`before_train_step_hook` is the gate before the optimizer (:mod:`.trainer`): every
  trainer rank reads the verdict and trains, skips the update, or checkpoints and halts.
- :func:`rollout_log_function` completes the step's verdict and adds ``guard/*`` metrics.
- The feedback classes (:mod:`.feedback`) mask dead samples per sample on the SDPO branch.

Settings: :mod:`.setup`. The launchers are in ``examples/relax/``.
"""

from __future__ import annotations

import copy
import functools
import logging
import os
from collections.abc import Callable
from typing import Any

from distill_guard.integrations.relax.feedback import (
    FEEDBACK_BASES,
    TeacherCollapseError,
    TeacherCollapseFeedbackMixin,
    feedback_class,
)
from distill_guard.integrations.relax.gate import RelaxGate
from distill_guard.integrations.relax.setup import GuardSetupError, configure
from distill_guard.integrations.relax.trainer import GuardHalt, TrainerGate, load_function
from distill_guard.metric_names import RELAX_METRIC_NAMES, resolve_key
from distill_guard.observations import Metric

log = logging.getLogger("distill_guard")

__all__ = [
    "GuardHalt",
    "GuardSetupError",
    "RelaxGate",
    "TeacherCollapseError",
    "TeacherCollapseFeedbackMixin",
    "before_train_step_hook",
    "configure",
    "convert_samples_to_train_data",
    "dynamic_sampling_filter",
    "eval_rollout_log_function",
    "reset",
    "reward_post_process",
    "rollout_log_function",
    "state",
    "use",
    "wrap_teacher_manager",
    *FEEDBACK_BASES,
]

_GATE: RelaxGate | None = None
_TRAINER: TrainerGate | None = None


def state(args: Any = None) -> RelaxGate:
    """The rollout process's gate, set up from the environment on first use."""
    global _GATE
    if _GATE is None:
        overrides = os.environ.get("DISTILL_GUARD_OVERRIDES", "").split()
        events = os.environ.get("DISTILL_GUARD_EVENTS")
        if events:
            overrides.append(f"events_path={events}")
        _GATE = configure(
            os.environ.get("DISTILL_GUARD_PRESET", "default"), overrides=overrides, args=args
        )
    return _GATE


def use(gate: RelaxGate) -> RelaxGate:
    """Make ``gate`` (from :func:`configure`) the one the hooks use."""
    global _GATE
    _GATE = gate
    return gate


def reset() -> None:
    """Forget the gates (tests; a new run in the same process)."""
    global _GATE, _TRAINER
    if _GATE is not None:
        _GATE.guard.close()
    _GATE = _TRAINER = None


# ---------------------------------------------------------------------------------- the hooks


def dynamic_sampling_filter(args: Any, group: list[Any]) -> Any:
    """``--dynamic-sampling-filter-path``: the gate before the queue. Keeps every group (Relax
    refills dropped ones), with dead samples masked; then runs ``DISTILL_GUARD_INNER_FILTER``."""
    gate = state(args)
    _without_faults(gate, "filter", lambda: gate.filter_group(args, group))
    inner = _inner_filter()
    return inner(args, group) if inner is not None else True


def convert_samples_to_train_data(args: Any, samples: list[Any]) -> Any:
    """``--custom-convert-samples-to-train-data-path``: the gate where teacher values enter the
    trainer's queue, on every path. Judges (masks, re-scores) what no gate judged yet, then
    converts with ``DISTILL_GUARD_INNER_CONVERT`` if set, else with Relax's own conversion."""
    gate = state(args)
    flat = _flat(samples)
    _without_faults(gate, "convert", lambda: gate.convert(args, flat))
    path = os.environ.get("DISTILL_GUARD_INNER_CONVERT")
    if path:
        return load_function(path)(args, samples)
    from relax.utils.utils import convert_samples_to_train_data as relax_convert

    own = copy.copy(args)  # Relax's conversion, not this hook again
    own.custom_convert_samples_to_train_data_path = None
    return relax_convert(own, samples)


def _flat(samples: Any) -> list[Any]:
    out: list[Any] = []
    for s in samples:
        out.extend(_flat(s) if isinstance(s, (list, tuple)) else [s])
    return out


def rollout_log_function(
    rollout_id: int, args: Any, samples: list[Any], rollout_extra_metrics: dict, rollout_time: float
) -> bool:
    """``--custom-rollout-log-function-path``: after Relax queued the step. Completes the
    step's verdict and adds ``guard/*`` metrics; False keeps Relax's own logging."""
    gate = state(args)
    try:
        metrics = gate.end_rollout(rollout_id, samples)
    except Exception as exc:  # noqa: BLE001
        log.exception("distill_guard: the rollout log hook failed at step %s", rollout_id)
        gate.guard.events.write(
            "guard_error", step=rollout_id, error=f"{type(exc).__name__}: {exc}"
        )
        metrics = {"guard/error": 1.0}
    if rollout_extra_metrics is not None:
        rollout_extra_metrics.update(metrics)
    return False


def reward_post_process(args: Any, samples: list[Any]) -> Any:
    """``--custom-reward-post-process-path``, for slime and miles, where the rollout log hook
    runs before conversion and the teacher's values are filled in by the run's own reward
    post-process (``DISTILL_GUARD_INNER_REWARD_POST_PROCESS``, e.g. slime's
    ``slime.rollout.on_policy_distillation.post_process_rewards``): run it, then gate every
    sample before the conversion builds the trainer's data. Returns what the inner one returned."""
    path = os.environ.get("DISTILL_GUARD_INNER_REWARD_POST_PROCESS")
    if not path:
        raise GuardSetupError(
            "reward_post_process wraps the run's own reward post-process: set "
            "DISTILL_GUARD_INNER_REWARD_POST_PROCESS to it (slime's OPD example: "
            "slime.rollout.on_policy_distillation.post_process_rewards)"
        )
    result = load_function(path)(args, samples)
    gate = state(args)
    _without_faults(gate, "post_process", lambda: gate.post_process(args, samples))
    return result


def _without_faults(gate: RelaxGate, where: str, work: Callable[[], None]) -> None:
    """Run the gate's work; its own faults are recorded, never raised into Relax's rollout
    (a setup refusal is not a fault: it must stop the run before anything is queued)."""
    try:
        work()
    except GuardSetupError:
        raise
    except Exception as exc:  # noqa: BLE001 - the guard's own fault must not stop the rollout
        log.exception("distill_guard: the %s gate failed", where)
        gate.guard.events.write("guard_error", where=where, error=f"{type(exc).__name__}: {exc}")


def eval_rollout_log_function(rollout_id: int, args: Any, data: dict, extra_metrics: dict) -> bool:
    """``--custom-eval-rollout-log-function-path``: the eval accuracy goes to the guard (the mean
    reward of the dataset Relax logs as the ``eval/*`` key replay picks)."""
    gate = state(args)
    rewards_of = {
        f"eval/{name}": [float(r) for r in (d.get("rewards") or []) if r is not None]
        for name, d in (data or {}).items()
    }
    key = resolve_key(
        RELAX_METRIC_NAMES[Metric.EVAL_ACCURACY], [k for k, r in rewards_of.items() if r]
    )
    accuracy = sum(rewards_of[key]) / len(rewards_of[key]) if key is not None else None
    decision = gate.guard.on_step_metrics(rollout_id, {Metric.EVAL_ACCURACY: accuracy})
    if extra_metrics is not None:
        extra_metrics["guard/eval_action"] = float(decision.action.rank)
    return False


def before_train_step_hook(
    args: Any, rollout_id: int, step_id: int, model: Any, optimizer: Any, opt_param_scheduler: Any
) -> None:
    """``--custom-megatron-before-train-step-hook-path``: the gate before the optimizer, on
    every trainer rank (train, skip the update, or checkpoint and raise :class:`GuardHalt`)."""
    global _TRAINER
    if _TRAINER is None:
        _TRAINER = TrainerGate.from_env()
    _TRAINER.before_step(args, rollout_id, model, optimizer, opt_param_scheduler)


def __getattr__(name: str) -> Any:
    """``GuardedGoldenAnswerSDPOFeedback`` & co. subclass Relax's class, built on first access
    (so this module imports without Relax)."""
    if name in FEEDBACK_BASES:
        return feedback_class(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def _inner_filter_from(path: str) -> Callable[..., Any]:
    return load_function(path)


def _inner_filter() -> Callable[..., Any] | None:
    path = os.environ.get("DISTILL_GUARD_INNER_FILTER")
    return _inner_filter_from(path) if path else None


# ---------------------------------------------------------------------------------- lifecycle


def wrap_teacher_manager(manager: Any, gate: RelaxGate | None = None) -> Any:
    """Run a TeacherManager's ``offload()`` and ``onload()`` inside the guard's colocated step,
    in a process that owns the manager: ``guard.sleep(step, release=offload)`` (fingerprint,
    then offload) and ``guard.wake(step, resume=onload)`` (onload, then canary and repair).
    Idempotent; returns ``manager``."""

    def current() -> RelaxGate:
        return gate if gate is not None else state()

    def wrap(fn: Callable[..., Any], sleep: bool) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapped(*a: Any, **k: Any) -> Any:
            out: list[Any] = []

            def host_call() -> None:  # the manager's own offload/onload
                out.append(fn(*a, **k))

            g = current()
            step = g.step or 0
            if sleep:
                g.guard.sleep(step, release=host_call)
            else:
                g.guard.wake(step, resume=host_call)
            return out[0] if out else None

        wrapped.__distill_guard__ = True  # type: ignore[attr-defined]
        return wrapped

    for name, sleep in (("offload", True), ("onload", False)):
        fn = getattr(manager, name)
        if not getattr(fn, "__distill_guard__", False):
            setattr(manager, name, wrap(fn, sleep))
    return manager
