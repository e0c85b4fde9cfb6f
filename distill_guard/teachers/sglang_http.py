"""A teacher behind SGLang's native HTTP API (``/generate``, ``/release_memory_occupation``, ...)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from typing import Any

import httpx

from distill_guard.teachers._sglang_wire import parse_score_response, score_request
from distill_guard.teachers.base import (
    ScoreResult,
    TeacherError,
    TeacherHTTPError,
    TeacherUnreachable,
    TrackedTeacher,
    read_vocab_size,
)

log = logging.getLogger(__name__)

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


class SGLangHTTPTeacher(TrackedTeacher):
    """Scores, sleeps, wakes and reloads an SGLang server over its native HTTP API.

    Only idempotent reads (``/generate`` with ``max_new_tokens: 0``, ``/server_info``) are retried,
    on no answer or 502/503/504, within one overall ``timeout_s``; release, resume, reload and flush
    are sent once. Every failure is a :class:`TeacherError`: :class:`TeacherUnreachable` for no
    answer, :class:`TeacherHTTPError` with the server's message for an error answer.
    """

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
        vocab_size: int | None = None,
        tags_supported: bool | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        """
        Args:
            url: the server's base URL, e.g. ``http://127.0.0.1:30000`` (a trailing ``/generate``,
                as Relax's ``--opd-teacher-url`` has it, is accepted and stripped).
            api_key_env: environment variable holding ``--api-key``; sent as
                ``Authorization: Bearer``. Read at construction; unset means no key.
            admin_api_key_env: variable holding ``--admin-api-key``, sent instead on the admin
                endpoints (release, resume, reload, flush) when set.
            timeout_s: overall limit of one read, retries included.
            admin_timeout_s: limit of release, resume and reload (a reload reads the checkpoint).
            max_retries: extra tries of an idempotent read.
            retry_backoff_s: first pause between tries, doubled each time.
            vocab_size: V when known; otherwise read from ``config.json`` at the server's
                ``model_path`` if this machine can read it.
            tags_supported: None detects it: a server without ``/server_info`` (older SGLang) is
                treated as ignoring tags, so every release and resume acts on all of them.
        """
        super().__init__()
        base = url.rstrip("/")
        if base.endswith("/generate"):
            base = base[: -len("/generate")]
        self.url = base
        self.timeout_s = timeout_s
        self.admin_timeout_s = admin_timeout_s
        self.max_retries = max_retries
        self.retry_backoff_s = retry_backoff_s
        if tags_supported is not None:
            self.sleep_state.tags_supported = tags_supported
        self._tags_supported = tags_supported
        self._vocab_size = vocab_size
        self._info_path: str | None = None
        self._model_path: str | None = None
        key = os.environ.get(api_key_env) if api_key_env else None
        admin_key = os.environ.get(admin_api_key_env) if admin_api_key_env else None
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._admin_headers = (
            {"Authorization": f"Bearer {admin_key}"} if admin_key else dict(self._headers)
        )
        self._key_env = api_key_env
        self._client = httpx.Client(base_url=self.url, transport=transport)

    # -- transport -------------------------------------------------------------------------

    def _request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        idempotent: bool = False,
        admin: bool = False,
        allow_404: bool = False,
    ) -> httpx.Response:
        limit = self.admin_timeout_s if admin else self.timeout_s
        deadline = time.monotonic() + limit
        tries = 1 + (self.max_retries if idempotent else 0)
        headers = self._admin_headers if admin else self._headers
        last: TeacherError | None = None
        for attempt in range(tries):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                resp = self._client.request(
                    method, path, json=json, headers=headers, timeout=httpx.Timeout(remaining)
                )
            except httpx.TimeoutException:
                last = TeacherUnreachable(
                    f"{self.url}{path}: no answer within {limit:g} s", endpoint=path
                )
            except httpx.TransportError as e:
                last = TeacherUnreachable(f"cannot reach {self.url}{path}: {e}", endpoint=path)
            else:
                if resp.status_code < 400 or (allow_404 and resp.status_code == 404):
                    return resp
                message, body = error_message(resp)
                if resp.status_code == 401:
                    message += (
                        f" (send the server's --api-key through ${self._key_env})"
                        if self._key_env
                        else ""
                    )
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

    @staticmethod
    def _json(resp: httpx.Response, path: str) -> Any:
        try:
            body = resp.json()
        except ValueError as e:
            raise TeacherHTTPError(
                path, resp.status_code, f"answer is not JSON: {resp.text[:200]!r}"
            ) from e
        if isinstance(body, dict) and body.get("success") is False:
            raise TeacherHTTPError(path, resp.status_code, str(body.get("message", "")), body=body)
        return body

    # -- the Teacher protocol --------------------------------------------------------------

    def _score(self, sequences: list[list[int]], top_k: int, logprob_start_len: int) -> ScoreResult:
        body = score_request(sequences, top_k, logprob_start_len)
        resp = self._request("POST", "/generate", json=body, idempotent=True)
        return parse_score_response(
            self._json(resp, "/generate"), sequences, top_k, logprob_start_len
        )

    def _memory_body(self, tags: tuple[str, ...]) -> dict[str, Any]:
        return {"tags": list(tags)} if self.sleep_state.tags_supported else {}

    def release(self, tags: Sequence[str] | None = None) -> None:
        if self._tags_supported is None:
            self.server_info()  # detects an old server, which ignores tags
        super().release(tags)

    def resume(self, tags: Sequence[str] | None = None) -> None:
        if self._tags_supported is None:
            self.server_info()
        super().resume(tags)

    def _release(self, tags: tuple[str, ...]) -> None:
        self._request(
            "POST", "/release_memory_occupation", json=self._memory_body(tags), admin=True
        )

    def _resume(self, tags: tuple[str, ...]) -> None:
        self._request("POST", "/resume_memory_occupation", json=self._memory_body(tags), admin=True)

    def reload_weights(self, model_path: str | None = None) -> None:
        """``/update_weights_from_disk`` (in place) from ``model_path``, default the server's own."""
        path = model_path or self.model_path
        if not path:
            raise TeacherError("reload_weights: the server reports no model_path; pass one")
        resp = self._request(
            "POST", "/update_weights_from_disk", json={"model_path": path}, admin=True
        )
        self._json(resp, "/update_weights_from_disk")

    def flush_cache(self) -> None:
        """``/flush_cache``; SGLang refuses (400) while requests are running."""
        self._request("POST", "/flush_cache", admin=True)

    def server_info(self) -> dict[str, Any]:
        """``/server_info``, or ``/get_server_info`` on servers that predate the rename."""
        paths = [self._info_path] if self._info_path else ["/server_info", "/get_server_info"]
        for path in paths:
            resp = self._request("GET", path, idempotent=True, allow_404=True)
            if resp.status_code == 404:
                continue
            info = self._json(resp, path)
            if not isinstance(info, dict):
                raise TeacherHTTPError(path, resp.status_code, f"expected an object, got {info!r}")
            if self._info_path is None:
                self._info_path = path
                if self._tags_supported is None:
                    self._tags_supported = path == "/server_info"
                    self.sleep_state.tags_supported = self._tags_supported
                    if not self._tags_supported:
                        log.warning(
                            "%s has no /server_info (older SGLang): treating it as ignoring "
                            "memory tags, so every release and resume acts on all of them",
                            self.url,
                        )
            self._model_path = info.get("model_path") or self._model_path
            return info
        raise TeacherHTTPError(
            "/server_info", 404, "neither /server_info nor /get_server_info exists"
        )

    @property
    def model_path(self) -> str | None:
        if self._model_path is None:
            self.server_info()
        return self._model_path

    @property
    def vocab_size(self) -> int | None:
        """Explicit V, else ``config.json`` at the server's ``model_path`` when readable here."""
        if self._vocab_size is None:
            try:
                self._vocab_size = read_vocab_size(self.model_path)
            except TeacherError:
                return None
        return self._vocab_size

    def health(self) -> bool:
        """``/health``: True on 200. Says the server answers, not that its weights are sane."""
        try:
            return self._request("GET", "/health", idempotent=True).status_code == 200
        except TeacherError:
            return False

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> SGLangHTTPTeacher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SGLangHTTPTeacher({self.url!r})"
