"""A teacher module's weights fingerprint: is it, bit for bit, the module the canary last scored?

:class:`~distill_guard.live.module_canary.ModuleCanary` takes one before each canary forward. The
same parameter and buffer objects (same ``data_ptr``, dtype, shape, stride and device) holding
the same values score the canary the same, so while the fingerprint is the one taken at the last
clean measurement the forward can be skipped.

What it is: per tensor, its L1 and L2 norms with float64 results (``torch._foreach_norm``, two
fused reductions per dtype and device on CUDA), an integer tensor's exact sum, max and min; read
back in one host transfer per device. Zeroing, noise, an EMA step, a partial reload or a tensor
copied over another all move the norms; two tensors swapped move their places in the layout or
their norms. What it cannot see: a permutation of the values inside one tensor, sign flips
(``|x|`` and ``x²`` are even), other changes that keep both norms, and changes below the norms'
rounding (a few elements moved by an ulp: far inside the canary's own tolerance); nor the code (a
patched ``forward``, a hook, an adapter switched off, a changed config). The canary's schedule
(``checks.canary.module_every_steps``) covers those.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

log = logging.getLogger("distill_guard")

Layout = tuple[tuple[int, torch.dtype, torch.Size, tuple[int, ...], torch.device], ...]


@dataclass(frozen=True)
class WeightsFingerprint:
    """Which tensors the module holds (``layout``) and their statistics, bit for bit."""

    layout: Layout
    """Per tensor: ``data_ptr``, dtype, shape, stride, device, in the module's order (a tensor
    swapped for another, or moved between two places, changes it)."""
    stats: bytes
    """The statistics' bytes, device by device in ``layout`` order."""


def take_fingerprint(module: torch.nn.Module) -> WeightsFingerprint | None:
    """The module's fingerprint, or None where it cannot be taken (a meta, sharded or subclassed
    tensor, a non-finite statistic, any error): then the caller runs the canary forward."""
    try:
        tensors = _tensors(module)
        if not all(_plain(t) for t in tensors):
            return None
        layout = tuple((t.data_ptr(), t.dtype, t.shape, t.stride(), t.device) for t in tensors)
        with torch.no_grad():
            stats = _stats(tensors)
    except Exception:  # noqa: BLE001 - fail closed: no fingerprint, the forward runs
        log.debug("distill_guard: no weights fingerprint; the canary forward runs", exc_info=True)
        return None
    return WeightsFingerprint(layout, stats) if stats is not None else None


def _tensors(module: torch.nn.Module) -> list[torch.Tensor]:
    """Every parameter and buffer (persistent or not; a tied one once), module by module in
    ``module.modules()`` order: a walk of the tree without ``named_parameters``' names (a third
    of the time on a 24-layer model)."""
    out: list[torch.Tensor] = []
    seen: set[int] = set()
    stack = [module]
    while stack:
        mod = stack.pop()
        for t in (*mod._parameters.values(), *mod._buffers.values()):
            if t is not None and id(t) not in seen:
                seen.add(id(t))
                out.append(t)
        stack.extend(m for m in reversed(mod._modules.values()) if m is not None)
    return out


def _plain(t: torch.Tensor) -> bool:
    """A dense tensor whose values live in it: not meta, sparse, quantized, a subclass (DTensor,
    FSDP's FlatParameter, bitsandbytes' Params4bit) or a ZeRO-3 placeholder (the values are on
    other ranks, and a fingerprint of one rank's shard would split the ranks' forwards)."""
    return (
        type(t) in (torch.Tensor, torch.nn.Parameter)
        and t.layout is torch.strided
        and not t.is_meta
        and not t.is_quantized
        and not hasattr(t, "ds_id")
    )


def _stats(tensors: list[torch.Tensor]) -> bytes | None:
    """The statistics of ``tensors``, one host transfer per device; None if any is non-finite
    (a NaN norm would hide every later change to its tensor)."""
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for t in tensors:
        by_device.setdefault(t.device, []).append(t)
    out = b""
    for device, group in by_device.items():
        floats, ints = _device_stats(device, group)
        if not bool(torch.isfinite(floats).all()):
            return None
        out += floats.numpy().tobytes() + ints.numpy().tobytes()
    return out


def _device_stats(
    device: torch.device, tensors: list[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(float norms, integer statistics) of one device's tensors, on the host."""
    acc = torch.float32 if device.type == "mps" else torch.float64  # MPS has no float64
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    integer: list[torch.Tensor] = []
    for t in tensors:
        if t.is_complex():
            t = torch.view_as_real(t)
        if t.is_floating_point():
            by_dtype.setdefault(t.dtype, []).append(t)
        else:
            integer.append(t)
    norms: list[torch.Tensor] = []
    for group in by_dtype.values():
        norms += torch._foreach_norm(group, 1, dtype=acc)
        norms += torch._foreach_norm(group, 2, dtype=acc)
    ints = [s for t in integer for s in _integer_stats(t)]
    floats = torch.stack(norms) if norms else torch.zeros(0, dtype=acc, device=device)
    exact = torch.stack(ints) if ints else torch.zeros(0, dtype=torch.int64, device=device)
    if device.type == "cpu" or acc is not torch.float64:
        return floats.cpu(), exact.cpu()
    both = torch.cat([floats, exact.view(torch.float64)]).cpu()  # one transfer
    return both[: floats.numel()], both[floats.numel() :].view(torch.int64)


def _integer_stats(t: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """An integer or bool tensor's exact sum, max and min (no float copy of a packed weight)."""
    if t.numel() == 0:
        return (torch.zeros((), dtype=torch.int64, device=t.device),)
    return (t.sum(dtype=torch.int64), t.amax().to(torch.int64), t.amin().to(torch.int64))
