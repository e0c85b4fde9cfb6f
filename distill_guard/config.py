"""Hydra schemas: the run facts, the check and policy dataclasses are themselves the config nodes.

Registered in Hydra's ConfigStore as ``guard/base_guard``; the presets in ``conf/guard/`` extend
it, so a misspelt key fails when the config is composed, not hours into a run. A composed config
becomes a guard through :func:`build_guard`, the one way from configuration to a guard.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from distill_guard.alerts import WEBHOOK_ENV, Alerter
from distill_guard.checks import ChecksConfig
from distill_guard.errors import GuardTypeError, GuardValueError
from distill_guard.guard import DistillGuard
from distill_guard.observations import RunSpec
from distill_guard.policy import Policy
from distill_guard.presets import PRESETS

CONF_DIR = "pkg://distill_guard.conf"
"""Hydra search path entry that finds the presets wherever the package is installed."""


@dataclass
class AlertsConfig:
    use_wandb: bool = True
    """Send alerts to the active wandb run (rank 0 only; an offline run writes them into its
    own file, a disabled run drops them)."""
    min_interval_s: float = 600.0
    """Per-title throttle in seconds, one for every sink and the logger."""
    webhook_url_env: str | None = WEBHOOK_ENV
    """Environment variable holding a Slack-style incoming-webhook URL (the URL is a secret: it
    never goes in a config); unset or empty, no webhook. None turns the webhook off."""
    webhook_timeout_s: float = 5.0
    """Bound of one webhook request. The training step never waits on it (a background thread
    sends); the guard's ``close()`` waits up to 10 s for what is still queued."""


@dataclass
class RepairConfig:
    max_attempts: int = 3
    """Reload-and-verify attempts before the guard halts the run."""
    backoff_s: float = 1.0
    """Wait before the second attempt; doubles each attempt."""


@dataclass
class ReplicasConfig:
    """A teacher made of replicas (:class:`~distill_guard.live.replicas.ReplicatedTeacher`)."""

    min_healthy_replicas: int = 1
    """The fewest replicas, verified against the checkpoint's reference, the run trains on: a
    broken replica is quarantined and the run goes on with the rest; below this it halts."""


@dataclass
class GuardConfig:
    """The whole guard. Compose with ``guard=default|monitor_only|strict`` and override fields."""

    events_path: str | None = None
    """JSONL event file; None keeps events in the logger only."""
    run: RunSpec = field(default_factory=RunSpec)
    """Facts of the run: V, the loss and its β and scale, the teacher's temperature."""
    teacher_reference: str | None = None
    """Where the teacher's reference from outside the run comes from: a reference file made by
    ``distill-guard reference``, the teacher's checkpoint directory, or ``auto`` (the
    teacher's own: the server's ``model_path``, a module's ``name_or_path``). None: the canary
    trusts the teacher's first fingerprint (``docs/invariants.md`` §3.1 says when that is safe)."""
    checks: ChecksConfig = field(default_factory=ChecksConfig)
    """Every check's thresholds, and whether it runs."""
    policy: Policy = field(default_factory=Policy)
    """Findings → decision: patience, escalation, monitor-only."""
    alerts: AlertsConfig = field(default_factory=AlertsConfig)
    """Where alerts go and how often."""
    repair: RepairConfig = field(default_factory=RepairConfig)
    """Bounds of one repair of a live teacher."""
    replicas: ReplicasConfig = field(default_factory=ReplicasConfig)
    """A teacher made of replicas: how few may serve before the run halts."""


def register_configs() -> None:
    """Put the schema in Hydra's ConfigStore (idempotent)."""
    ConfigStore.instance().store(group="guard", name="base_guard", node=GuardConfig)


register_configs()


def compose_guard_config(preset: str = "default", overrides: list[str] | None = None) -> DictConfig:
    """Compose a preset outside a Hydra app (CLI, notebooks, tests) or inside one; raises on
    unknown keys.

    ``overrides`` are relative to the guard node: ``["run.vocab_size=151936"]``. The result
    depends on nothing but the preset files and the overrides, so it is composed once per
    (preset, overrides) and handed out as a copy: building many guards (every rank's, a replay
    per file) costs one composition.
    """
    if preset not in PRESETS:
        raise GuardValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    return copy.deepcopy(_composed(preset, tuple(overrides or ())))


@functools.lru_cache(maxsize=128)
def _composed(preset: str, overrides: tuple[str, ...]) -> DictConfig:
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    # Inside a running Hydra app the global state is the app's: set it aside, then restore it.
    app = GlobalHydra.instance().hydra if GlobalHydra.instance().is_initialized() else None
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module="distill_guard.conf", version_base="1.3"):
            cfg = compose(
                config_name="guard_app",
                overrides=[f"guard={preset}", *(f"guard.{o}" for o in overrides)],
            )
    finally:
        GlobalHydra.instance().clear()
        if app is not None:
            GlobalHydra.instance().initialize(app)
    return cfg.guard


GuardSpec = Any
"""A :class:`DistillGuard`, a preset name, a guard config (DictConfig, mapping, GuardConfig) or None."""


def build_guard(
    spec: GuardSpec = None, overrides: Sequence[str] = (), **kwargs: Any
) -> DistillGuard:
    """The one way from configuration to a guard.

    ``spec`` is a preset name (``default``, ``monitor_only``, ``strict``; None is ``default``),
    a guard config (a composed ``DictConfig``, a mapping, or a :class:`GuardConfig`), or a
    guard, returned as is. ``overrides`` are Hydra overrides relative to the guard node
    (``"run.vocab_size=151936"``). ``kwargs`` go to :class:`DistillGuard` (``teacher``,
    ``rank``, ``events``, ``alerter``, ...) and win over the configuration.
    """
    if isinstance(spec, DistillGuard):
        if overrides or kwargs:
            raise GuardValueError(
                "overrides and guard arguments need a preset or a config, not a guard"
            )
        return spec
    if spec is None or isinstance(spec, str):
        node = compose_guard_config(spec or "default", list(overrides))
    elif isinstance(spec, (DictConfig, Mapping, GuardConfig)):
        node = OmegaConf.merge(OmegaConf.structured(GuardConfig), spec)
        if overrides:
            node = OmegaConf.merge(node, OmegaConf.from_dotlist(list(overrides)))
    else:
        raise GuardTypeError(
            "a guard spec is a DistillGuard, a preset name, a config node or None, not "
            f"{type(spec).__name__}"
        )
    conf: GuardConfig = OmegaConf.to_object(node)  # type: ignore[assignment]
    kwargs.setdefault("canary", conf.checks.canary)
    kwargs.setdefault("teacher_reference", conf.teacher_reference)
    kwargs.setdefault("events", conf.events_path)
    kwargs.setdefault("repair_attempts", conf.repair.max_attempts)
    kwargs.setdefault("repair_backoff_s", conf.repair.backoff_s)
    rank = kwargs.setdefault("rank", 0)
    kwargs.setdefault(
        "alerter",
        Alerter(
            rank=rank,
            use_wandb=conf.alerts.use_wandb,
            min_interval_s=conf.alerts.min_interval_s,
            webhook_env=conf.alerts.webhook_url_env,
            webhook_timeout_s=conf.alerts.webhook_timeout_s,
        ),
    )
    guard = DistillGuard(conf.checks.enabled(), conf.policy, conf.run, **kwargs)
    guard.preset = (spec or "default") if spec is None or isinstance(spec, str) else None
    return guard


def describe_bad_override(preset: str, overrides: Sequence[str], exc: BaseException) -> str:
    """One line saying why ``overrides`` (``--set KEY=VALUE``, relative to the guard node) do
    not compose on ``preset``: the key that is not a setting, with the node's valid keys and the
    closest of them, a ``guard.`` prefix that doubles the node, or Hydra's own reason (a value
    of the wrong type) from the exception's cause, not only its first line."""
    import difflib

    base = compose_guard_config(preset) if preset in PRESETS else None
    for override in overrides:
        key = override.partition("=")[0].lstrip("+~")
        if base is None or not key:
            continue
        node: Any = base
        parts = key.split(".")
        for depth, part in enumerate(parts):
            if not isinstance(node, DictConfig):
                where = ".".join(parts[:depth])
                return f"{override!r}: {where} is a value, not a group of settings"
            if part in node:
                node = node[part]
                continue
            where = ".".join(parts[:depth]) or "the guard config"
            valid = sorted(str(k) for k in node)
            close = difflib.get_close_matches(part, valid, n=1)
            hint = f"; did you mean {'.'.join([*parts[:depth], close[0]])}?" if close else ""
            if depth == 0 and part == "guard":
                hint = "; --set keys are relative to the guard node: drop the 'guard.' prefix"
            return f"{override!r}: {where} has no key {part!r} (valid: {', '.join(valid)}){hint}"
    lines = [str(exc).splitlines()[0]] if str(exc) else [type(exc).__name__]
    cause = exc.__cause__ or exc.__context__
    if cause is not None and str(cause):
        lines.append(str(cause).splitlines()[0])
    return ": ".join(lines)
