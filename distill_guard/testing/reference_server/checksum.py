"""``/weights_checker {"action": "checksum"}`` answered as SGLang answers it, per version
(``docs/sglang-contract.md`` §7.2, the ``checksum`` row)."""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from distill_guard.teachers.sglang_versions import Checksum

PARALLELISM_INFO = {
    "tp_rank": 0,
    "tp_size": 1,
    "dp_rank": 0,
    "dp_size": 1,
    "pp_rank": 0,
    "pp_size": 1,
    "rank": 0,
    "size": 1,
}
"""One GPU, no parallelism (0.5.12 ``utils/weight_checker.py`` ``ParallelismInfo``)."""


def checksum_answer(model: torch.nn.Module, shape: Checksum) -> dict[str, Any]:
    """The 200 answer for ``shape`` (not :attr:`Checksum.NONE`).

    0.5.12 (``http_server.py:1294-1303``): ``ranks[].checksums``, a 16-hex hash per tensor, and
    ``parallelism_info``. 0.5.13+ (``tokenizer_control_mixin.py:766-777``; 0.5.23 ``:890-911``)
    add each rank's ``per_gpu_checksum`` (sha256 over the sorted names and hashes,
    ``weight_checker.py:84-88``) and ``per_engine_checksum``, the sha256 hexdigest of the ranks'
    ``per_gpu_checksum``: a string. Parameters only: SGLang skips RoPE's non-persistent
    buffers (``inv_freq``, ``cos_sin_cache``).
    """
    sums = {name: _tensor_hash(p) for name, p in model.named_parameters()}
    rank: dict[str, Any] = {"checksums": sums, "parallelism_info": dict(PARALLELISM_INFO)}
    body: dict[str, Any] = {"success": True, "message": "Success.", "ranks": [rank]}
    if shape is Checksum.PER_ENGINE_STRING:
        rank["per_gpu_checksum"] = _per_gpu(sums)
        engine = hashlib.sha256()
        for r in body["ranks"]:
            engine.update(r["per_gpu_checksum"].encode())
        body["per_engine_checksum"] = engine.hexdigest()
    return body


def _tensor_hash(t: torch.Tensor) -> str:
    """16 hex digits, as SGLang formats its 64-bit ``tensor_hash`` (``f"{h:016x}"``)."""
    raw = t.detach().cpu().contiguous().view(torch.uint8).numpy()
    return hashlib.sha256(raw).hexdigest()[:16]


def _per_gpu(sums: dict[str, str]) -> str:
    h = hashlib.sha256()
    for name in sorted(sums):
        h.update(name.encode())
        h.update(sums[name].encode())
    return h.hexdigest()
