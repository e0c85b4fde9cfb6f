"""Float64 reference math, written independently of distill_guard.signals."""

from __future__ import annotations

import numpy as np
import torch


def _np64(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().to(torch.float64).cpu().numpy()
    return np.asarray(x, dtype=np.float64)


def log_softmax64(logits) -> np.ndarray:
    z = _np64(logits)
    m = np.max(z, axis=-1, keepdims=True)
    return z - m - np.log(np.sum(np.exp(z - m), axis=-1, keepdims=True))


def entropy64(logits) -> np.ndarray:
    """−Σ p log p per row, with 0·log 0 = 0."""
    lp = log_softmax64(logits)
    p = np.exp(lp)
    return -np.sum(np.where(p > 0, p * np.where(p > 0, lp, 0.0), 0.0), axis=-1)


def _kl(lp: np.ndarray, lq: np.ndarray) -> np.ndarray:
    p = np.exp(lp)
    support = p > 0  # where p > 0, q ≥ (1−β)·p > 0 too, so log q is finite there
    diff = np.where(support, np.where(support, lp, 0.0) - np.where(support, lq, 0.0), 0.0)
    return np.sum(p * diff, axis=-1)


def jsd64(student_logits, teacher_logits, beta: float) -> np.ndarray:
    """(1−β)·KL(s‖m) + β·KL(t‖m), m = (1−β)·s + β·t, in float64."""
    ls, lt = log_softmax64(student_logits), log_softmax64(teacher_logits)
    m = (1.0 - beta) * np.exp(ls) + beta * np.exp(lt)
    with np.errstate(divide="ignore"):
        lm = np.log(m)
    return (1.0 - beta) * _kl(ls, lm) + beta * _kl(lt, lm)


def binary_entropy64(beta: float) -> float:
    b = np.float64(beta)
    return float(-(b * np.log(b) + (1 - b) * np.log1p(-b)))
