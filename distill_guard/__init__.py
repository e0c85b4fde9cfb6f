"""distill_guard: training-loop guards for on-policy LLM distillation.

Importing the package needs only torch: Hydra (for :func:`build_guard`, :class:`StepGuard` and
the presets) and httpx (the SGLang HTTP client) are imported by the modules that use them; the
optional extras (transformers, Lightning, FastAPI, matplotlib, sglang, triton, wandb:
:mod:`distill_guard.extras`) only when a feature that needs one is used.
"""

from importlib import import_module
from typing import Any

from distill_guard._version import __version__
from distill_guard.checks import default_checks
from distill_guard.errors import GuardError
from distill_guard.findings import Code, Finding, Severity
from distill_guard.guard import DistillGuard
from distill_guard.linear_loss import distill_loss_from_hidden
from distill_guard.losses import DistillLoss, distill_loss
from distill_guard.observations import LossKind, Metric, RunSpec
from distill_guard.policy import Action, Decision, Halt, Policy

_LAZY = {
    "GuardConfig": "distill_guard.config",
    "build_guard": "distill_guard.config",
    "compose_guard_config": "distill_guard.config",
    "StepGuard": "distill_guard.integrations.step_guard",
}
"""Named here, imported on first use: they bring Hydra."""

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
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
