"""What a conformance run reports: its rows (:class:`ConformanceRow`), the report
(:class:`ConformanceReport`), the markdown table ``probe --conformance`` prints
(:func:`format_conformance`), and the redaction of what identifies the server (a URL's userinfo
and query, the served model's path, any secret in a message) before anything is shown."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from distill_guard import redaction
from distill_guard._version import __version__

PRECONDITION = (
    "the teacher must be awake when probed, and nothing else may release or pause it meanwhile "
    "(SGLang cannot be asked whether it is released, and a scoring call on a released server "
    "kills it)"
)


class Result(enum.Enum):
    """A row's verdict."""

    PASS = "pass"
    FAIL = "FAIL"
    SKIPPED = "skipped"
    WARN = "warn"


@dataclass(frozen=True)
class ConformanceRow:
    """One check: what the guard assumes of the server, what the server did."""

    check: str
    assumes: str
    observed: str
    result: Result

    def to_dict(self) -> dict[str, str]:
        return {
            "check": self.check,
            "assumes": self.assumes,
            "observed": self.observed,
            "result": self.result.value,
        }


@dataclass
class ConformanceReport:
    """The rows of one conformance run and what identifies the server (secrets redacted)."""

    url: str
    sglang_version: str | None
    model: str | None
    rows: list[ConformanceRow] = field(default_factory=list)
    distill_guard_version: str = __version__

    @property
    def failed(self) -> list[ConformanceRow]:
        return [r for r in self.rows if r.result is Result.FAIL]

    @property
    def exit_code(self) -> int:
        """0 when nothing FAILs, 1 when something does."""
        return 1 if self.failed else 0

    @property
    def verdict(self) -> str:
        counts = {r: sum(row.result is r for row in self.rows) for r in Result}
        tally = ", ".join(f"{n} {r.value}" for r, n in counts.items() if n)
        if self.failed:
            names = ", ".join(r.check for r in self.failed)
            return (
                f"verdict: FAIL: the server does not behave as the guard assumes ({names}); "
                f"{tally} (exit 1)"
            )
        return f"verdict: the server behaves as the guard assumes; {tally} (exit 0)"

    def to_json(self) -> dict[str, Any]:
        return {
            "distill_guard": self.distill_guard_version,
            "url": self.url,
            "sglang_version": self.sglang_version,
            "model": self.model,
            "precondition": PRECONDITION,
            "ok": not self.failed,
            "rows": [r.to_dict() for r in self.rows],
            "verdict": self.verdict,
        }


# -- redaction ------------------------------------------------------------------------------


redact_url = redaction.redact_url
url_secrets = redaction.url_secrets


def scrub(text: str, secrets: list[str]) -> str:
    """Every secret in ``text`` replaced, the registered ones and ``secrets``
    (:func:`distill_guard.redaction.redact`)."""
    return redaction.redact(text, secrets)


def model_name(path: Any) -> str | None:
    """The served model's last path part: the rest of a path may name a user or a mount."""
    if not path:
        return None
    return PurePosixPath(str(path).replace("\\", "/").rstrip("/")).name or None


# -- output ------------------------------------------------------------------------------------


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def format_conformance(report: ConformanceReport) -> str:
    """The header, the markdown table, the verdict: what ``probe --conformance`` prints."""
    lines = [
        f"conformance probe: {PRECONDITION}.",
        f"distill_guard {report.distill_guard_version} · teacher {report.url} · SGLang "
        f"{report.sglang_version or 'unknown'} · model {report.model or 'unknown'}",
        "",
        "| check | the guard assumes | observed | result |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {_cell(r.check)} | {_cell(r.assumes)} | {_cell(r.observed)} | {r.result.value} |"
        for r in report.rows
    ]
    lines += ["", report.verdict]
    return "\n".join(lines)
