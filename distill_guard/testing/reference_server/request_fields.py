"""A ``/generate`` body's fields checked as SGLang checks them, refused with SGLang's wording."""

from __future__ import annotations

import math
from typing import Any

from distill_guard.teachers.base import TeacherError
from distill_guard.testing.reference_server.errors import ContractError


def input_batch(body: Any) -> tuple[list[list[int]], bool]:
    """The body's ``input_ids`` as a batch, and whether they were one sequence (the reply is then
    one item). There is no tokenizer here: ``text`` is refused."""
    if not isinstance(body, dict):
        raise ContractError("request body must be a JSON object")
    ids = body.get("input_ids")
    if ids is None:
        if body.get("text") is not None:
            raise TeacherError("the reference server has no tokenizer: send input_ids")
        raise ContractError("one of text or input_ids is required")
    single = isinstance(ids, list) and (len(ids) == 0 or isinstance(ids[0], int))
    batch = [ids] if single else ids
    if (
        not isinstance(batch, list)
        or not batch
        or not all(isinstance(s, list) and s and all(isinstance(t, int) for t in s) for s in batch)
    ):
        raise ContractError("input_ids must be a non-empty list of ints or of int lists")
    return batch, single


def scoring_fields(body: dict[str, Any], n: int) -> tuple[list[Any], list[int], list[int]]:
    """Per item: ``return_logprob``, ``logprob_start_len``, ``top_logprobs_num``. Each
    ``sampling_params`` is checked first: its temperature as SGLang checks it, and
    ``max_new_tokens`` must be 0 (this server only scores)."""
    sampling = per_item(body.get("sampling_params") or {}, n, "sampling_params")
    for sp in sampling:
        if sp is not None and not isinstance(sp, dict):
            raise ContractError("sampling_params must be an object or a list of objects")
        check_temperature((sp or {}).get("temperature"))
        if (sp or {}).get("max_new_tokens", 128) != 0:
            raise TeacherError(
                "the reference server only scores: set sampling_params.max_new_tokens to 0"
            )
    want_lp = per_item(body.get("return_logprob", False), n, "return_logprob")
    starts = per_item_ints(body.get("logprob_start_len", -1), n, "logprob_start_len", minimum=-1)
    topks = per_item_ints(body.get("top_logprobs_num", 0) or 0, n, "top_logprobs_num", minimum=0)
    return want_lp, starts, topks


def token_ids_fields(body: dict[str, Any], n: int) -> list[list[int] | None]:
    """Per item: the ``token_ids_logprob`` ids, normalized as ``GenerateReqInput`` does (absent
    or empty: none; one id: that id for each item; a list of ids: the same list for each item;
    a list of lists: one per item)."""
    raw = body.get("token_ids_logprob")
    if not raw:
        return [None] * n
    if not isinstance(raw, list):
        raw = [raw]
    if not isinstance(raw[0], list):
        raw = [list(raw) for _ in range(n)]
    if len(raw) != n:
        raise ContractError(f"token_ids_logprob has {len(raw)} lists for {n} inputs")
    out: list[list[int] | None] = []
    for ids in raw:
        if ids is not None and (
            not isinstance(ids, list)
            or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids)
        ):
            raise ContractError(f"invalid type: {serde_type_name(ids)}, expected a list of ints")
        out.append(list(ids) if ids else None)
    return out


def check_temperature(value: Any) -> None:
    """``sampling_params.temperature`` checked as SGLang checks it, and otherwise ignored.

    SGLang refuses a non-number in its contract check (400 ``{"error": "invalid type: ..."}``) and
    a negative or non-finite one in ``SamplingParams.verify`` (400 ``{"error": {"message": ...}}``).
    It accepts any other value, and its input (prefill) logprobs are computed at T = 1 whatever
    the value (``docs/sglang-contract.md`` §1.8): so are this server's, the teacher's own
    ``log_softmax`` of its logits.
    """
    if value is None:  # SGLang reads null as its default, 1.0
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ContractError(f"invalid type: {serde_type_name(value)}, expected f64")
    if not math.isfinite(value) or value < 0:
        raise TeacherError(f"temperature must be a non-negative finite number, got {float(value)}.")


def serde_type_name(value: Any) -> str:
    """How SGLang's contract check names a JSON value of the wrong type (serde's wording)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean `{'true' if value else 'false'}`"
    if isinstance(value, str):
        return f'string "{value}"'
    if isinstance(value, list):
        return "sequence"
    if isinstance(value, dict):
        return "map"
    return type(value).__name__


def per_item(value: Any, n: int, name: str) -> list[Any]:
    if isinstance(value, list):
        if len(value) != n:
            raise ContractError(f"{name} has {len(value)} entries for {n} inputs")
        return value
    return [value] * n


def per_item_ints(value: Any, n: int, name: str, *, minimum: int) -> list[int]:
    """Per-item integer fields, refused as a contract violation (400) when not integers."""
    items = per_item(value, n, name)
    for v in items:
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < minimum):
            raise ContractError(f"{name} must be an integer >= {minimum}, got {v!r}")
    return items
