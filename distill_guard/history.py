"""Reading a run's metric history (JSONL or a wandb CSV export) into per-step role values."""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from distill_guard.errors import GuardError
from distill_guard.metric_names import candidates, lookalikes, resolve_first
from distill_guard.observations import Metric

STEP_KEYS = ("_step", "step", "train/step", "global_step", "train/global_step")
REQUIRED_ROLES = (Metric.LOSS,)


class HistoryError(GuardError, ValueError):
    """A history file the replay cannot use; the message names the file, line and problem."""

    def __init__(self, path: str | os.PathLike[str], problem: str, line: int | None = None) -> None:
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {problem}")


@dataclass(frozen=True)
class History:
    """Per-step metric values in step order, with the roles resolved to the file's keys."""

    path: str
    steps: list[tuple[int, dict[str, float]]]
    """(step, {role: value}) for each step, only the roles present at that step."""
    keys: dict[str, str]
    """role → the key it was read from (``eval/*`` resolved to the concrete key)."""
    missing: list[str]
    """Optional roles not found anywhere in the file."""
    tried: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """role → the names tried for it, in order (every convention's, or the ``--key`` one)."""
    lookalikes: dict[str, str] = field(default_factory=dict)
    """Columns read as no role that look like one that did not resolve: column → that role
    (:func:`~distill_guard.metric_names.lookalikes`)."""


def _parse_value(raw: object, path: str, line: int, key: str) -> float | None:
    if raw is None or raw == "":
        return None
    if isinstance(raw, bool):
        raise HistoryError(path, f"value of '{key}' is a boolean ({raw}), expected a number", line)
    if isinstance(raw, (int, float)):
        return float(raw)
    if isinstance(raw, str):
        try:
            return float(raw)  # accepts "nan", "inf", "-Infinity"
        except ValueError:
            pass
    raise HistoryError(path, f"value of '{key}' is {raw!r}, expected a number", line)


def _iter_rows(path: Path) -> Iterator[tuple[int, dict[str, object]]]:
    """(line number, raw row) for each row of a JSONL or CSV file, read a line at a time."""
    line = 0
    try:
        with path.open(encoding="utf-8-sig", newline="") as fh:  # a BOM is not part of a key
            if path.suffix.lower() == ".csv":
                reader = csv.DictReader(_text_lines(fh, path))
                if not reader.fieldnames:
                    raise HistoryError(path, "CSV has no header row", 1)
                for line, row in enumerate(reader, start=2):
                    if None in row:
                        raise HistoryError(
                            path,
                            f"row has more cells than the {len(reader.fieldnames)}-column header",
                            line,
                        )
                    yield line, row
                return
            for line, text in enumerate(_text_lines(fh, path), start=1):
                if text.strip():
                    yield line, _json_row(text, path, line)
    except UnicodeDecodeError:
        raise HistoryError(
            path, f"not UTF-8 text (after line {line}): expected a .jsonl or .csv history"
        ) from None


def _text_lines(fh: TextIO, path: Path) -> Iterator[str]:
    for n, text in enumerate(fh, start=1):
        if "\x00" in text:
            raise HistoryError(
                path, "binary data (NUL bytes): expected a .jsonl or .csv history", n
            )
        yield text


def _json_row(text: str, path: Path, line: int) -> dict[str, object]:
    try:
        row = json.loads(text)
    except RecursionError:
        raise HistoryError(path, "JSON nested too deeply to be a metrics row", line) from None
    except json.JSONDecodeError as exc:
        raise HistoryError(
            path, f"not valid JSON ({exc.msg} at column {exc.colno})", line
        ) from None
    if not isinstance(row, dict):
        raise HistoryError(
            path, f"expected one JSON object per line, got {type(row).__name__}", line
        )
    return row


def _scan_keys(path: Path) -> tuple[set[str], int]:
    """First pass: every key and the row count, holding neither the file nor its rows."""
    keys: set[str] = set()
    n = 0
    for _, row in _iter_rows(path):
        keys.update(row)
        n += 1
    if n == 0:  # a CSV got past its header row; a JSONL without rows has only blank lines
        raise HistoryError(
            path,
            "file has a header but no rows: no steps to replay"
            if path.suffix.lower() == ".csv"
            else "file is empty: no steps to replay",
        )
    return keys, n


def load_history(path: str | os.PathLike[str], key_map: Mapping[str, str] | None = None) -> History:
    """Load a history; ``key_map`` overrides role → key (``--key``), every other role is read
    under the first of its candidates in the file, across every known convention
    (:data:`~distill_guard.metric_names.METRIC_CANDIDATES`).

    Streams the file twice (its keys, then the values of the resolved keys), so memory grows
    with steps × roles, not with the file: a wandb export with hundreds of columns per row is
    never held whole."""
    p = Path(path)
    if not p.exists():
        raise HistoryError(p, "file not found")
    if p.is_dir():
        raise HistoryError(p, "is a directory, expected a .jsonl or .csv file")
    for role in key_map or {}:
        if role not in Metric.ALL:
            raise HistoryError(
                p, f"unknown role '{role}' in --key; roles are {', '.join(Metric.ALL)}"
            )
    names = candidates(key_map)
    all_keys, n_rows = _scan_keys(p)
    resolved = {role: resolve_first(tried, all_keys) for role, tried in names.items()}
    step_key = next((k for k in STEP_KEYS if k in all_keys), None)
    read = {key for key in resolved.values() if key is not None}
    unread = all_keys - read - set(STEP_KEYS)
    unresolved = [role for role, key in resolved.items() if key is None]
    alike = lookalikes(unread, unresolved)
    for role in REQUIRED_ROLES:
        if resolved[role] is None:
            shown = ", ".join(sorted(all_keys)[:12]) + (" ..." if len(all_keys) > 12 else "")
            tried = " or ".join(f"'{name}'" for name in names[role])
            near = [k for k, r in alike.items() if r == role]
            hint = f"; {', '.join(repr(k) for k in near)} looks like it" if near else ""
            raise HistoryError(
                p,
                f"metric {tried} (role {role}) is in none of the {n_rows} rows; "
                f"keys present: {shown}{hint}. Map it with --key {role}=NAME",
            )
    merged: dict[int, dict[str, float]] = {}
    for index, (line, row) in enumerate(_iter_rows(p)):
        step = index
        if step_key is not None and row.get(step_key) not in (None, ""):
            value = _parse_value(row[step_key], str(p), line, step_key)
            if value is None or not math.isfinite(value) or value != int(value) or value < 0:
                raise HistoryError(
                    p, f"step '{step_key}' is {row[step_key]!r}, expected a whole number >= 0", line
                )
            step = int(value)
        values = merged.setdefault(step, {})
        for role, key in resolved.items():
            if key is not None and key in row:
                v = _parse_value(row[key], str(p), line, key)
                if v is not None:
                    values[role] = v
    steps = sorted(merged.items())
    keys = {role: key for role, key in resolved.items() if key is not None}
    missing = sorted(unresolved)
    return History(str(p), steps, keys, missing, dict(names), alike)
