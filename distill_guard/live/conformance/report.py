"""What a conformance run reports: its rows (:class:`ConformanceRow`), the report
(:class:`ConformanceReport`), the markdown table ``probe --conformance`` prints
(:func:`format_conformance`), and the redaction of what identifies the server (a URL's userinfo
and query, the served model's path, any secret in a message) before anything is shown."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urlsplit, urlunsplit

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


def redact_url(url: str | None) -> str:
    """The URL with any userinfo and query replaced (a password or token may sit there)."""
    if not url:
        return "in process"
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port else "")
    if parts.username or parts.password:
        netloc = "<redacted>@" + netloc
    query = "<redacted>" if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def url_secrets(url: str | None) -> list[str]:
    """The userinfo of a URL, in every form a message may quote it."""
    if not url:
        return []
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0] if "@" in parts.netloc else ""
    found = [userinfo, parts.password or "", parts.query]
    return sorted({s for s in found if s}, key=len, reverse=True)


def scrub(text: str, secrets: list[str]) -> str:
    """Every secret in ``text`` replaced; one shorter than 6 characters only where it stands as
    a token of its own, so that it does not eat the letters of the words around it."""
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) >= 6:
            text = text.replace(secret, "<redacted>")
        else:
            text = re.sub(rf"(?<![\w.~+=-]){re.escape(secret)}(?![\w.~+=-])", "<redacted>", text)
    return text


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
