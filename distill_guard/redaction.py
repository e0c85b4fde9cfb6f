"""One redaction for everything the package prints, logs or records.

Every secret the guard comes to know is registered here when it is read: an API key
(:func:`register`), a URL that carries one (:func:`register_url`: its userinfo, its query
values, and for a URL that is itself the secret, a webhook's, every path segment that looks like
a key). :func:`redact` then replaces each of them, in every form a server may echo it (as is,
percent-encoded or decoded, JSON-escaped), wherever it appears. The sinks call it before they
see a string: a :class:`~distill_guard.findings.Finding`'s message and values, every
:class:`~distill_guard.errors.GuardError`'s message, each event-file line, each alert, each log
record of the package's loggers and of httpx (:func:`install_log_filter`), and the CLI's output.

The registry is per process and only grows: a secret once known stays redacted, even after the
object that read it is gone. A secret shorter than :data:`MIN_TOKEN` characters is replaced only
where it stands as a token of its own, so that it does not eat the letters of words around it.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit, urlunsplit

__all__ = [
    "MASK",
    "MIN_TOKEN",
    "install_log_filter",
    "forget_all",
    "known",
    "redact",
    "redact_url",
    "redact_value",
    "register",
    "register_url",
    "url_secrets",
]

MASK = "<redacted>"
MIN_TOKEN = 6
"""Secrets shorter than this are replaced only as whole tokens."""
_SEGMENT_MIN = 8
"""A path segment of a secret URL this long is a key if it has a digit or a capital (Slack's
``T0123ABCD``, a Discord token), or at any length from :data:`_SEGMENT_ANY`."""
_SEGMENT_ANY = 20

_lock = threading.Lock()
_secrets: set[str] = set()
_pattern: re.Pattern[str] | None = None
_short: list[re.Pattern[str]] = []


def _forms(secret: str) -> set[str]:
    """The ways a server or a serializer may write ``secret`` back."""
    forms = {secret, quote(secret, safe=""), quote(secret), unquote(secret)}
    forms.add(json.dumps(secret)[1:-1])
    return {f for f in forms if f}


def register(*secrets: str | None) -> None:
    """Redact each of ``secrets`` (keys, tokens, passwords) from now on; empty ones are ignored."""
    global _pattern
    new = set()
    for secret in secrets:
        if isinstance(secret, str) and secret.strip():
            new |= _forms(secret.strip()) | _forms(secret)
    with _lock:
        if new <= _secrets:
            return
        _secrets.update(new)
        _pattern, _short[:] = _compile(_secrets)


def _compile(secrets: set[str]) -> tuple[re.Pattern[str] | None, list[re.Pattern[str]]]:
    """One pattern of the long secrets, longest first; one token pattern per short one."""
    long = sorted((s for s in secrets if len(s) >= MIN_TOKEN), key=len, reverse=True)
    pattern = re.compile("|".join(map(re.escape, long))) if long else None
    short = [
        re.compile(rf"(?<![\w.~+=%-]){re.escape(s)}(?![\w~+=%-]|\.\w)")
        for s in sorted((s for s in secrets if len(s) < MIN_TOKEN), key=len, reverse=True)
    ]
    return pattern, short


def forget_all() -> None:
    """Drop every registered secret (tests: each starts from an empty registry)."""
    global _pattern
    with _lock:
        _secrets.clear()
        _pattern, _short[:] = None, []


def url_secrets(url: str | None, *, whole: bool = False) -> list[str]:
    """What in ``url`` is secret: its userinfo (user and password), its query values, and with
    ``whole`` (a URL that is itself the secret) the URL, its path and every key-like segment."""
    if not url:
        return []
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # not a URL we can read: all of it is the secret
        return [url]
    found: list[str] = []
    if "@" in parts.netloc:
        userinfo = parts.netloc.rpartition("@")[0]
        found += [userinfo, parts.username or "", password or ""]
    found += [value for _, value in parse_qsl(parts.query, keep_blank_values=False)]
    if parts.query:
        found.append(parts.query)
    if whole:
        found += [url, parts.path]
        found += [seg for seg in parts.path.split("/") if _looks_like_a_key(seg)]
    return [s for s in found if s]


def register_url(url: str | None, *, whole: bool = False) -> None:
    """Redact what is secret in ``url`` (:func:`url_secrets`) from now on."""
    register(*url_secrets(url, whole=whole))


def _looks_like_a_key(segment: str) -> bool:
    if len(segment) >= _SEGMENT_ANY:
        return True
    return len(segment) >= _SEGMENT_MIN and any(c.isdigit() or c.isupper() for c in segment)


def known() -> bool:
    """Whether any secret is registered (the sinks' fast path)."""
    return bool(_secrets)


def redact(text: str, extra: Iterable[str] = ()) -> str:
    """``text`` with every registered secret (and each of ``extra``, not registered) replaced
    by :data:`MASK`."""
    if not isinstance(text, str) or not text:
        return text
    if extra:
        forms = set().union(*(_forms(e) for e in extra if e))
        pattern, short = _compile(forms | _secrets)
    elif not _secrets:
        return text
    else:
        pattern, short = _pattern, list(_short)
    if pattern is not None:
        text = pattern.sub(MASK, text)
    for p in short:
        text = p.sub(MASK, text)
    return text


def redact_value(value: Any) -> Any:
    """Every string inside ``value`` (dicts, lists, tuples) redacted; other values as they are."""
    if not _secrets:
        return value
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: redact_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact_value(v) for v in value)
    return value


def redact_url(url: str | None) -> str:
    """``url`` as it may be shown: its userinfo and query replaced, and the rest redacted of
    every registered secret (a key-like path segment of a webhook)."""
    if not url:
        return "in process"
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return MASK
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{port}" if port else "")
    if "@" in parts.netloc:
        netloc = f"{MASK}@" + netloc
    query = MASK if parts.query else ""
    return redact(urlunsplit((parts.scheme, netloc, parts.path, query, "")))


class RedactingFilter(logging.Filter):
    """Redacts a record's message (its arguments merged in) before any handler sees it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _secrets:
            try:
                message = record.getMessage()
            except Exception:  # noqa: BLE001 - a malformed record is logging's to report
                return True
            clean = redact(message)
            if clean != message:
                record.msg, record.args = clean, None
            if record.exc_info and record.exc_info[1] is not None:
                record.exc_text = redact(
                    logging.Formatter().formatException(record.exc_info)  # type: ignore[arg-type]
                )
                record.exc_info = None
        return True


_FILTER = RedactingFilter()
LOGGERS: tuple[str, ...] = (
    "distill_guard",
    "httpx",
    "httpcore",
    "httpcore.connection",
    "httpcore.http11",
    "httpcore.proxy",
)
"""The loggers whose records may carry a secret: the package's own, and httpx's request lines
(they name the whole URL)."""


def install_log_filter(names: Iterable[str] = LOGGERS) -> None:
    """Put the redacting filter on each named logger (idempotent). A logger's filter sees the
    records logged on that logger, so the package logs only on ``distill_guard``."""
    for name in names:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)


install_log_filter()
