"""distill_guard: training-loop guards for on-policy LLM distillation.

Importing the package needs only torch (and numpy): Hydra, wandb, transformers, Lightning,
FastAPI and sglang are imported by the modules that use them, when they are used.
"""

from distill_guard.findings import Code, Finding, Severity
from distill_guard.guard import DistillGuard, default_checks
from distill_guard.observations import LossKind, Metric, RunSpec
from distill_guard.policy import Action, Decision, Policy

__all__ = [
    "Action",
    "Code",
    "Decision",
    "DistillGuard",
    "Finding",
    "LossKind",
    "Metric",
    "Policy",
    "RunSpec",
    "Severity",
    "default_checks",
]
__version__ = "0.1.0"
