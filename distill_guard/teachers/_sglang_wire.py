"""SGLang's native ``/generate`` scoring shapes, both ways: build requests, read and write responses.

One module so the HTTP client, the ``sglang.Engine`` adapter and the reference server agree to the
field (see ``docs/sglang-contract.md`` §1): entry 0 of ``input_token_logprobs`` is
``[null, id, null]`` and ``input_top_logprobs[0]`` is ``null``.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from typing import Any

import torch

from distill_guard.errors import GuardValueError
from distill_guard.teachers.base import (
    ScoreResult,
    TeacherError,
    TeacherStateError,
    TrackedTeacher,
)
from distill_guard.teachers.capabilities import Capabilities
from distill_guard.teachers.sglang_versions import Outcome


def check_temperature(temperature: float | None) -> None:
    """Refuse a ``sampling_params.temperature`` SGLang refuses: it must be a finite number >= 0
    (``SamplingParams.verify``; 0 means greedy sampling and is read as 1)."""
    if temperature is None:
        return
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, (int, float))
        or not math.isfinite(temperature)
        or temperature < 0
    ):
        raise GuardValueError(
            f"temperature must be a non-negative finite number, got {temperature!r}"
        )


class SGLangScoring(TrackedTeacher):
    """The scoring both SGLang clients share: the protocol's ``score`` plus SGLang's
    ``temperature``, checked before anything is sent."""

    traffic_token_ids: bool = False
    """The server's other requests carry ``token_ids_logprob`` (Relax's ``student_topk`` and
    ``union`` selections do). Where a prefill batch mixing requests with and without it kills
    the server (SGLang 0.5.10–0.5.15, ``docs/sglang-contract.md`` §1.9), this client's requests
    follow that traffic: every one carries ``token_ids_logprob`` when True, none does when
    False (:meth:`_wire_token_ids`)."""

    capabilities: Capabilities  # provided by the client

    def _wire_token_ids(self, n: int, asked: list[list[int]] | None) -> list[list[int]] | None:
        """The ``token_ids_logprob`` to send with ``n`` sequences that ask ``asked``. On a version
        where a mixed batch kills (``fatal_mixed_token_ids_batch``), the request matches the
        server's other traffic: id 0 for each sequence where it asks none and the traffic
        carries ids; refused (nothing sent) where it asks ids and the traffic carries none."""
        if (asked is not None) == self.traffic_token_ids:
            return asked  # as the traffic is: nothing to ask of the version
        if self.capabilities.mixed_token_ids_batch is not Outcome.KILLS:
            return asked
        if self.traffic_token_ids:
            return [[0] for _ in range(n)]
        raise TeacherStateError(
            f"refusing token_ids_logprob on {self.capabilities.note}: a prefill batch that "
            "mixes it with a logprob request without it kills the scheduler on 0.5.10-0.5.15 "
            "(torch.tensor(None)), and this client was told the server's other requests "
            "carry none (traffic_token_ids=False). Upgrade to SGLang 0.5.16+, or set "
            "traffic_token_ids=True if every request to this server carries token_ids_logprob"
        )

    def _score(
        self,
        sequences: list[list[int]],
        top_k: int,
        logprob_start_len: int,
        temperature: float | None = None,
    ) -> ScoreResult:
        return self._generate(sequences, top_k, logprob_start_len, temperature)

    def _score_token_ids(
        self, sequences: list[list[int]], token_ids: list[list[int]], logprob_start_len: int
    ) -> ScoreResult:
        return self._generate(sequences, 0, logprob_start_len, token_ids=token_ids)

    def _generate(
        self,
        sequences: list[list[int]],
        top_k: int,
        logprob_start_len: int,
        temperature: float | None = None,
        token_ids: list[list[int]] | None = None,
    ) -> ScoreResult:
        """One prefill-only request (:meth:`_prefill`), its ``token_ids_logprob`` matched to the
        server's traffic, its answer checked and parsed: ``score`` and ``score_token_ids``."""
        wire = self._wire_token_ids(len(sequences), token_ids)
        items = self._prefill(sequences, top_k, logprob_start_len, temperature, wire)
        return parse_score_response(items, sequences, top_k, logprob_start_len, token_ids)

    def _prefill(
        self,
        sequences: list[list[int]],
        top_k: int,
        logprob_start_len: int,
        temperature: float | None,
        token_ids: list[list[int]] | None,
    ) -> Any:
        """The client's own call (``POST /generate``, ``Engine.generate``): SGLang's items."""
        raise NotImplementedError

    def score(
        self,
        sequences: Sequence[Sequence[int]],
        *,
        top_k: int = 0,
        logprob_start_len: int = 0,
        temperature: float | None = None,
    ) -> ScoreResult:
        """The :class:`~distill_guard.teachers.Teacher` ``score``, plus ``temperature``: sent as
        ``sampling_params.temperature`` (None: 0, as slime and Relax send it). No released SGLang
        applies it to input logprobs (``docs/sglang-contract.md`` §1.8); preflight sends it to
        measure exactly that."""
        check_temperature(temperature)
        return self._checked_score(sequences, top_k, logprob_start_len, temperature)


def sampling_params(temperature: float | None = None) -> dict[str, Any]:
    """The scoring request's ``sampling_params``. ``temperature`` defaults to 0, as slime and
    Relax send it; SGLang computes input logprobs at T = 1 whatever it says
    (``docs/sglang-contract.md`` §1.8), so it only matters to measure exactly that."""
    check_temperature(temperature)
    return {
        "temperature": 0 if temperature is None else float(temperature),
        "max_new_tokens": 0,
        "skip_special_tokens": False,
    }


def score_request(
    sequences: Sequence[Sequence[int]],
    top_k: int,
    logprob_start_len: int,
    temperature: float | None = None,
    token_ids: Sequence[Sequence[int]] | None = None,
) -> dict[str, Any]:
    """A batched prefill-only scoring request (``max_new_tokens: 0``), as slime and Relax send it;
    ``token_ids`` (one list per sequence) adds ``token_ids_logprob``."""
    body: dict[str, Any] = {
        "input_ids": [list(map(int, s)) for s in sequences],
        "sampling_params": sampling_params(temperature),
        "return_logprob": True,
        "logprob_start_len": int(logprob_start_len),
    }
    if top_k > 0:
        body["top_logprobs_num"] = int(top_k)
    if token_ids is not None:
        body["token_ids_logprob"] = [list(map(int, ids)) for ids in token_ids]
    return body


def _value(entry: Any, item: int, pos: int) -> float:
    if not isinstance(entry, (list, tuple)) or len(entry) < 2:
        raise TeacherError(
            f"/generate item {item} position {pos}: expected a (logprob, id, text) entry, "
            f"got {entry!r}"
        )
    v = entry[0]
    # SGLang serializes with orjson, which writes NaN and ±inf as null: null past entry 0 is NaN.
    return float("nan") if v is None else float(v)


def parse_score_response(
    items: Any,
    sequences: Sequence[Sequence[int]],
    top_k: int,
    logprob_start_len: int,
    token_ids: Sequence[Sequence[int]] | None = None,
) -> ScoreResult:
    """Turn SGLang's per-item dicts into a :class:`ScoreResult`, checking every length. Any
    answer of the wrong shape or type is a :class:`TeacherError`, never another exception."""
    try:
        result = _parse(items, sequences, top_k, logprob_start_len)
        if token_ids is None:
            return result
        asked = _parse_token_ids(items, sequences, logprob_start_len, token_ids)
        return ScoreResult(result.token_logprobs, result.topk_logprobs, result.topk_ids, asked)
    except (TypeError, ValueError, IndexError, AttributeError) as exc:
        raise TeacherError(f"/generate answer malformed: {type(exc).__name__}: {exc}") from None


def _parse_token_ids(
    items: Any,
    sequences: Sequence[Sequence[int]],
    logprob_start_len: int,
    token_ids: Sequence[Sequence[int]],
) -> list[torch.Tensor]:
    """``meta_info.input_token_ids_logprobs``: laid out as ``input_top_logprobs`` (entry 0 null,
    then one row per scored position), each row the asked ids' ``(logprob, id, text)`` in the
    order asked (``docs/sglang-contract.md`` §1.9)."""
    if isinstance(items, dict):
        items = [items]
    out = []
    for i, (item, seq, want) in enumerate(zip(items, sequences, token_ids)):
        rows = item["meta_info"].get("input_token_ids_logprobs")
        expected = len(seq) - logprob_start_len
        if not isinstance(rows, list) or len(rows) != expected:
            raise TeacherError(
                f"/generate item {i}: input_token_ids_logprobs missing or of the wrong length "
                f"(expected {expected} rows, entry 0 being null)"
            )
        vals = []
        for j, row in enumerate(rows[1:], 1):
            if not isinstance(row, list) or [int(e[1]) for e in row] != list(want):
                raise TeacherError(
                    f"/generate item {i} position {j}: the token ids answered are not the "
                    f"{len(want)} asked for"
                )
            vals.append([_value(e, i, j) for e in row])
        out.append(torch.tensor(vals, dtype=torch.float32).reshape(expected - 1, len(want)))
    return out


def _parse(
    items: Any, sequences: Sequence[Sequence[int]], top_k: int, logprob_start_len: int
) -> ScoreResult:
    if isinstance(items, dict):
        items = [items]
    if not isinstance(items, list) or len(items) != len(sequences):
        got = len(items) if isinstance(items, list) else type(items).__name__
        raise TeacherError(f"/generate returned {got} items for {len(sequences)} sequences")
    token_lps: list[torch.Tensor] = []
    topk_lps: list[torch.Tensor] | None = [] if top_k > 0 else None
    topk_ids: list[torch.Tensor] | None = [] if top_k > 0 else None
    for i, (item, seq) in enumerate(zip(items, sequences)):
        meta = item.get("meta_info") if isinstance(item, dict) else None
        if not isinstance(meta, dict) or "input_token_logprobs" not in meta:
            raise TeacherError(f"/generate item {i} has no meta_info.input_token_logprobs")
        entries = meta["input_token_logprobs"]
        expected = len(seq) - logprob_start_len
        if len(entries) != expected:
            raise TeacherError(
                f"/generate item {i}: {len(entries)} input_token_logprobs for a sequence of "
                f"length {len(seq)} with logprob_start_len={logprob_start_len} "
                f"(expected {expected}, entry 0 being null)"
            )
        token_lps.append(
            torch.tensor(
                [_value(e, i, j) for j, e in enumerate(entries[1:], 1)],
                dtype=torch.float32,
            )
        )
        if top_k > 0:
            rows = meta.get("input_top_logprobs")
            if not isinstance(rows, list) or len(rows) != expected:
                raise TeacherError(
                    f"/generate item {i}: input_top_logprobs missing or of the wrong length "
                    f"(expected {expected} rows)"
                )
            vals: list[list[float]] = []
            ids: list[list[int]] = []
            for j, row in enumerate(rows[1:], 1):
                if not row or len(row) != top_k:
                    raise TeacherError(
                        f"/generate item {i} position {j}: {len(row or [])} top logprobs, "
                        f"asked for {top_k}"
                    )
                vals.append([_value(e, i, j) for e in row])
                ids.append([int(e[1]) for e in row])
            assert topk_lps is not None and topk_ids is not None
            topk_lps.append(torch.tensor(vals, dtype=torch.float32).reshape(expected - 1, top_k))
            topk_ids.append(torch.tensor(ids, dtype=torch.int64).reshape(expected - 1, top_k))
    return ScoreResult(token_lps, topk_lps, topk_ids)


def json_safe(obj: Any) -> Any:
    """What orjson (SGLang's serializer) makes of an object: tuples as lists, NaN and ±inf as null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def build_score_item(
    input_ids: Sequence[int],
    token_logprobs: torch.Tensor,
    topk_logprobs: torch.Tensor | None,
    topk_ids: torch.Tensor | None,
    logprob_start_len: int,
    *,
    latency_s: float = 0.0,
    token_ids: Sequence[int] | None = None,
    token_ids_logprobs: torch.Tensor | None = None,
) -> dict[str, Any]:
    """One response item exactly as SGLang shapes it for ``max_new_tokens: 0`` (tuples for JSON arrays)."""
    ids = list(input_ids)[logprob_start_len:]
    lps = [float(v) for v in token_logprobs.tolist()]
    input_token_logprobs: list[tuple[Any, int, None]] = [(None, ids[0], None)] if ids else []
    input_token_logprobs += [(v, t, None) for v, t in zip(lps, ids[1:])]
    meta: dict[str, Any] = {
        "id": uuid.uuid4().hex,
        "finish_reason": {"type": "length", "length": 0},
        "prompt_tokens": len(input_ids),
        "completion_tokens": 0,
        "cached_tokens": 0,
        "reasoning_tokens": 0,
        "weight_version": "default",
        "num_retractions": 0,
        "input_token_logprobs": input_token_logprobs,
        "output_token_logprobs": [],
        "output_token_logprobs_length": 0,
        "e2e_latency": latency_s,
    }
    if topk_logprobs is not None and topk_ids is not None:
        rows: list[list[tuple[float, int, None]] | None] = [None] if ids else []
        for vals, tids in zip(topk_logprobs.tolist(), topk_ids.tolist()):
            rows.append([(float(v), int(t), None) for v, t in zip(vals, tids)])
        meta["input_top_logprobs"] = rows
        meta["output_top_logprobs"] = []
    if token_ids is not None and token_ids_logprobs is not None:
        asked: list[list[tuple[float, int, None]] | None] = [None] if ids else []
        for vals in token_ids_logprobs.tolist():
            asked.append([(float(v), int(t), None) for v, t in zip(vals, token_ids)])
        meta["input_token_ids_logprobs"] = asked
        meta["output_token_ids_logprobs"] = []
    return {"text": "", "output_ids": [], "meta_info": meta}
