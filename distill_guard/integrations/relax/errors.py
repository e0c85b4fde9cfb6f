"""The two ways the Relax integration stops a run on purpose."""

from __future__ import annotations

from distill_guard.errors import GuardError


class GuardSetupError(GuardError, RuntimeError):
    """The guard cannot protect this run as launched (a gate Relax did not load, a path the
    gates cannot see, a verdict channel that cannot be had): refuse it, with the reason."""


class GuardHalt(GuardError, RuntimeError):
    """The guard stopped the run; the message says why (the event file has the details)."""
