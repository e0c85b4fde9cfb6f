"""Talking HTTP to an SGLang server: its keys, one request with its retries and deadline, its errors.

:class:`SGLangTransport` is what :class:`~distill_guard.teachers.sglang_http.SGLangHTTPTeacher`
sends everything through; it knows routes and keys, not what a route does to the teacher.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from distill_guard import redaction
from distill_guard.http_deadline import bound, deadline_at
from distill_guard.teachers.base import TeacherError, TeacherHTTPError, TeacherUnreachable

_T = TypeVar("_T", bound="SGLangTransport")

RETRY_STATUSES = frozenset({502, 503, 504})
"""Answers worth another try for an idempotent read: the server is starting, or a proxy hiccuped."""


def error_message(resp: httpx.Response) -> tuple[str, Any]:
    """The server's own error text from any of the bodies SGLang (or FastAPI) sends, and the body."""
    try:
        body: Any = resp.json()
    except ValueError:
        text = resp.text.strip()
        return (text or resp.reason_phrase or "no body"), text
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict):
            return str(err.get("message") or err), body
        if err is not None:
            return str(err), body
        if "message" in body:
            return str(body["message"]), body
        if "detail" in body:
            return str(body["detail"]), body
    return str(body), body


def answer_json(resp: httpx.Response, path: str) -> Any:
    """The JSON body of an answer; not JSON, or ``"success": false``: :class:`TeacherHTTPError`."""
    try:
        body = resp.json()
    except ValueError as e:
        raise TeacherHTTPError(
            path, resp.status_code, f"answer is not JSON: {resp.text[:200]!r}"
        ) from e
    if isinstance(body, dict) and body.get("success") is False:
        raise TeacherHTTPError(path, resp.status_code, str(body.get("message", "")), body=body)
    return body


@dataclass(frozen=True)
class KeySources:
    """Where the client's keys come from, by the names of their variables: never their values,
    so that it can be shown (``probe --conformance``) without leaking a key."""

    api_key_env: str | None
    """The variable ``--api-key`` is read from (None: none configured)."""
    api_key_set: bool
    """It held a key at construction, so one is sent as ``Authorization: Bearer``."""
    admin_key_env: str | None
    """The variable ``--admin-api-key`` is read from (None: none configured)."""
    admin_key_set: bool
    """It held a key; if not, the admin routes get the api key (if any)."""

    @property
    def admin_key_sent(self) -> bool:
        """A key (the admin key, else the api key) goes with the admin routes."""
        return self.admin_key_set or self.api_key_set


class SGLangTransport:
    """One SGLang server's HTTP side: its base URL, keys, timeouts and retries, and the httpx
    client. Only idempotent reads are retried, on no answer or 502/503/504, within one overall
    limit; every failure is a :class:`TeacherUnreachable` (no answer) or a
    :class:`TeacherHTTPError` (an error answer, with the server's message, keys scrubbed)."""

    def __init__(
        self,
        url: str,
        *,
        api_key_env: str | None = "SGLANG_API_KEY",
        admin_api_key_env: str | None = "SGLANG_ADMIN_API_KEY",
        timeout_s: float = 30.0,
        admin_timeout_s: float = 600.0,
        max_retries: int = 2,
        retry_backoff_s: float = 0.25,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        """The arguments as :class:`~distill_guard.teachers.sglang_http.SGLangHTTPTeacher` takes
        them: ``url`` with a trailing ``/generate`` stripped, keys read from their variables now."""
        base = url.rstrip("/")
        if base.endswith("/generate"):
            base = base[: -len("/generate")]
        self.url = base
        self.timeout_s = timeout_s
        self.admin_timeout_s = admin_timeout_s
        self.max_retries = max_retries
        self.retry_backoff_s = retry_backoff_s
        # a mounted secret file often ends in a newline: a header value with it is illegal, and
        # httpx's error would then carry the key into a message
        key = (os.environ.get(api_key_env) or "").strip() if api_key_env else ""
        admin_key = (os.environ.get(admin_api_key_env) or "").strip() if admin_api_key_env else ""
        redaction.register(key, admin_key)  # and what a URL's userinfo or query holds:
        redaction.register_url(base)
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._admin_headers = (
            {"Authorization": f"Bearer {admin_key}"} if admin_key else dict(self._headers)
        )
        self._key_env = api_key_env
        self._admin_key_env = admin_api_key_env if admin_key else None
        self.key_sources = KeySources(api_key_env, bool(key), admin_api_key_env, bool(admin_key))
        """Which variables the keys came from and whether each was set (never the keys)."""
        # every socket operation gets only the time left before the call's deadline (a server
        # that drips its headers is cut too); an injected mock transport is left as it is
        self._client = bound(httpx.Client(base_url=self.url, transport=transport))

    def _request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        idempotent: bool = False,
        admin: bool = False,
        allow_404: bool = False,
        timeout_s: float | None = None,
    ) -> httpx.Response:
        limit = (
            timeout_s
            if timeout_s is not None
            else self.admin_timeout_s
            if admin
            else self.timeout_s
        )
        deadline = time.monotonic() + limit
        tries = 1 + (self.max_retries if idempotent else 0)
        headers = self._admin_headers if admin else self._headers
        last: TeacherError | None = None
        for attempt in range(tries):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                resp = self._fetch(method, path, json, headers, remaining, deadline, limit)
            except httpx.TimeoutException:
                last = TeacherUnreachable(
                    f"{self.url}{path}: no answer within {limit:g} s", endpoint=path
                )
            except httpx.TransportError as e:
                last = TeacherUnreachable(
                    f"cannot reach {self.url}{path}: {self._scrub(str(e))}", endpoint=path
                )
            else:
                if resp.status_code < 400 or (allow_404 and resp.status_code == 404):
                    return resp
                message, body = error_message(resp)
                message = self._scrub(message)
                if resp.status_code == 401:
                    env = self._admin_key_env if admin else self._key_env
                    which = "--admin-api-key" if admin else "--api-key"
                    message += f" (send the server's {which} through ${env})" if env else ""
                last = TeacherHTTPError(path, resp.status_code, message, body=body)
                if resp.status_code not in RETRY_STATUSES:
                    raise last
            if attempt + 1 < tries:
                pause = min(self.retry_backoff_s * 2**attempt, deadline - time.monotonic())
                if pause > 0:
                    time.sleep(pause)
        raise last or TeacherUnreachable(
            f"{self.url}{path}: no answer within {limit:g} s", endpoint=path
        )

    def _fetch(
        self,
        method: str,
        path: str,
        json: Any,
        headers: dict[str, str],
        remaining: float,
        deadline: float,
        limit: float,
    ) -> httpx.Response:
        """One request, its whole answer read before ``deadline``: httpx's timeout bounds each
        socket read, and a server that drips its answer byte by byte would hold it forever. The
        bound client gives each read (of the headers too) only the time left; the check per
        chunk holds for a transport without a pool."""
        with (
            deadline_at(deadline),
            self._client.stream(
                method, path, json=json, headers=headers, timeout=httpx.Timeout(remaining)
            ) as streamed,
        ):
            chunks = []
            for chunk in streamed.iter_bytes():
                chunks.append(chunk)
                if time.monotonic() > deadline:
                    raise httpx.ReadTimeout(f"answer not complete within {limit:g} s")
            return httpx.Response(
                streamed.status_code,
                headers=[(k, v) for k, v in streamed.headers.items() if k != "content-encoding"],
                content=b"".join(chunks),
                request=streamed.request,
            )

    @staticmethod
    def _scrub(text: str) -> str:
        """No key in a message: a server's error body or httpx's may quote it."""
        return redaction.redact(text)

    # -- public transport: for a caller that probes the server itself (probe --conformance) --

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        admin: bool = False,
        allow_404: bool = False,
        idempotent: bool = False,
    ) -> httpx.Response:
        """One call of a route the client has no method for, as its own calls go: its keys (the
        admin key with ``admin``), its timeouts, retries only if ``idempotent``, and its errors
        (:class:`TeacherUnreachable`, :class:`TeacherHTTPError` with keys scrubbed). A 404 is
        returned, not raised, with ``allow_404``: how to ask whether a route exists. Nothing here
        tracks the sleep state: a call that releases, resumes or reads the weights is the
        caller's to make safe (the client's own methods do)."""
        return self._request(
            method, path, json=json, idempotent=idempotent, admin=admin, allow_404=allow_404
        )

    def status_without_key(self, method: str, path: str, json: Any = None) -> int:
        """The status of one request sent with no ``Authorization`` header, once, within
        ``timeout_s``: whether the server refuses a caller without a key. Only the status is
        returned, so nothing a server echoes (a key) can reach an output. No answer (all of it
        within ``timeout_s``): :class:`TeacherUnreachable`, naming only the error's type."""
        try:
            with deadline_at(time.monotonic() + self.timeout_s):
                resp = self._client.request(
                    method, path, json=json, headers={}, timeout=self.timeout_s
                )
        except httpx.TransportError as e:
            raise TeacherUnreachable(
                f"{path}: no answer ({type(e).__name__})", endpoint=path
            ) from None
        return resp.status_code

    def scrub(self, text: str) -> str:
        """``text`` with the client's keys replaced by ``<redacted>``: for anything shown that a
        server's answer or an error may have quoted a key into."""
        return self._scrub(text)

    def close(self) -> None:
        self._client.close()

    def __enter__(self: _T) -> _T:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"
