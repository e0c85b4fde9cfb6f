"""Reading a run's metric history (JSONL or a wandb CSV export) into per-step role values."""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from distill_guard.metric_names import RELAX_METRIC_NAMES, resolve_key
from distill_guard.observations import Metric

STEP_KEYS = ("_step", "step", "train/step", "global_step")
REQUIRED_ROLES = (Metric.LOSS,)


class HistoryError(ValueError):
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


def _read_rows(path: Path) -> list[tuple[int, dict[str, object]]]:
    """(line number, raw row) for each row of a JSONL or CSV file."""
    try:
        text = path.read_text(encoding="utf-8-sig")  # a byte-order mark is not part of a key
    except UnicodeDecodeError as exc:
        raise HistoryError(
            path, f"not UTF-8 text (byte {exc.start}): expected a .jsonl or .csv history"
        ) from None
    if "\x00" in text:
        raise HistoryError(path, "binary data (NUL bytes): expected a .jsonl or .csv history")
    if not text.strip():
        raise HistoryError(path, "file is empty: no steps to replay")
    rows: list[tuple[int, dict[str, object]]] = []
    if path.suffix.lower() == ".csv":
        reader = csv.DictReader(text.splitlines())
        if not reader.fieldnames:
            raise HistoryError(path, "CSV has no header row", 1)
        for i, row in enumerate(reader, start=2):
            if None in row:
                raise HistoryError(
                    path, f"row has more cells than the {len(reader.fieldnames)}-column header", i
                )
            rows.append((i, dict(row)))
    else:
        for i, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except RecursionError:
                raise HistoryError(path, "JSON nested too deeply to be a metrics row", i) from None
            except json.JSONDecodeError as exc:
                raise HistoryError(
                    path, f"not valid JSON ({exc.msg} at column {exc.colno})", i
                ) from None
            if not isinstance(row, dict):
                raise HistoryError(
                    path, f"expected one JSON object per line, got {type(row).__name__}", i
                )
            rows.append((i, row))
    if not rows:
        raise HistoryError(path, "file has a header but no rows: no steps to replay")
    return rows


def load_history(path: str | os.PathLike[str], key_map: Mapping[str, str] | None = None) -> History:
    """Load a history; ``key_map`` overrides role → key (defaults: Relax's metric names)."""
    p = Path(path)
    if not p.exists():
        raise HistoryError(p, "file not found")
    if p.is_dir():
        raise HistoryError(p, "is a directory, expected a .jsonl or .csv file")
    names = dict(RELAX_METRIC_NAMES)
    for role, key in (key_map or {}).items():
        if role not in Metric.ALL:
            raise HistoryError(
                p, f"unknown role '{role}' in --key; roles are {', '.join(Metric.ALL)}"
            )
        names[role] = key
    rows = _read_rows(p)
    all_keys = set().union(*(r.keys() for _, r in rows))
    resolved = {role: resolve_key(key, all_keys) for role, key in names.items()}
    for role in REQUIRED_ROLES:
        if resolved[role] is None:
            shown = ", ".join(sorted(all_keys)[:12]) + (" ..." if len(all_keys) > 12 else "")
            raise HistoryError(
                p,
                f"metric '{names[role]}' (role {role}) is in none of the {len(rows)} rows; "
                f"keys present: {shown}. Map it with --key {role}=NAME",
            )
    step_key = next((k for k in STEP_KEYS if k in all_keys), None)
    merged: dict[int, dict[str, float]] = {}
    for index, (line, row) in enumerate(rows):
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
    missing = sorted(role for role, key in resolved.items() if key is None)
    return History(str(p), steps, keys, missing)
