"""A teacher behind SGLang's native HTTP API (``/generate``, ``/release_memory_occupation``, ...).

Its HTTP side (keys, retries, deadlines, errors) is :mod:`.sglang_transport`, a base of the
client; the per-version traffic control (drain, undrain, flush, checksum) is
:mod:`.sglang_traffic`. Their public names are importable from here as before.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx

from distill_guard.teachers._sglang_wire import (
    SGLangScoring,
    score_request,
)
from distill_guard.teachers.base import (
    TeacherError,
    TeacherHTTPError,
    TeacherStateError,
    read_vocab_size,
    redact,
)
from distill_guard.teachers.capabilities import Capabilities, capabilities_for
from distill_guard.teachers.sglang_traffic import SGLangTraffic, checksum_of
from distill_guard.teachers.sglang_transport import (
    RETRY_STATUSES,
    KeySources,
    SGLangTransport,
    answer_json,
    error_message,
)

__all__ = [
    "RETRY_STATUSES",
    "KeySources",
    "SGLangHTTPTeacher",
    "checksum_of",
    "error_message",
]

log = logging.getLogger("distill_guard")


class SGLangHTTPTeacher(SGLangTraffic, SGLangScoring, SGLangTransport):
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
        traffic_token_ids: bool = False,
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
            traffic_token_ids: the server's other requests carry ``token_ids_logprob``; on
                SGLang 0.5.10–0.5.15 this client's requests then carry it too, and where False
                they never do (a batch mixing the two kills those versions).
        """
        SGLangScoring.__init__(self)
        SGLangTransport.__init__(
            self,
            url,
            api_key_env=api_key_env,
            admin_api_key_env=admin_api_key_env,
            timeout_s=timeout_s,
            admin_timeout_s=admin_timeout_s,
            max_retries=max_retries,
            retry_backoff_s=retry_backoff_s,
            transport=transport,
        )
        self.drain_timeout_s = drain_timeout_s
        self.traffic_token_ids = traffic_token_ids
        self._paused = False
        if tags_supported is not None:
            self.sleep_state.tags_supported = tags_supported
        self._tags_supported = tags_supported
        self._vocab_size = vocab_size
        self._caps: Capabilities | None = None
        self._model_path: str | None = None

    # -- the Teacher protocol --------------------------------------------------------------

    def _prefill(
        self,
        sequences: list[list[int]],
        top_k: int,
        logprob_start_len: int,
        temperature: float | None,
        token_ids: list[list[int]] | None,
    ) -> Any:
        """One prefill-only ``POST /generate``."""
        body = score_request(sequences, top_k, logprob_start_len, temperature, token_ids)
        resp = self._request("POST", "/generate", json=body, idempotent=True)
        return answer_json(resp, "/generate")

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
        answer_json(resp, "/update_weights_from_disk")

    def model_info(self) -> dict[str, Any]:
        """``/model_info`` (``/get_model_info`` before 0.5.6): what the server serves now."""
        path = "/model_info" if self.capabilities.server_info else "/get_model_info"
        info = answer_json(self._request("GET", path, idempotent=True), path)
        return info if isinstance(info, dict) else {}

    def server_info(self) -> dict[str, Any]:
        """``/get_server_info`` (every SGLang version serves it), key-like values redacted."""
        path = "/get_server_info"
        info = answer_json(self._request("GET", path, idempotent=True), path)
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
        self.sleep_state.check_awake("send /health (it runs a real generation)")
        try:
            return self._request("GET", "/health", idempotent=True).status_code == 200
        except TeacherError:
            return False
