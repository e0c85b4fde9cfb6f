"""Hydra schemas: the check and policy dataclasses are themselves the config nodes.

Registered in Hydra's ConfigStore as ``guard/base_guard``; the presets in ``conf/guard/`` extend
it, so a misspelt key fails when the config is composed, not hours into a run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from distill_guard.alerts import Alerter
from distill_guard.checks import (
    EntropyDriftCheck,
    JSDCeilingCheck,
    NonfiniteMetricsCheck,
    ReverseKLSignatureCheck,
    TeacherCollapseCheck,
    TruncationCheck,
)
from distill_guard.checks.canary import CanaryCheck
from distill_guard.guard import DistillGuard
from distill_guard.observations import RELAX_METRIC_NAMES, LossKind, RunSpec
from distill_guard.policy import Policy

PRESETS = ("default", "monitor_only", "strict")
CONF_DIR = "pkg://distill_guard.conf"
"""Hydra search path entry that finds the presets wherever the package is installed."""


@dataclass
class RunConfig:
    """Facts of the run; see :class:`~distill_guard.observations.RunSpec`."""

    vocab_size: int | None = None
    """Teacher vocabulary size (``config.json`` ``vocab_size``; 151936 for Qwen3)."""
    loss: LossKind = LossKind.JSD
    """JSD, REVERSE_KL or FORWARD_KL: the loss in the loss metric."""
    beta: float = 0.5
    """JSD teacher weight (Relax ``--opd-jsd-alpha``)."""
    loss_scale: float = 1.0
    """Factor applied to the per-token loss before logging (coefficients, T², sum vs mean)."""


@dataclass
class ChecksConfig:
    """One node per check, named as in presets and on the command line."""

    teacher_collapse: TeacherCollapseCheck = field(default_factory=TeacherCollapseCheck)
    jsd_ceiling: JSDCeilingCheck = field(default_factory=JSDCeilingCheck)
    reverse_kl_signature: ReverseKLSignatureCheck = field(default_factory=ReverseKLSignatureCheck)
    entropy_drift: EntropyDriftCheck = field(default_factory=EntropyDriftCheck)
    truncation: TruncationCheck = field(default_factory=TruncationCheck)
    nonfinite_metrics: NonfiniteMetricsCheck = field(default_factory=NonfiniteMetricsCheck)
    canary: CanaryCheck = field(default_factory=CanaryCheck)
    """Sleep/wake canary; used only when the guard is given a live teacher."""


@dataclass
class AlertsConfig:
    use_wandb: bool = True
    """Send alerts to the active wandb run (rank 0 only)."""
    min_interval_s: float = 600.0
    """Per-title throttle in seconds."""


@dataclass
class RepairConfig:
    max_attempts: int = 3
    """Reload-and-verify attempts before the guard halts the run."""
    backoff_s: float = 1.0
    """Wait before the second attempt; doubles each attempt."""


@dataclass
class GuardConfig:
    """The whole guard. Compose with ``guard=default|monitor_only|strict`` and override fields."""

    run: RunConfig = field(default_factory=RunConfig)
    checks: ChecksConfig = field(default_factory=ChecksConfig)
    policy: Policy = field(default_factory=Policy)
    alerts: AlertsConfig = field(default_factory=AlertsConfig)
    repair: RepairConfig = field(default_factory=RepairConfig)
    events_path: str | None = None
    """JSONL event file; None keeps events in the logger only."""
    metric_keys: dict[str, str] = field(default_factory=lambda: dict(RELAX_METRIC_NAMES))
    """Framework metric name for each role (Relax's by default)."""


def register_configs() -> None:
    """Put the schema in Hydra's ConfigStore (idempotent)."""
    ConfigStore.instance().store(group="guard", name="base_guard", node=GuardConfig)


register_configs()


def compose_guard_config(preset: str = "default", overrides: list[str] | None = None) -> DictConfig:
    """Compose a preset outside a Hydra app (CLI, notebooks, tests) or inside one; raises on
    unknown keys.

    ``overrides`` are relative to the guard node: ``["run.vocab_size=151936"]``.
    """
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    # Inside a running Hydra app the global state is the app's: set it aside, then restore it.
    app = GlobalHydra.instance().hydra if GlobalHydra.instance().is_initialized() else None
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module="distill_guard.conf", version_base="1.3"):
            cfg = compose(
                config_name="guard_app",
                overrides=[f"guard={preset}", *(f"guard.{o}" for o in overrides or [])],
            )
    finally:
        GlobalHydra.instance().clear()
        if app is not None:
            GlobalHydra.instance().initialize(app)
    return cfg.guard


def build_guard(cfg: DictConfig | GuardConfig, **kwargs: Any) -> DistillGuard:
    """A guard from a composed config. ``kwargs`` go to :class:`DistillGuard` (teacher, rank, ...)."""
    conf: GuardConfig = OmegaConf.to_object(cfg) if isinstance(cfg, DictConfig) else cfg
    checks = [c for name, c in vars(conf.checks).items() if name != "canary" and c.enabled]
    if kwargs.get("teacher") is not None:
        kwargs.setdefault("canary", conf.checks.canary)
    rank = kwargs.pop("rank", 0)
    kwargs.setdefault("events", conf.events_path)
    kwargs.setdefault(
        "alerter",
        Alerter(
            rank=rank, use_wandb=conf.alerts.use_wandb, min_interval_s=conf.alerts.min_interval_s
        ),
    )
    kwargs.setdefault("repair_attempts", conf.repair.max_attempts)
    kwargs.setdefault("repair_backoff_s", conf.repair.backoff_s)
    run = RunSpec(
        vocab_size=conf.run.vocab_size,
        loss=conf.run.loss,
        beta=conf.run.beta,
        loss_scale=conf.run.loss_scale,
    )
    return DistillGuard(checks, conf.policy, run, rank=rank, **kwargs)
