"""What every ``distill-guard`` command shares: the exit codes, :class:`UsageError`, and the
argparse pieces (a parser that never echoes a key, the global flags, a subcommand with --json),
and the redacted output every command prints through."""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

from distill_guard import redaction
from distill_guard.errors import GuardError

EXIT_OK, EXIT_FOUND, EXIT_USAGE = 0, 1, 2
EXIT_PIPE = 141
"""The reader of our stdout went away (``... | head``): 128 + SIGPIPE, as a shell reports it."""


class UsageError(GuardError):
    """Bad input, an unreachable teacher, a missing extra: reported in one line, exit 2."""


SECRET_OPTION = re.compile(r"(--[\w-]*(?:key|token|secret|password)[\w-]*)(=|\s+)(?!-)(\S+)")


class CommandFailed(GuardError):
    """The command could not run (its teacher did not answer, refused it): one line, exit 2."""


class _Parser(argparse.ArgumentParser):
    """argparse that never echoes a key: an unknown ``--api-key VALUE`` would otherwise be
    printed back whole (and no option of ours takes a key value: keys come from the
    environment, named with ``--api-key-env``)."""

    def error(self, message: str) -> NoReturn:
        scrubbed = SECRET_OPTION.sub(r"\1\2<redacted>", message)
        if scrubbed != message:
            scrubbed += (
                "; no option takes a key: put it in an environment variable and name that "
                "variable with --api-key-env"
            )
        super().error(scrubbed)


def _global_flags() -> argparse.ArgumentParser:
    """The top-level flags, accepted after the subcommand too (``replay x.jsonl -v``). SUPPRESS:
    a subcommand that does not see the flag leaves the top-level value alone."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=argparse.SUPPRESS,
        help="log the guard's own messages (INFO and above) to stderr",
    )
    return p


def _key_value(text: str) -> tuple[str, str]:
    role, sep, name = text.partition("=")
    if not sep or not role or not name:
        raise argparse.ArgumentTypeError(f"expected ROLE=NAME, got {text!r}")
    return role, name


def examples(*lines: str) -> str:
    """A subcommand's usage examples, as the epilog of its ``--help``."""
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


class _HelpFormatter(argparse.HelpFormatter):
    """Wraps the description like argparse does, keeps the examples' lines as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith("examples:\n"):
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def _command(
    sub: argparse._SubParsersAction,
    name: str,
    func: Callable[..., int],
    summary: str,
    epilog: str | None = None,
) -> argparse.ArgumentParser:
    """A subcommand that runs ``func(args) -> exit code``, described by ``func``'s docstring,
    with its usage examples (``epilog``, from :func:`examples`), and can print JSON."""
    description = " ".join((func.__doc__ or summary).split())
    p = sub.add_parser(
        name,
        help=summary,
        description=description,
        epilog=epilog,
        formatter_class=_HelpFormatter,
        allow_abbrev=False,
        parents=[_global_flags()],
    )
    p.add_argument("--json", action="store_true", help="print one JSON object, not a table")
    p.set_defaults(func=func)
    return p


def _guard_config_args(p: argparse.ArgumentParser, set_example: str) -> None:
    """``--preset`` and the repeatable ``--set KEY=VALUE`` (a Hydra override on the guard config)."""
    from distill_guard.presets import PRESETS

    p.add_argument(
        "--preset",
        default="default",
        help=f"guard preset: {', '.join(PRESETS)} (default: default)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"Hydra override on the guard config, {set_example}; repeatable",
    )


class RedactedStream:
    """A text stream that writes through :func:`distill_guard.redaction.redact`: everything a
    command prints goes out without the secrets the guard knows (a key a server echoed into a
    finding, a URL's userinfo)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(redaction.redact(text))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def redacted_output() -> Iterator[None]:
    """``sys.stdout`` and ``sys.stderr`` redacted for the block."""
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = RedactedStream(out), RedactedStream(err)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err
