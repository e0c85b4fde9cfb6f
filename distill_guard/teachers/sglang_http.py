"""A teacher behind SGLang's native HTTP API (``/generate``, ``/release_memory_occupation``, ...)."""

from __future__ import annotations

import hashlib
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import httpx

from distill_guard.teachers._sglang_wire import (
    SGLangScoring,
    parse_score_response,
    score_request,
)
from distill_guard.teachers.base import (
    ReleaseUnsafe,
    ScoreResult,
    TeacherError,
    TeacherHTTPError,
    TeacherStateError,
    TeacherUnreachable,
    read_vocab_size,
    redact,
)
from distill_guard.teachers.capabilities import (
    Capabilities,
    SleepPlan,
    capabilities_for,
    plan_sleep,
)
from distill_guard.teachers.sglang_versions import Pause

log = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({502, 503, 504})
"""Answers worth another try for an idempotent read: the server is starting, or a proxy hiccuped."""


def checksum_of(body: Any) -> str | None:
    """The weights' checksum from a ``/weights_checker`` answer: ``per_engine_checksum`` as it is
    (a string from 0.5.13), else (0.5.12) the per-tensor hashes of every rank
    (``ranks[].checksums``) hashed in rank and name order."""
    if not isinstance(body, dict):
        return None
    total = body.get("per_engine_checksum")
    if isinstance(total, str) and total:
        return total
    ranks = body.get("ranks")
    if not isinstance(ranks, list) or not ranks:
        return None
    digest = hashlib.sha256()
    for i, rank in enumerate(ranks):
        sums = rank.get("checksums") if isinstance(rank, dict) else None
        if not isinstance(sums, dict) or not sums:
            return None
        for name in sorted(sums):
            digest.update(f"{i}:{name}={sums[name]};".encode())
    return digest.hexdigest()


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


class SGLangHTTPTeacher(SGLangScoring):
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
        drain_timeout_s: float = 10.0,
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
            drain_timeout_s: how long a sleep waits for the server to go idle where the version's
                release needs it (0.4.9–0.5.5, 0.5.10–0.5.20); past it the teacher is not
                released this time (:meth:`drain`).
            max_retries: extra tries of an idempotent read.
            retry_backoff_s: first pause between tries, doubled each time.
            vocab_size: V when known; otherwise read from ``config.json`` at the server's
                ``model_path`` if this machine can read it.
            tags_supported: None reads it from the server's version (``capabilities``): SGLang
                0.4.8 and later honour memory tags; an unknown version is treated as ignoring
                them, so every release and resume acts on all of them.
        """
        super().__init__()
        base = url.rstrip("/")
        if base.endswith("/generate"):
            base = base[: -len("/generate")]
        self.url = base
        self.timeout_s = timeout_s
        self.admin_timeout_s = admin_timeout_s
        self.drain_timeout_s = drain_timeout_s
        self._paused = False
        self.max_retries = max_retries
        self.retry_backoff_s = retry_backoff_s
        if tags_supported is not None:
            self.sleep_state.tags_supported = tags_supported
        self._tags_supported = tags_supported
        self._vocab_size = vocab_size
        self._caps: Capabilities | None = None
        self._model_path: str | None = None
        # a mounted secret file often ends in a newline: a header value with it is illegal, and
        # httpx's error would then carry the key into a message
        key = (os.environ.get(api_key_env) or "").strip() if api_key_env else ""
        admin_key = (os.environ.get(admin_api_key_env) or "").strip() if admin_api_key_env else ""
        self._secrets = [k for k in (key, admin_key) if k]
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._admin_headers = (
            {"Authorization": f"Bearer {admin_key}"} if admin_key else dict(self._headers)
        )
        self._key_env = api_key_env
        self._admin_key_env = admin_api_key_env if admin_key else None
        self.key_sources = KeySources(api_key_env, bool(key), admin_api_key_env, bool(admin_key))
        """Which variables the keys came from and whether each was set (never the keys)."""
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
        socket read, and a server that drips its answer byte by byte would hold it forever."""
        with self._client.stream(
            method, path, json=json, headers=headers, timeout=httpx.Timeout(remaining)
        ) as streamed:
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

    def _scrub(self, text: str) -> str:
        """No key in a message: a server's error body or httpx's may quote it."""
        for secret in self._secrets:
            text = text.replace(secret, "<redacted>")
        return text

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
        returned, so nothing a server echoes (a key) can reach an output. No answer:
        :class:`TeacherUnreachable`, naming only the error's type."""
        try:
            resp = self._client.request(method, path, json=json, headers={}, timeout=self.timeout_s)
        except httpx.TransportError as e:
            raise TeacherUnreachable(
                f"{path}: no answer ({type(e).__name__})", endpoint=path
            ) from None
        return resp.status_code

    def scrub(self, text: str) -> str:
        """``text`` with the client's keys replaced by ``<redacted>``: for anything shown that a
        server's answer or an error may have quoted a key into."""
        return self._scrub(text)

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

    def _score(
        self,
        sequences: list[list[int]],
        top_k: int,
        logprob_start_len: int,
        temperature: float | None = None,
    ) -> ScoreResult:
        body = score_request(sequences, top_k, logprob_start_len, temperature)
        resp = self._request("POST", "/generate", json=body, idempotent=True)
        return parse_score_response(
            self._json(resp, "/generate"), sequences, top_k, logprob_start_len
        )

    def _memory_body(self, tags: tuple[str, ...]) -> dict[str, Any]:
        """The tags the version knows (``cuda_graph`` only from 0.5.5), or no body where the
        version takes none."""
        if not self.sleep_state.tags_supported:
            return {}
        known = [t for t in tags if t in self.capabilities.memory_tags]
        if not known:  # an empty list would mean every tag
            raise TeacherStateError(
                f"none of {list(tags)} is a memory tag on {self.capabilities.note} (it knows "
                f"{list(self.capabilities.memory_tags)}): nothing sent"
            )
        return {"tags": known}

    @property
    def capabilities(self) -> Capabilities:
        """What this server's SGLang version can do (read once from ``/get_server_info``)."""
        if self._caps is None:
            self.server_info()
        assert self._caps is not None
        return self._caps

    def _learn_tags(self) -> None:
        if self._tags_supported is None:
            self.sleep_state.tags_supported = self.capabilities.tags

    def drain(self) -> bool:
        """Hold new requests and make sure the release's idle check will pass, per version
        (``docs/sglang-contract.md`` §7.2), or raise :class:`ReleaseUnsafe` with the server left
        serving. A release with a request running kills SGLang (its assert, or the request's
        forward over released memory), and a pause that is safe on one version kills on another:

        - no ``/pause_generation`` (≤ 0.4.8): never released.
        - a ``retract`` pause, after which the release does not count what it put back in the
          waiting queue (0.5.6–0.5.9, 0.5.21+): released at once.
        - 0.4.9–0.5.5: the pause aborts what is in flight (as that version always does) and
          answers before its running requests' last forward, so the release waits until the
          scheduler is idle, seen twice in a row.
        - 0.5.10–0.5.20: the release counts the requests a ``retract`` pause puts back in the
          waiting queue, so the guard first lets the server go quiet (``/flush_cache?timeout=``),
          then pauses, and releases only if nothing runs or waits; else it lets the traffic run
          on and does not release this time.
        """
        caps = self.capabilities
        plan = plan_sleep(caps)
        if plan is SleepPlan.NEVER:
            raise ReleaseUnsafe(
                f"{caps.note} has no /pause_generation the guard can make safe, so nothing can "
                "hold its traffic while it is released, and a request that runs on released "
                "memory kills it: the guard does not release it (it stays awake; its memory is "
                "not freed). Upgrade SGLang to 0.4.9 or later, or let the framework release it "
                "between its own steps."
            )
        if plan is SleepPlan.ONLY_IF_IDLE and caps.flush_timeout:
            self._idle(wait_s=self.drain_timeout_s)  # let in-flight requests finish first
        body = {"mode": "retract"} if caps.pause is Pause.MODES else {}
        self._request("POST", "/pause_generation", json=body, admin=True)
        self._paused = True
        if plan is SleepPlan.AT_ONCE:
            return True
        try:
            idle = (
                self._idle_twice(time.monotonic() + self.drain_timeout_s)
                if plan is SleepPlan.AFTER_ABORT
                else self._idle(wait_s=0.0)
            )
        except TeacherError:  # the idle test failed: never leave its traffic held
            self.undrain()
            raise
        if not idle:
            self.undrain()
            raise ReleaseUnsafe(
                f"requests were still running or waiting after /pause_generation, and on "
                f"{caps.note} the release asserts {caps.release_check.value} (a failed assert "
                "kills the server): the guard did not release it this time and let its traffic "
                "run on (nothing lost). It tries again at the next sleep."
            )
        return True

    def _idle_twice(self, deadline: float) -> bool:
        """Idle at two checks 0.1 s apart before ``deadline``: the aborted requests' last forward
        is done, and none that had passed the pause's gate is still on its way."""
        seen = 0
        while seen < 2:
            seen = seen + 1 if self._idle(wait_s=0.0) else 0
            if seen < 2:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.1)
        return True

    def _idle(self, *, wait_s: float) -> bool:
        """Whether nothing runs or waits: ``/flush_cache`` is refused (400) unless the server is
        idle, and dropping the caches is all it does (``docs/sglang-contract.md`` §7.2).
        ``wait_s`` > 0 waits for idle where the version takes ``?timeout=``."""
        path = "/flush_cache"
        if self.capabilities.flush_timeout:
            path += f"?timeout={wait_s:g}"
        try:
            self._request("POST", path, admin=True, timeout_s=wait_s + self.timeout_s)
        except TeacherHTTPError as e:
            if e.status == 400:
                return False
            raise
        return True

    def undrain(self) -> None:
        """``/continue_generation``: the requests the pause held run again (a no-op when
        nothing is paused, on every version that has it)."""
        if self.capabilities.pause is Pause.NONE:
            return
        self._request("POST", "/continue_generation", json={}, admin=True)
        self._paused = False

    def _release(self, tags: tuple[str, ...]) -> None:
        self._request(
            "POST", "/release_memory_occupation", json=self._memory_body(tags), admin=True
        )

    def _resume(self, tags: tuple[str, ...]) -> None:
        self._request("POST", "/resume_memory_occupation", json=self._memory_body(tags), admin=True)

    def reload_weights(self, model_path: str | None = None) -> None:
        """``/update_weights_from_disk`` in place, from ``model_path``, default the path the server
        serves now (``/model_info``: after an update from another path, ``/server_info`` still
        names the launch path). The built-in flush is turned off where the version takes
        ``flush_cache`` (0.5.6+): under traffic it is refused and then reports failure although
        the weights are in, and a blind retry would load them again. The caller flushes
        (:meth:`flush_cache`), as the repair does, retrying only the flush."""
        self.sleep_state.check_awake("reload the weights")
        served = self.model_info() if model_path is None else {}
        path = model_path or served.get("model_path") or self.model_path
        if not path:
            raise TeacherError("reload_weights: the server reports no model_path; pass one")
        body: dict[str, Any] = {"model_path": path}
        fields = self.capabilities.reload_fields
        if "flush_cache" in fields:
            body["flush_cache"] = False
        if "weight_version" in fields and served.get("weight_version"):
            body["weight_version"] = served["weight_version"]
        resp = self._request("POST", "/update_weights_from_disk", json=body, admin=True)
        self._json(resp, "/update_weights_from_disk")

    @property
    def reload_flushes(self) -> bool:
        """The reload flushes the cache itself: the version takes no ``flush_cache`` field
        (before 0.5.6), and its flush is asserted, so a reload that answered did flush."""
        return "flush_cache" not in self.capabilities.reload_fields

    def flush_cache(self, timeout_s: float | None = None) -> None:
        """Drop the prefix cache. While the guard's pause holds the traffic, at once (the
        scheduler then has nothing running, and nothing waiting the flush counts). Otherwise it
        waits up to ``timeout_s`` (default the client's ``timeout_s``) for the running requests:
        ``?timeout=S`` where the version takes it (0.5.10+), else asked again until idle (before,
        a busy server answers 400 at once). Still busy at the end: :class:`TeacherHTTPError`."""
        self.sleep_state.check_awake("flush the cache")
        wait = 0.0 if self._paused else self.timeout_s if timeout_s is None else timeout_s
        if self.capabilities.flush_timeout:
            path = f"/flush_cache?timeout={wait:g}"
            self._request("POST", path, admin=True, timeout_s=wait + self.timeout_s)
            return
        deadline = time.monotonic() + wait
        while True:
            try:
                self._request("POST", "/flush_cache", admin=True)
                return
            except TeacherHTTPError as e:
                if e.status != 400 or time.monotonic() >= deadline:
                    raise
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))

    def model_info(self) -> dict[str, Any]:
        """``/model_info`` (``/get_model_info`` before 0.5.6): what the server serves now."""
        path = "/model_info" if self.capabilities.server_info else "/get_model_info"
        info = self._json(self._request("GET", path, idempotent=True), path)
        return info if isinstance(info, dict) else {}

    def checksum(self) -> str | None:
        """``/weights_checker {"action": "checksum"}``: an exact, forward-free hash of the
        weights (SGLang 0.5.12+); None where the version has none. It reads the weights, so it is
        never sent to a teacher that may be released. 0.5.13+ answer ``per_engine_checksum``, a
        string; 0.5.12 only per-tensor hashes, which are combined here in name order."""
        if not self.capabilities.checksum:
            return None
        self.sleep_state.check_awake("read the weights checksum")
        resp = self._request("POST", "/weights_checker", json={"action": "checksum"}, admin=True)
        body = self._json(resp, "/weights_checker")
        return checksum_of(body)

    def server_info(self) -> dict[str, Any]:
        """``/get_server_info`` (every SGLang version serves it), key-like values redacted."""
        path = "/get_server_info"
        info = self._json(self._request("GET", path, idempotent=True), path)
        if not isinstance(info, dict):
            raise TeacherHTTPError(path, None, f"expected an object, got {type(info).__name__}")
        if self._caps is None:
            self._caps = capabilities_for(info.get("version"))
            if not self._caps.known:
                log.warning("%s: %s", self.url, self._caps.note)
        self._model_path = info.get("model_path") or self._model_path
        return redact(info)

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
        """``/health``: True on 200. Says the server answers, not that its weights are sane. It
        runs a real generation, so it is never sent to a teacher that is asleep."""
        try:
            self.sleep_state.check_awake("send /health (it generates)")
        except TeacherStateError as e:
            raise TeacherStateError(f"refusing /health while the teacher is asleep: {e}") from e
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
