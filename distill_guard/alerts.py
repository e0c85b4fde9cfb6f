"""Alerts to people: the Python logger always, wandb on rank 0, throttled per title, never fatal."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from distill_guard.findings import Code

if TYPE_CHECKING:
    from distill_guard.policy import Decision

log = logging.getLogger("distill_guard")

LEVELS = ("INFO", "WARN", "ERROR")
MAX_TITLE = 63
"""wandb asks for titles under 64 characters; its server throttles by title."""


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
    """Sends alerts to the logger and, on rank 0, to a wandb run.

    ``run`` may be a wandb ``Run`` or None (then ``wandb.run`` is used if a run is active).
    A disabled or offline run delivers nothing, which is why every alert is also logged and
    written to the event file by the guard. Any exception from wandb is caught and reported
    through ``on_error``; it never reaches the trainer.
    """

    rank: int = 0
    """This process's rank; only rank 0 talks to wandb."""
    use_wandb: bool = True
    """Send alerts to wandb when a run is active."""
    min_interval_s: float = 600.0
    """Per-title throttle, also passed to wandb as ``wait_duration``."""
    log_alerts: bool = True
    """Mirror every alert to the ``distill_guard`` logger (off only where output is a report)."""
    run: Any = None
    """A wandb Run; None means ``wandb.run`` at alert time."""
    on_error: Callable[[str, Exception], None] | None = None
    """Called with (title, exception) when wandb refuses an alert."""
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)

    def __post_init__(self) -> None:
        self._last_sent: dict[str, float] = {}
        self._last_logged: dict[str, float] = {}
        self._repeats: dict[str, int] = {}

    def alert(self, title: str, text: str, level: str = "WARN") -> bool:
        """Log the alert; send it to wandb unless throttled. True if wandb accepted it."""
        if level not in LEVELS:
            raise ValueError(f"alert level must be one of {LEVELS}, got {level!r}")
        title = title[:MAX_TITLE]
        log_level = {"INFO": logging.INFO, "WARN": logging.WARNING, "ERROR": logging.ERROR}[level]
        if self.log_alerts:
            self._log(log_level, title, text)
        if self.rank != 0 or not self.use_wandb:
            return False
        now = self.clock()
        last = self._last_sent.get(title)
        if last is not None and now - last < self.min_interval_s:
            return False
        run = self.run if self.run is not None else _active_wandb_run()
        if run is None:
            return False
        self._last_sent[title] = now
        try:
            run.alert(
                title=title, text=text, level=_wandb_level(level), wait_duration=self.min_interval_s
            )
        except Exception as exc:  # noqa: BLE001 - an alert must never kill training
            if self.on_error is not None:
                self.on_error(title, exc)
            log.warning("distill_guard: wandb alert %r failed: %s", title, exc)
            return False
        return True

    def _log(self, level: int, title: str, text: str) -> None:
        """Every alert reaches the log; a repeat of a title inside the throttle window is one
        line, so a fault that recurs at every step does not bury the first full message."""
        now = self.clock()
        last = self._last_logged.get(title)
        if last is not None and now - last < self.min_interval_s:
            self._repeats[title] = self._repeats.get(title, 0) + 1
            log.log(level, "%s (repeat %d): %s", title, self._repeats[title], text.splitlines()[0])
            return
        self._last_logged[title] = now
        self._repeats[title] = 0
        log.log(level, "%s: %s", title, text)


def _active_wandb_run() -> Any:
    try:
        import wandb
    except ImportError:
        return None
    return wandb.run


def _wandb_level(level: str) -> Any:
    try:
        from wandb import AlertLevel
    except ImportError:
        return level
    return getattr(AlertLevel, level)
