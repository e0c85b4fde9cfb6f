"""The real SciKnowEval data, in the prompt format of Relax's SDPO recipe.

Relax's ``prepare_data.py`` turns raw SciKnowEval rows (the Hugging Face ``hicai-zju/SciKnowEval``
schema: ``question``, ``choices.text``/``choices.label``, ``answerKey``, ``type``, ``domain``,
``details.level``) into prompt rows: it keeps ``details.level == "L3"`` rows, formats the prompt
(question, ``A: ...`` choice lines, the fixed instruction), then holds out ``round(n *
eval_ratio)`` rows chosen by ``random.Random(seed)``. ``load_sciknoweval`` does the same, so its
train and eval items are the multiple-choice rows of Relax's ``train.jsonl`` and ``eval.jsonl``
for the same input. Rows that are not multiple choice with letters A-D (true/false, open-ended,
filling...) are split with the rest, as Relax does, then skipped and counted: the miniature only
scores letters.

Relax picks a domain by its input file (one domain's JSONL); here ``domain`` filters the whole
dataset, matched like Relax's ``_canonical_domain`` (case-insensitive, "Material" = "Materials").
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from examples.sdpo_sciknoweval.data import (
    LETTERS,
    MCQItem,
    load_sciknoweval_jsonl,
    read_jsonl,
)

log = logging.getLogger(__name__)

T = TypeVar("T")
Located = tuple[str, dict[str, Any]]  # ("where the row came from", row)
HF_DEFAULT_SPLIT = "test"  # SciKnowEval publishes a single split, "test"


def rows_to_items(
    rows: Iterable[dict[str, Any]],
    domain: str = "Biology",
    level: str = "L3",
    *,
    skipped: Counter[str] | None = None,
) -> list[MCQItem]:
    """Multiple-choice items from raw SciKnowEval rows of ``domain`` at ``level``.

    Rows of other domains or levels are left out silently; in-scope rows that are not
    multiple choice with labels A, B, (C, D) in order are counted in ``skipped`` by reason.
    Raises ``ValueError`` naming the row and the field when a row lacks a field it needs.
    """
    located = ((f"row {i}", row) for i, row in enumerate(rows))
    return _items(_in_scope(located, domain, level), skipped)


def load_sciknoweval(
    source: str,
    *,
    domain: str = "Biology",
    level: str = "L3",
    eval_ratio: float = 0.1,
    seed: int = 42,
    max_rows: int | None = None,
) -> tuple[list[MCQItem], list[MCQItem]]:
    """``(train, eval)`` items from ``source``, split like ``prepare_data.py --eval-ratio --seed``.

    ``source`` is one of
      - ``hf:<dataset id>[:split]``: ``datasets.load_dataset`` (split ``test`` by default);
      - ``raw:<path.jsonl>``: raw SciKnowEval rows, one JSON object a line;
      - ``relax:<path.jsonl>``: rows written by ``prepare_data.py``, read by
        ``load_sciknoweval_jsonl``. These are already filtered (``domain`` and ``level`` are
        not applied) and usually already split: ``eval_ratio=0`` loads the whole file as train.
    ``max_rows`` keeps the first rows before the split, like ``--max-rows``.
    """
    if not 0.0 <= eval_ratio < 1.0:
        raise ValueError(f"eval_ratio must be in [0, 1), got {eval_ratio}")
    if max_rows is not None and max_rows < 0:
        raise ValueError(f"max_rows must be non-negative, got {max_rows}")
    scheme, _, rest = source.partition(":")
    skipped: Counter[str] = Counter()
    if scheme == "relax":
        items = load_sciknoweval_jsonl(rest)[:max_rows]
        if not items:
            raise ValueError(f"{source}: no multiple-choice rows with letters A-D")
        train, eval_items = _split(items, eval_ratio, seed)
    elif scheme in ("hf", "raw"):
        rows = list(
            _in_scope(_read_hf(rest) if scheme == "hf" else read_jsonl(rest), domain, level)
        )
        if not rows:
            raise ValueError(
                f"{source}: no rows with domain={domain!r} and details.level={level!r}"
            )
        train_rows, eval_rows = _split(rows[:max_rows], eval_ratio, seed)
        train, eval_items = _items(train_rows, skipped), _items(eval_rows, skipped)
    else:
        raise ValueError(
            f"source {source!r}: expected hf:<dataset id>[:split], raw:<path> or relax:<path>"
        )
    what = f"{source} ({domain} {level})"
    if not train or (eval_ratio > 0 and not eval_items):
        raise ValueError(
            f"{what}: {len(train)} train and {len(eval_items)} eval multiple-choice items "
            f"after filtering (eval_ratio={eval_ratio}, max_rows={max_rows}; "
            f"skipped: {dict(skipped) or 'none'})"
        )
    log.info(
        "%s: %d train, %d eval items; skipped %s",
        what,
        len(train),
        len(eval_items),
        dict(skipped) or "none",
    )
    return train, eval_items


def _read_hf(spec: str) -> Iterator[Located]:
    """Rows of ``<dataset id>[:split]`` from the Hugging Face hub (or its local cache)."""
    dataset_id, _, split = spec.partition(":")
    try:
        import datasets
    except ImportError as err:
        raise ImportError(
            f"source 'hf:{spec}' needs the 'datasets' package (pip install datasets); "
            "or save the rows as JSON lines and use 'raw:<path>'"
        ) from err
    split = split or HF_DEFAULT_SPLIT
    for i, row in enumerate(datasets.load_dataset(dataset_id, split=split)):
        yield f"{dataset_id}[{split}] row {i}", row


def _canonical_domain(value: Any) -> str:
    """Relax's domain spelling: case-insensitive, and "Material" is "Materials"."""
    normalized = str(value or "").strip().casefold()
    return "Materials" if normalized == "material" else normalized.capitalize()


def _field(where: str, row: dict[str, Any], path: str) -> Any:
    """``row[a][b]...`` for ``path = "a.b"``; a ``ValueError`` naming the field when absent."""
    value: Any = row
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            raise ValueError(f"{where}: missing field {path!r}")
        value = value[key]
    return value


def _in_scope(rows: Iterable[Located], domain: str, level: str) -> Iterator[Located]:
    """The rows of ``domain`` at ``level`` (every row must say its domain and level)."""
    want_domain, want_level = _canonical_domain(domain), level.strip().upper()
    for where, row in rows:
        row_domain = _canonical_domain(_field(where, row, "domain"))
        row_level = str(_field(where, row, "details.level")).strip().upper()
        if row_domain == want_domain and row_level == want_level:
            yield where, row


def _items(rows: Iterable[Located], skipped: Counter[str] | None) -> list[MCQItem]:
    """Items from in-scope rows; non-multiple-choice rows are counted in ``skipped``."""
    items = []
    for where, row in rows:
        kind = str(_field(where, row, "type"))
        if not kind.startswith("mcq"):
            reason = f"type={kind}"
        else:
            labels, texts = _field(where, row, "choices.label"), _field(where, row, "choices.text")
            if not isinstance(labels, list) or not isinstance(texts, list):
                raise ValueError(
                    f"{where}: fields 'choices.label' and 'choices.text' must be lists"
                )
            if len(labels) != len(texts):
                raise ValueError(
                    f"{where}: 'choices.label' has {len(labels)} entries, 'choices.text' {len(texts)}"
                )
            answer = str(row.get("answerKey") or "").strip().upper()
            if not answer:
                raise ValueError(f"{where}: missing field 'answerKey' (a multiple-choice row)")
            if list(labels) != list(LETTERS[: len(labels)]) or len(labels) < 2:
                reason = "choice labels other than A-D in order"
            elif answer not in labels:
                raise ValueError(f"{where}: 'answerKey' {answer!r} is not one of {labels}")
            else:
                question = str(_field(where, row, "question")).strip()
                items.append(MCQItem(question, tuple(str(t) for t in texts), answer))
                continue
        if skipped is not None:
            skipped[reason] += 1
    return items


def _split(rows: list[T], eval_ratio: float, seed: int) -> tuple[list[T], list[T]]:
    """``prepare_data.py``'s hold-out: ``round(n * eval_ratio)`` indices from
    ``random.Random(seed).shuffle``, both parts kept in input order."""
    if eval_ratio == 0:
        return list(rows), []
    n_eval = round(len(rows) * eval_ratio)
    if n_eval == 0:
        raise ValueError(f"eval_ratio={eval_ratio} with {len(rows)} rows holds out no row")
    indices = list(range(len(rows)))
    random.Random(seed).shuffle(indices)
    held_out = set(indices[:n_eval])
    return (
        [r for i, r in enumerate(rows) if i not in held_out],
        [r for i, r in enumerate(rows) if i in held_out],
    )
