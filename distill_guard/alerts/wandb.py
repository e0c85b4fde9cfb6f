"""The wandb sink: ``Run.alert`` on the active run.

What a run does with an alert depends on its mode. An online run sends it to wandb's server
(which emails or posts it to Slack, as the user's wandb settings say). An offline run notifies no
one: it accepts the alert and writes it into its own ``run-<id>.wandb`` file, where it stays until
the run is synced. A disabled run accepts it and drops it. A finished run refuses it
(``alert_failed`` in the event file).
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any


class WandbSink:
    """Sends to ``run``, else to ``wandb.run`` at alert time; nothing while no run is active."""

    name = "wandb"

    def __init__(self, run: Any = None, *, wait_duration: float = 600.0) -> None:
        self.run = run
        self.wait_duration = wait_duration
        """wandb's own per-title throttle on its server, the alerter's window."""

    @staticmethod
    def available() -> bool:
        """wandb is installed (it is an optional dependency)."""
        return importlib.util.find_spec("wandb") is not None

    def send(self, title: str, text: str, level: str, failed: Any) -> bool:
        run = self.run if self.run is not None else _active_run()
        if run is None:
            return False
        run.alert(title=title, text=text, level=_level(level), wait_duration=self.wait_duration)
        return True

    def describe(self) -> dict[str, Any]:
        run = self.run if self.run is not None else _active_run()
        mode = None
        if run is not None:
            mode = "disabled" if getattr(run, "disabled", False) else _mode(run)
        return {"sink": self.name, "run": mode}

    def close(self, timeout_s: float) -> None:
        """wandb delivers on its own; the run's ``finish`` flushes it."""


def _active_run() -> Any:
    # A run can be active only in a process that imported wandb: never import it here (slow).
    wandb = sys.modules.get("wandb")
    return getattr(wandb, "run", None) if wandb is not None else None


def _mode(run: Any) -> str | None:
    settings = getattr(run, "settings", None)
    mode = getattr(settings, "mode", None)
    return str(mode) if mode is not None else "active"


def _level(level: str) -> Any:
    wandb = sys.modules.get("wandb")
    alert_level = getattr(wandb, "AlertLevel", None) if wandb is not None else None
    return getattr(alert_level, level) if alert_level is not None else level
