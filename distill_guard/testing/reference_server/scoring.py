"""A ``/generate`` of the reference server: its body checked and planned before it is queued, its
forward (the teacher's ``score``), and the answers SGLang sends, aborted ones included."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import torch

from distill_guard.teachers._sglang_wire import build_score_item, json_safe
from distill_guard.teachers.base import TeacherError
from distill_guard.teachers.torch_teacher import TorchTeacher
from distill_guard.testing.reference_server.request_fields import (
    input_batch,
    scoring_fields,
    token_ids_fields,
)

ABORTED = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
"""``FINISH_ABORT().to_json()``: a running request aborted by a pause, after its last forward
(0.4.9, 0.5.5 ``schedule_batch.py:156-169``)."""


@dataclass(frozen=True)
class Prefill:
    """A request's part of a prefill batch."""

    token_ids: bool
    """It asks ``token_ids_logprob``: the batch's ``extend_token_ids_logprob`` is on."""
    logprobs_without_ids: bool
    """It asks input logprobs (``pruned_len > 0``) and no ``token_ids_logprob``."""


def mixed_token_ids(batch: list[Prefill]) -> bool:
    """A batch that sends a request without ids through ``get_token_ids_logprobs_raw``:
    ``fatal_mixed_token_ids_batch`` (0.5.10–0.5.15 call ``torch.tensor(None)``)."""
    return any(p.token_ids for p in batch) and any(p.logprobs_without_ids for p in batch)


@dataclass
class Plan:
    """A checked ``/generate``: what its forward scores, and the items that need no scoring."""

    batch: list[list[int]]
    single: bool
    want_lp: list[Any]
    topks: list[int]
    items: list[dict[str, Any] | None]
    token_ids: list[list[int] | None] = field(default_factory=list)
    """Per item, the ``token_ids_logprob`` ids (None: not asked)."""
    groups: dict[tuple[int, int, tuple[int, ...] | None], list[int]] = field(default_factory=dict)
    """``(logprob_start_len, top_k, token ids)`` → the items scored together."""

    @property
    def prefill(self) -> Prefill:
        """What this request's prefill asks, as SGLang's batch-wide logprob flags see it."""
        return Prefill(
            token_ids=any(
                ids is not None and want for ids, want in zip(self.token_ids, self.want_lp)
            ),
            logprobs_without_ids=any(asked is None for _, _, asked in self.groups),
        )

    def ids_outside(self, vocab: int | None) -> list[int]:
        """Asked ids at or past the vocabulary: SGLang indexes its logprobs with them unchecked,
        which on a GPU is a device-side assert (negative ids wrap around, silently)."""
        if vocab is None:
            return []
        return [t for ids in self.token_ids if ids for t in ids if t >= vocab]


def plan(body: Any, *, vocab: int | None, context_len: int) -> Plan:
    """Check ``body`` as SGLang's tokenizer manager does before anything is queued (400s)."""
    batch, single = input_batch(body)
    check_lengths_and_ids(batch, vocab=vocab, context_len=context_len)
    want_lp, starts, topks = scoring_fields(body, len(batch))
    asked = token_ids_fields(body, len(batch))
    p = Plan(batch, single, want_lp, topks, [None] * len(batch), asked)
    for i, seq in enumerate(batch):
        start = len(seq) if (starts[i] is None or starts[i] == -1) else int(starts[i])
        if start > len(seq):
            raise TeacherError(
                f"logprob_start_len ({start}) is greater than the input length ({len(seq)})"
            )
        if not want_lp[i]:
            p.items[i] = _strip_logprobs(build_score_item(seq, _empty(), None, None, len(seq)))
        elif start == len(seq):
            p.items[i] = build_score_item(seq, _empty(), None, None, start)
        else:
            key = (start, int(topks[i]), tuple(asked[i]) if asked[i] else None)
            p.groups.setdefault(key, []).append(i)
    return p


def forward(teacher: TorchTeacher, p: Plan) -> list[dict[str, Any]]:
    """The request's one forward: every group scored, the items as SGLang shapes them."""
    t0 = time.perf_counter()
    items = list(p.items)
    for (start, k, asked), idx in p.groups.items():
        seqs = [p.batch[i] for i in idx]
        by_ids = None
        if asked is not None:  # negative ids index from the end, as torch indexing does
            wrapped = [t % (teacher.vocab_size or 1) for t in asked]
            by_ids = teacher.score_token_ids(seqs, [wrapped] * len(seqs), logprob_start_len=start)
        # one forward unless the top-k is asked too (score_token_ids has the token logprobs)
        res = (
            by_ids
            if by_ids is not None and k == 0
            else teacher.score(seqs, top_k=k, logprob_start_len=start)
        )
        for j, i in enumerate(idx):
            items[i] = build_score_item(
                p.batch[i],
                res.token_logprobs[j],
                res.topk_logprobs[j] if res.topk_logprobs else None,
                res.topk_ids[j] if res.topk_ids else None,
                start,
                latency_s=time.perf_counter() - t0,
                token_ids=asked,
                token_ids_logprobs=by_ids.token_ids_logprobs[j] if by_ids else None,
            )
    return [item for item in items if item is not None]


def answer(p: Plan, items: list[dict[str, Any]], *, aborted: bool = False) -> Any:
    """The JSON answer: one item for one sequence; ``aborted`` items carry FINISH_ABORT."""
    if aborted:
        for item in items:
            item["meta_info"]["finish_reason"] = dict(ABORTED)
    out = json_safe(items)
    return out[0] if p.single else out


def aborted_in_waiting_queue(p: Plan, *, before_0_5_5: bool) -> Any:
    """What the tokenizer manager answers for a request a pause aborted in the waiting queue
    (``_handle_abort_req``): ≤0.5.4 "Abort before prefill" (0.4.9 ``tokenizer_manager.py
    :1647-1664``), 0.5.5+ "Abort in waiting queue" with ``output_ids`` and the (empty) logprobs
    asked for (0.5.5 ``:1889-1924``). HTTP 200 either way."""
    items = []
    for i in range(len(p.batch)):
        meta: dict[str, Any] = {"id": uuid.uuid4().hex}
        if before_0_5_5:
            meta["finish_reason"] = {"type": "abort", "message": "Abort before prefill"}
            meta.update(prompt_tokens=0, completion_tokens=0)
            items.append({"text": "", "meta_info": meta})
            continue
        meta["finish_reason"] = {"type": "abort", "message": "Abort in waiting queue"}
        if p.want_lp[i]:
            meta.update(input_token_logprobs=[], output_token_logprobs=[])
            if p.topks[i]:
                meta.update(input_top_logprobs=[], output_top_logprobs=[])
        meta["completion_tokens"] = 0
        items.append({"text": "", "output_ids": [], "meta_info": meta})
    return items[0] if p.single else items


def check_lengths_and_ids(batch: list[list[int]], *, vocab: int | None, context_len: int) -> None:
    """SGLang refuses an input of ``context_len`` tokens or more (``_validate_one_request``,
    a 400). An id outside the vocabulary is refused too: SGLang does not check it, and on a
    GPU it ends in a device-side assert, so our client must never send one."""
    for seq in batch:
        if len(seq) >= context_len:
            raise TeacherError(
                f"The input ({len(seq)} tokens) is longer than the model's context length "
                f"({context_len} tokens)."
            )
        bad = [t for t in seq if t < 0 or (vocab is not None and t >= vocab)]
        if bad:
            raise TeacherError(
                f"input_ids hold {len(bad)} id(s) outside the vocabulary [0, {vocab}), first {bad[0]}"
            )


def _empty() -> torch.Tensor:
    return torch.empty(0)


def _strip_logprobs(item: dict[str, Any]) -> dict[str, Any]:
    meta = item["meta_info"]
    for key in [k for k in meta if "logprobs" in k]:
        del meta[key]
    return item
