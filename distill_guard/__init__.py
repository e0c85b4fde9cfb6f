"""distill_guard: training-loop guards for on-policy LLM distillation.

Importing the package needs only torch: Hydra (for :func:`build_guard` and the presets), httpx,
wandb, transformers, Lightning, FastAPI and sglang are imported by the modules that use them,
when they are used.
"""

__version__ = "0.1.0"

from importlib import import_module  # noqa: E402
from typing import Any  # noqa: E402

from distill_guard.checks import default_checks  # noqa: E402
from distill_guard.findings import Code, Finding, Severity  # noqa: E402
from distill_guard.guard import DistillGuard  # noqa: E402
from distill_guard.observations import LossKind, Metric, RunSpec  # noqa: E402
from distill_guard.policy import Action, Decision, Halt, Policy  # noqa: E402

_FROM_CONFIG = ("GuardConfig", "build_guard", "compose_guard_config")
"""Named here, imported on first use: they bring Hydra."""

# fmt: off
__all__ = [
    "Action", "Code", "Decision", "DistillGuard", "Finding", "GuardConfig", "Halt", "LossKind",
    "Metric", "Policy", "RunSpec", "Severity", "build_guard", "compose_guard_config",
    "default_checks",
]
# fmt: on


def __getattr__(name: str) -> Any:
    if name in _FROM_CONFIG:
        return getattr(import_module("distill_guard.config"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
