"""Taps on an in-process teacher module: its forward's logits, or its hidden states through its head.

A trainer that runs the teacher in process never hands the guard its scores; these read them
where the trainer computes them, so the guard judges exactly what the loss consumed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger("distill_guard")


def logits_of(output: Any) -> torch.Tensor | None:
    """The logits of a model's forward output (a ModelOutput, a tuple, or a tensor)."""
    logits = getattr(output, "logits", None)
    if logits is None and isinstance(output, (tuple, list)) and output:
        logits = output[0]
    if logits is None and isinstance(output, torch.Tensor):
        logits = output
    return logits if isinstance(logits, torch.Tensor) else None


def vocab_width(module: torch.nn.Module) -> int | None:
    """The width of ``module``'s logits: its config's ``vocab_size`` (the text config's for a
    multimodal model), else its output embeddings' rows; None when it tells neither."""
    config = getattr(module, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()
    vocab = getattr(config, "vocab_size", None)
    if isinstance(vocab, int) and vocab > 1:
        return vocab
    head = module.get_output_embeddings() if hasattr(module, "get_output_embeddings") else None
    weight = getattr(head, "weight", None)
    return int(weight.shape[0]) if isinstance(weight, torch.Tensor) else None


def tap_logits(
    module: torch.nn.Module,
    sink: Callable[..., None],
    *,
    recording: Callable[[], bool],
    vocab: Callable[[], int | None],
) -> Any:
    """Hand every forward's logits of ``module`` to ``sink(logits, mask=...)`` while
    ``recording()``; outputs not as wide as ``vocab()`` (else the module's own width) are told
    once per kind at INFO and not judged. Returns the hook handle."""
    module_vocab = vocab_width(module)
    told: set[int] = set()

    def hook(_mod: Any, _args: Any, kwargs: dict[str, Any], output: Any) -> None:
        if not recording():
            return
        logits = logits_of(output)
        width_expected = vocab() or module_vocab
        if logits is None or (width_expected is not None and logits.shape[-1] != width_expected):
            width = -1 if logits is None else int(logits.shape[-1])
            if width not in told:  # once per kind of output, not on every step
                told.add(width)
                log.info(
                    "distill_guard: a forward of the watched teacher returned %s, not logits "
                    "over its %s-token vocabulary; such outputs are not judged (a trainer "
                    "that projects the teacher's hidden states itself must hand them to "
                    "StepGuard.observe_teacher_hidden_states)",
                    "no tensor" if logits is None else f"width {width}",
                    width_expected,
                )
            return
        mask = kwargs.get("attention_mask")
        if not isinstance(mask, torch.Tensor) or mask.shape != logits.shape[:-1]:
            mask = None
        try:
            sink(logits, mask=mask)
        except Exception:  # noqa: BLE001 - the guard must not break the teacher's forward
            log.exception("distill_guard: could not observe the teacher's logits")

    return module.register_forward_hook(hook, with_kwargs=True)


def project_hidden_states(
    hidden: torch.Tensor,
    head: torch.nn.Module,
    sink: Callable[..., None],
    *,
    chunk_rows: int,
    mask: torch.Tensor | None = None,
    labels: torch.Tensor | None = None,
    logit_scale: float = 1.0,
    softcap: float | None = None,
) -> None:
    """``hidden`` ``[B, K, H]`` through ``head``, times ``logit_scale``, then
    ``softcap * tanh(z / softcap)``, as the trainer's loss does, handed to
    ``sink(z, mask=..., labels=...)`` a few samples at a time (one ``[~chunk_rows, V]`` block
    at once, never ``[B, K, V]``). ``mask`` and ``labels`` are ``[B, K]``."""
    if hidden.dim() == 2:
        hidden = hidden.unsqueeze(0)
        mask = None if mask is None else mask.reshape(1, -1)
        labels = None if labels is None else labels.reshape(1, -1)
    per = max(1, chunk_rows // max(1, hidden.shape[1]))
    with torch.no_grad():
        for a in range(0, hidden.shape[0], per):
            z = head(hidden[a : a + per].to(head.weight.dtype)) * logit_scale
            if softcap is not None:
                z = softcap * torch.tanh(z / softcap)
            sink(
                z,
                mask=None if mask is None else mask[a : a + per],
                labels=None if labels is None else labels[a : a + per],
            )
