"""The teacher's logprobs of a different set of ids at each row: how a student's own top-K is
re-scored on a stock SGLang.

SGLang's ``token_ids_logprob`` takes one list of ids per request and answers it at every scored
row (``docs/sglang-contract.md`` §1.9). A student's top-K differs row by row, so the rows are
scored in windows: each window is one request over the sequence cut after its last row (later
tokens cannot change an earlier row's logprobs), asking for the union of the window's ids, and
each row keeps its own K. Windows are sized so no answer holds more than ``max_entries`` values.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from distill_guard.errors import GuardValueError
from distill_guard.teachers.base import Teacher

MAX_ENTRIES = 1 << 16
"""Values one answer may hold (rows × distinct ids): 64 Ki, about 2 MB of JSON."""


def score_ids_per_row(
    teacher: Teacher,
    sequence: Sequence[int],
    logprob_start_len: int,
    row_ids: torch.Tensor,
    *,
    max_entries: int = MAX_ENTRIES,
) -> torch.Tensor:
    """``[R, K]`` float32: at row ``r`` (predicting ``sequence[logprob_start_len + 1 + r]``), the
    teacher's logprob of each id in ``row_ids[r]``. ``row_ids`` is ``[R, K]`` with
    ``R = len(sequence) - logprob_start_len - 1``."""
    seq = [int(t) for t in sequence]
    rows = len(seq) - logprob_start_len - 1
    if row_ids.dim() != 2 or row_ids.shape[0] != rows:
        raise GuardValueError(
            f"row_ids must be [{rows}, K] for a sequence of {len(seq)} scored from "
            f"{logprob_start_len}, got {list(row_ids.shape)}"
        )
    ids = row_ids.to(torch.int64)
    out = torch.empty(ids.shape, dtype=torch.float32)
    a = 0
    while a < rows:
        b, asked = a + 1, sorted(set(ids[a].tolist()))
        while b < rows:
            grown = sorted(set(asked) | set(ids[b].tolist()))
            if (b + 1 - a) * len(grown) > max_entries:
                break
            asked, b = grown, b + 1
        cut = seq[: logprob_start_len + 1 + b]
        res = teacher.score_token_ids([cut], [asked], logprob_start_len=logprob_start_len + a)
        got = res.token_ids_logprobs[0]  # [b - a, len(asked)]
        column = {t: j for j, t in enumerate(asked)}
        index = torch.tensor([[column[t] for t in row] for row in ids[a:b].tolist()])
        out[a:b] = got.gather(1, index)
        a = b
    return out
