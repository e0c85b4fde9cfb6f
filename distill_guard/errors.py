"""One base for every exception distill_guard raises on purpose: ``except GuardError`` catches
them all, and each also keeps the built-in type callers already catch (``ValueError`` for bad
input, ``TypeError`` for a wrong argument, ``RuntimeError`` for a state the call cannot run in).

The guard itself never raises into a healthy run (a fault of its own becomes a finding); these
are what a caller gets for a call it made wrongly, or for a teacher, file or server that refused.
"""

from __future__ import annotations

__all__ = [
    "GuardError",
    "GuardRuntimeError",
    "GuardStateError",
    "GuardTypeError",
    "GuardValueError",
]


class GuardError(Exception):
    """Base of every exception the package raises on purpose. Its message is redacted of every
    secret the guard knows (:mod:`distill_guard.redaction`): a server that echoes a key in an
    error does not put the key in a traceback."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        from distill_guard import redaction  # here: redaction imports nothing of the package

        if redaction.known():
            args = tuple(redaction.redact(a) if isinstance(a, str) else a for a in args)
        super().__init__(*args, **kwargs)  # ModuleNotFoundError's name= and the like


class GuardValueError(GuardError, ValueError):
    """A value the call cannot use (a threshold out of range, a malformed file or command line);
    the message names the value and what was expected."""


class GuardTypeError(GuardError, TypeError):
    """An argument of the wrong kind, or a keyword the call does not take."""


class GuardRuntimeError(GuardError, RuntimeError):
    """A state the call cannot run in (a server that did not start, a run that must stop)."""


class GuardStateError(GuardValueError):
    """A saved guard state :meth:`~distill_guard.guard.DistillGuard.load_state_dict` refused: not
    a mapping, a key or ``run`` field this version does not know (a state from another version),
    or a value of the wrong kind (a corrupted checkpoint). The message names the key path (``guard
    state: summary.halt: missing 'stage'``) and what to do; the guard is left exactly as it was,
    since every part is validated before any is taken."""
