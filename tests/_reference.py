"""Reference math for the tests, written once and independently of distill_guard.signals.

Each formula is here exactly once, in torch so it also serves as a differentiable loss (the
integration tests train with :func:`jsd`); the ``*64`` forms evaluate it in float64 and return
numpy arrays for ``np.testing``.
"""

from __future__ import annotations

import math

import numpy as np
import torch


def _as64(x) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach().to(torch.float64).cpu()
    return torch.as_tensor(np.asarray(x, dtype=np.float64))  # never through float32


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """−Σ p log p per row, with 0·log 0 = 0 (rows may hold −inf logits)."""
    lp = torch.log_softmax(logits, dim=-1)
    return -torch.special.xlogy(lp.exp(), lp.exp()).sum(-1)


def jsd(student_logits: torch.Tensor, teacher_logits: torch.Tensor, beta: float) -> torch.Tensor:
    """(1−β)·KL(s‖m) + β·KL(t‖m) per row, m = (1−β)·s + β·t (β weights the teacher)."""
    ls = torch.log_softmax(student_logits, dim=-1)
    lt = torch.log_softmax(teacher_logits, dim=-1)
    lm = torch.logaddexp(ls + math.log1p(-beta), lt + math.log(beta))

    def kl(lp: torch.Tensor) -> torch.Tensor:
        p = lp.exp()  # where p > 0, m >= (1-β)·p > 0, so the log ratio is finite there
        return torch.where(p > 0, p * (lp - lm), torch.zeros_like(p)).sum(-1)

    return (1.0 - beta) * kl(ls) + beta * kl(lt)


def log_softmax64(logits) -> np.ndarray:
    return torch.log_softmax(_as64(logits), dim=-1).numpy()


def entropy64(logits) -> np.ndarray:
    return entropy(_as64(logits)).numpy()


def jsd64(student_logits, teacher_logits, beta: float) -> np.ndarray:
    return jsd(_as64(student_logits), _as64(teacher_logits), beta).numpy()


def binary_entropy64(beta: float) -> float:
    """H(β) = −β ln β − (1−β) ln(1−β), the JSD's ceiling."""
    b = _as64(beta)
    return float(-(torch.special.xlogy(b, b) + (1 - b) * torch.log1p(-b)))
