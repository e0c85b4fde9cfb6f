"""distill_guard: training-loop guards for on-policy LLM distillation.

Importing the package imports neither torch nor Hydra: the names below are imported on first
use (torch for the guard, the losses and the observations; Hydra for :func:`build_guard`,
:class:`StepGuard` and the presets), httpx (the SGLang HTTP client) by the modules that use it,
and the optional extras (transformers, Lightning, FastAPI, matplotlib, sglang, triton, wandb:
:mod:`distill_guard.extras`) only when a feature that needs one is used.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

from distill_guard._version import __version__
from distill_guard.errors import GuardError
from distill_guard.findings import Code, Finding, Severity

if TYPE_CHECKING:
    from distill_guard.checks import default_checks
    from distill_guard.config import GuardConfig, build_guard, compose_guard_config
    from distill_guard.guard import DistillGuard
    from distill_guard.integrations.step_guard import StepGuard
    from distill_guard.linear_loss import distill_loss_from_hidden
    from distill_guard.losses import DistillLoss, distill_loss
    from distill_guard.observations import LossKind, Metric, RunSpec
    from distill_guard.policy import Action, Decision, Halt, Policy

_LAZY = {
    "default_checks": "distill_guard.checks",
    "DistillGuard": "distill_guard.guard",
    "distill_loss_from_hidden": "distill_guard.linear_loss",
    "DistillLoss": "distill_guard.losses",
    "distill_loss": "distill_guard.losses",
    "LossKind": "distill_guard.observations",
    "Metric": "distill_guard.observations",
    "RunSpec": "distill_guard.observations",
    "Action": "distill_guard.policy",
    "Decision": "distill_guard.policy",
    "Halt": "distill_guard.policy",
    "Policy": "distill_guard.policy",
    "GuardConfig": "distill_guard.config",
    "build_guard": "distill_guard.config",
    "compose_guard_config": "distill_guard.config",
    "StepGuard": "distill_guard.integrations.step_guard",
}
"""Named here, imported on first use: they bring torch (and Hydra, for the config names), and
``import distill_guard`` (every ``distill-guard`` command, ``--version`` first) needs neither."""

# fmt: off
__all__ = [
    "Action", "Code", "Decision", "DistillGuard", "DistillLoss", "Finding", "GuardConfig",
    "GuardError", "Halt", "LossKind", "Metric", "Policy", "RunSpec", "Severity", "StepGuard",
    "__version__", "build_guard", "compose_guard_config", "default_checks", "distill_loss",
    "distill_loss_from_hidden",
]
# fmt: on


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value  # imported once: later reads skip this hook
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
