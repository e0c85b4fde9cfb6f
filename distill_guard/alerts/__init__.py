"""Alerts to people: the Python logger always, then the sinks (wandb, a webhook) on rank 0,
throttled per title, never fatal.

A :class:`Sink` is one channel (``alerts/wandb.py``, ``alerts/webhook.py``). One throttle serves
every sink: the throttle is about a person's attention to one incident, so Slack and wandb see the
same alert at the same cadence, and a sink that fails is not retried at every step either.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from distill_guard.alerts.wandb import WandbSink
from distill_guard.alerts.webhook import WEBHOOK_ENV, WebhookSink, webhook_from_env
from distill_guard.errors import GuardValueError
from distill_guard.findings import Code
from distill_guard.redaction import redact

if TYPE_CHECKING:
    from distill_guard.policy import Decision

log = logging.getLogger("distill_guard")

LEVELS = ("INFO", "WARN", "ERROR")
MAX_TITLE = 63
"""wandb asks for titles under 64 characters; its server throttles by title."""

Failed = Callable[[str], None]
"""How a sink reports that an alert was not delivered: called once, with what went wrong."""


class Sink(Protocol):
    """One channel to people. ``send`` must return quickly and may raise; a sink that delivers
    later (the webhook) reports a failure through ``failed`` instead."""

    name: str

    def send(self, title: str, text: str, level: str, failed: Failed) -> bool:
        """Deliver (or queue) one alert; False when the sink has nowhere to send it now (no
        active wandb run). Raises when it refuses the alert."""
        ...

    def describe(self) -> dict[str, Any]:
        """What the attach record says of this sink: never a secret."""
        ...

    def close(self, timeout_s: float) -> None:
        """Deliver what is pending within ``timeout_s``, then let go."""
        ...


def alert_title(code: str, action: str | None = None) -> str:
    """A stable, short title: the same fault always maps to the same title, so throttling works."""
    title = f"distill_guard {action}: {code}" if action else f"distill_guard: {code}"
    return title[:MAX_TITLE]


def decision_alert(decision: Decision) -> tuple[str, str, str]:
    """Title, body and level of the alert for a decision: the title names the cause (not the
    repair notice that may ride along) and what was done; ERROR when the run changed course or
    would have."""
    causes = {f.code for f in decision.reasons if f.code != Code.TEACHER_REPAIRED}
    codes = sorted(causes or {f.code for f in decision.reasons}) or ["unknown"]
    level = "ERROR" if decision.acts or decision.intended is not None else "WARN"
    title = alert_title(codes[0], decision.action.value if decision.acts else None)
    lines = [f"step {decision.step}: {decision.message}"]
    lines += [f.message for f in decision.reasons[:1]]
    lines += [f.message for f in decision.reasons[1:] if f.code == Code.TEACHER_REPAIRED]
    return title, "\n".join(lines), level


@dataclass
class Alerter:
    """Logs every alert and, on rank 0, hands it to the sinks.

    Without ``sinks`` the alerter builds its own: wandb (when ``use_wandb`` and a ``run`` is
    given or wandb is installed; it sends only while a run is active, ``run`` or else
    ``wandb.run``) and a webhook when ``webhook_env`` names an environment variable that is set.
    An exception from a sink is caught and reported through ``on_error``; it never reaches the
    trainer.

    The logger gets each title's full message once; repeats inside ``min_interval_s`` are
    counted, the first one after the window is one short line with the count, and :meth:`close`
    logs the counts still pending. The guard's event file keeps every alert.
    """

    rank: int = 0
    """This process's rank; only rank 0 talks to the sinks."""
    use_wandb: bool = True
    """Send alerts to wandb when a run is active."""
    min_interval_s: float = 600.0
    """Per-title throttle of the sinks and the logger, also wandb's ``wait_duration``."""
    log_alerts: bool = True
    """Mirror alerts to the ``distill_guard`` logger (off only where output is a report)."""
    run: Any = None
    """A wandb Run; None means ``wandb.run`` at alert time."""
    webhook_env: str | None = None
    """Environment variable with a Slack-style incoming-webhook URL; None or unset: no webhook."""
    webhook_timeout_s: float = 5.0
    """Total bound of one webhook request (connect, send and every read of the answer)."""
    sinks: list[Sink] | None = None
    """The channels; None builds them from the fields above."""
    on_error: Callable[[str, str, str], None] | None = None
    """Called with (sink, title, error) when a sink did not deliver an alert."""
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)

    def __post_init__(self) -> None:
        if self.sinks is None:
            self.sinks = []
            # a run handed in is the user's own: it takes the alerts whether or not wandb imports
            if self.use_wandb and (self.run is not None or WandbSink.available()):
                self.sinks.append(WandbSink(self.run, wait_duration=self.min_interval_s))
            webhook = webhook_from_env(self.webhook_env, timeout_s=self.webhook_timeout_s)
            if webhook is not None:
                self.sinks.append(webhook)
        self._last_sent: dict[str, float] = {}
        self._last_logged: dict[str, float] = {}
        self._unlogged: dict[str, int] = {}

    def alert(self, title: str, text: str, level: str = "WARN") -> bool:
        """Log the alert; hand it to the sinks unless throttled. True if a sink took it."""
        if level not in LEVELS:
            raise GuardValueError(f"alert level must be one of {LEVELS}, got {level!r}")
        title, text = redact(title)[:MAX_TITLE], redact(text)  # before any sink sees them
        if self.log_alerts:
            self._log(_LOG_LEVEL[level], title, text)
        if self.rank != 0 or not self.sinks:
            return False
        now = self.clock()
        last = self._last_sent.get(title)
        if last is not None and now - last < self.min_interval_s:
            return False
        taken = tried = False
        for sink in self.sinks:
            failed = self._reporter(sink.name, title)
            try:
                ok = sink.send(title, text, level, failed)
            except Exception as exc:  # noqa: BLE001 - an alert must never kill training
                failed(f"{type(exc).__name__}: {exc}")
                tried = True
                continue
            taken, tried = taken or ok, tried or ok
        if tried:
            self._last_sent[title] = now
        return taken

    def describe(self) -> list[dict[str, Any]]:
        """The sinks, for the attach record (no secrets)."""
        return [sink.describe() for sink in self.sinks or []]

    def close(self, timeout_s: float = 10.0) -> None:
        """Deliver what the sinks still hold (each within ``timeout_s``: a receiver that answers
        or times out frees it sooner) and log the counts of repeats that got no line of their
        own."""
        for sink in self.sinks or []:
            try:
                sink.close(timeout_s)
            except Exception as exc:  # noqa: BLE001
                log.warning("distill_guard: closing the %s alert sink failed: %s", sink.name, exc)
        for title, n in self._unlogged.items():
            if n and self.log_alerts:
                log.info(
                    "%s: repeated %d more time(s) after its last log line; every one is in the "
                    "event file",
                    title,
                    n,
                )
        self._unlogged.clear()

    def _reporter(self, sink: str, title: str) -> Failed:
        def failed(error: str) -> None:
            error = redact(error)
            log.warning("distill_guard: %s alert %r not delivered: %s", sink, title, error)
            if self.on_error is not None:
                self.on_error(sink, title, error)

        return failed

    def _log(self, level: int, title: str, text: str) -> None:
        """A fault that recurs at every step neither buries its first full message nor floods
        the log: repeats inside the window are counted, the first one after it is a single line
        with the count; a title back after a quiet window is logged in full again."""
        now = self.clock()
        last = self._last_logged.get(title)
        if last is not None and now - last < self.min_interval_s:
            self._unlogged[title] = self._unlogged.get(title, 0) + 1
            return
        self._last_logged[title] = now
        repeats = self._unlogged.pop(title, 0)
        if not repeats:
            log.log(level, "%s: %s", title, text)
        else:
            log.log(
                level,
                "%s (again; %d repeat(s) since the last line, all in the event file): %s",
                title,
                repeats,
                text.splitlines()[0],
            )


_LOG_LEVEL = {"INFO": logging.INFO, "WARN": logging.WARNING, "ERROR": logging.ERROR}

__all__ = [
    "LEVELS",
    "MAX_TITLE",
    "WEBHOOK_ENV",
    "Alerter",
    "Sink",
    "WandbSink",
    "WebhookSink",
    "alert_title",
    "decision_alert",
    "webhook_from_env",
]
