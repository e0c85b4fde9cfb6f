"""The webhook sink: Slack-style incoming webhooks (Slack, Mattermost, any receiver that reads
JSON).

Alerts are POSTed from one background thread through a bounded queue, so the training step never
waits on the receiver: a receiver that is down or hangs costs the hook a ``put`` on a queue, and
the thread gives each request ``timeout_s`` in total (connect, send and every read of the answer:
a receiver that drips its answer a byte at a time is cut at the deadline too). ``close`` (also run
at interpreter exit) delivers what is queued within its own deadline: the halt alert of a run
that stops at once still goes out, and a hanging receiver holds the exit no longer than that.
The URL comes from the environment (it holds the secret); only its host is ever written down.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import os
import queue
import threading
import time
from typing import Any
from urllib.parse import urlsplit

from distill_guard import redaction
from distill_guard.errors import GuardError, GuardValueError

log = logging.getLogger("distill_guard")

WEBHOOK_ENV = "DISTILL_GUARD_WEBHOOK_URL"
"""The environment variable the presets read the webhook URL from."""
QUEUE_SIZE = 32
"""Alerts waiting for the receiver; past that a new one is dropped (and reported)."""
_ICON = {"INFO": ":information_source:", "WARN": ":warning:", "ERROR": ":rotating_light:"}
_SECTION_MAX = 2900
"""Slack refuses a section text over 3000 characters."""
_ANSWER_MAX = 1024
"""Bytes of an answer read (an error's message is its first 200 characters); no more is read."""


THREAD = "distill_guard-webhook"


class _NotOurRequests(logging.Filter):
    """httpx logs every request at INFO with its whole URL, the webhook's secret: drop the
    records of the sender thread, and only those."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.threadName != THREAD


_QUIET = _NotOurRequests()


class WebhookError(GuardError, RuntimeError):
    """The webhook sink could not take an alert (its queue is full)."""


def webhook_from_env(env: str | None, *, timeout_s: float = 5.0) -> WebhookSink | None:
    """The sink for the URL in ``$env``; None when ``env`` is None or the variable is unset or
    empty (no webhook is a normal setup: no warning)."""
    if not env:
        return None
    url = os.environ.get(env, "").strip()
    return WebhookSink(url, env=env, timeout_s=timeout_s) if url else None


def slack_payload(title: str, text: str, level: str) -> dict[str, Any]:
    """Slack's message format. ``text`` is plain (``[LEVEL] title`` then the body): what Slack
    shows in notifications and what a generic receiver reads; ``blocks`` is the Slack view."""
    return {
        "text": f"[{level}] {title}\n{text}",
        "blocks": [
            {"type": "header", "text": {"type": "plain_text", "text": title}},
            {"type": "section", "text": {"type": "mrkdwn", "text": _mrkdwn(text)[:_SECTION_MAX]}},
            {
                "type": "context",
                "elements": [{"type": "mrkdwn", "text": f"{_ICON[level]} {level} · distill_guard"}],
            },
        ],
    }


class WebhookSink:
    """POSTs :func:`slack_payload` to ``url`` from a background thread (started at the first
    alert, so ranks that never alert never start it)."""

    name = "webhook"

    def __init__(
        self,
        url: str,
        *,
        env: str | None = None,
        timeout_s: float = 5.0,
        queue_size: int = QUEUE_SIZE,
    ) -> None:
        where = f"${env}" if env else "the webhook URL"
        try:
            parsed = urlsplit(url)
            host = parsed.hostname
        except ValueError:
            parsed, host = None, None
        if parsed is None or parsed.scheme not in ("http", "https") or not host:
            raise GuardValueError(
                f"{where} is not an http(s) URL; set it to the receiver's incoming-webhook URL "
                "(https://hooks.slack.com/services/...) or unset it"
            )
        if timeout_s <= 0:
            raise GuardValueError(f"webhook timeout_s must be > 0, got {timeout_s}")
        self.url = url
        self.env = env
        self.host = host
        redaction.register_url(url, whole=True)  # the URL is the secret: its key-like parts too
        self.timeout_s = timeout_s
        self._queue: queue.Queue[tuple[dict[str, Any], Any] | None] = queue.Queue(queue_size)
        self._thread: threading.Thread | None = None
        self._closing = [math.inf]
        """The sender's stop time (set by ``close``): past it nothing more is sent or reported."""
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        """A copy sent to another process (Lightning's ``ddp_spawn`` pickles its callbacks)
        starts its own thread at its first alert; the queue, lock and thread stay here."""
        local = ("_queue", "_thread", "_lock", "_closing")
        state = {k: v for k, v in self.__dict__.items() if k not in local}
        return state | {"_queue_size": self._queue.maxsize}

    def __setstate__(self, state: dict[str, Any]) -> None:
        size = state.pop("_queue_size")
        self.__dict__.update(
            state,
            _queue=queue.Queue(size),
            _thread=None,
            _lock=threading.Lock(),
            _closing=[math.inf],
        )

    def send(self, title: str, text: str, level: str, failed: Any) -> bool:
        self._start()
        try:
            self._queue.put_nowait((slack_payload(title, text, level), failed))
        except queue.Full:
            raise WebhookError(
                f"{self._queue.maxsize} alerts already wait for {self.host} (slow or hanging "
                "receiver); this one is dropped"
            ) from None
        return True

    def describe(self) -> dict[str, Any]:
        return {"sink": self.name, "env": self.env, "host": self.host}

    def close(self, timeout_s: float = 10.0) -> None:
        """Deliver what is queued within ``timeout_s``; a receiver slower than that loses the
        rest (named in one log line), the run does not wait longer. The sender sends nothing
        after this deadline; a request in flight then ends by its own (the thread is a daemon)."""
        with self._lock:
            thread, self._thread = self._thread, None
            closing = self._closing
        if thread is None:
            return
        atexit.unregister(self.close)
        deadline = time.monotonic() + timeout_s
        closing[0] = deadline
        with contextlib.suppress(queue.Full):  # then the join below runs out the deadline
            self._queue.put(None, timeout=timeout_s)
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            log.warning(
                "distill_guard: webhook alerts to %s not all delivered within %.1f s at close "
                "(receiver slow or hanging); they are in the event file",
                self.host,
                timeout_s,
            )

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._queue = queue.Queue(self._queue.maxsize)
            self._closing = [math.inf]
            self._thread = threading.Thread(
                target=self._deliver, args=(self._queue, self._closing), name=THREAD, daemon=True
            )
            self._thread.start()
        atexit.register(self.close)

    def _deliver(
        self, jobs: queue.Queue[tuple[dict[str, Any], Any] | None], closing: list[float]
    ) -> None:
        import httpx  # here, not at import: the package needs only torch until a webhook is used

        from distill_guard.http_deadline import bound

        logging.getLogger("httpx").addFilter(_QUIET)  # idempotent
        with bound(httpx.Client(timeout=self.timeout_s, follow_redirects=False)) as client:
            while (job := jobs.get()) is not None:
                payload, failed = job
                left = closing[0] - time.monotonic()
                if left <= 0:
                    return  # past close's deadline: its log line names what was not sent
                error = self._post(client, payload, min(self.timeout_s, left))
                if error is not None and time.monotonic() < closing[0]:
                    try:
                        failed(error)
                    except Exception:  # noqa: BLE001 - the reporter must not end the thread
                        log.exception("distill_guard: reporting a webhook failure failed")

    def _post(self, client: Any, payload: dict[str, Any], limit: float) -> str | None:
        """None when the receiver took the alert, else what went wrong (never the URL). The
        request ends within ``limit`` seconds in total: the client is
        :func:`~distill_guard.http_deadline.bound`, so connect, send and every read (headers
        too) get only the time left. The answer is read to its end (its first kilobyte at most:
        the rest is not needed) before the deadline, or it counts as none."""
        import httpx

        from distill_guard.http_deadline import deadline_at

        deadline = time.monotonic() + limit
        try:
            with (
                deadline_at(deadline),
                client.stream("POST", self.url, json=payload, timeout=limit) as response,
            ):
                text = _head(response, deadline)
        except httpx.TimeoutException:
            return f"{self.host} did not answer within {self.timeout_s:g} s"
        except Exception as exc:  # noqa: BLE001 - a broken channel is a report, not a crash
            return f"{type(exc).__name__}: {redaction.redact(str(exc))}"
        if response.is_success:
            return None
        return f"{self.host} answered HTTP {response.status_code}: {redaction.redact(text[:200])}"


def _head(response: Any, deadline: float) -> str:
    """The answer's body (its first :data:`_ANSWER_MAX` bytes), read before ``deadline``."""
    import httpx

    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size >= _ANSWER_MAX:
            break
        if time.monotonic() > deadline:
            raise httpx.ReadTimeout("answer not complete within the deadline")
    return b"".join(chunks)[:_ANSWER_MAX].decode(response.encoding or "utf-8", "replace")


def _mrkdwn(text: str) -> str:
    """Slack's escaping: ``&``, ``<`` and ``>`` would otherwise be read as markup."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
