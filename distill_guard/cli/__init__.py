"""``distill-guard``: replay a run's metric history; probe, preflight or serve a teacher; make
the teacher's reference file.

One exit-code scheme for every command: 0 healthy; 1 the guard found a problem (warn or above,
a lost teacher even if the probe repaired it, a critical configuration); 2 usage, input or
connection error, or a missing extra, said in one line naming what was wrong, never a traceback;
141 when the reader of the output went away (``... | head``), quietly.

The commands are in :mod:`.replay`, :mod:`.live` (probe, preflight), :mod:`.reference` and
:mod:`.serve_reference`;
what they share in :mod:`.base`. This module builds the one parser and maps errors to exit codes.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from distill_guard._version import __version__
from distill_guard.cli.base import (
    EXIT_FOUND,
    EXIT_OK,
    EXIT_PIPE,
    EXIT_USAGE,
    SECRET_OPTION,
    CommandFailed,
    UsageError,
    _Parser,
    redacted_output,
)
from distill_guard.cli.live import (
    RELAX_FLAGS,
    SGLANG_LAUNCHERS,
    SGLANG_MODULES,
    add_live,
    cmd_preflight,
    cmd_probe,
)
from distill_guard.cli.reference import add_reference, cmd_reference
from distill_guard.cli.replay import add_replay, cmd_replay
from distill_guard.cli.serve_reference import add_serve_reference, cmd_serve_reference
from distill_guard.extras import EXTRAS, MissingExtra, install_line

__all__ = [
    "EXIT_FOUND",
    "EXIT_OK",
    "EXIT_PIPE",
    "EXIT_USAGE",
    "RELAX_FLAGS",
    "SECRET_OPTION",
    "SGLANG_LAUNCHERS",
    "SGLANG_MODULES",
    "UsageError",
    "add_live",
    "add_reference",
    "add_replay",
    "add_serve_reference",
    "build_parser",
    "cmd_preflight",
    "cmd_probe",
    "cmd_reference",
    "cmd_replay",
    "cmd_serve_reference",
    "main",
]


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="distill-guard",
        description="Guards for on-policy distillation: catch a dead teacher, repair it, or halt.",
        allow_abbrev=False,
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="log the guard's own messages (INFO and above)"
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {__version__}", help="print the version"
    )
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", help="run COMMAND --help for its options"
    )
    add_replay(sub)
    add_live(sub)
    add_reference(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.ERROR,
        format="%(levelname)s %(name)s: %(message)s",
    )
    with redacted_output():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from distill_guard.teachers.base import TeacherError

    try:
        code = int(args.func(args))
        sys.stdout.flush()  # a closed pipe shows here, inside the try
        return code
    except BrokenPipeError:
        # the reader left (`| head`): nothing more to say; stdout's last flush at exit must not
        # raise again, so it goes to /dev/null
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_PIPE
    except (UsageError, CommandFailed, TeacherError, MissingExtra) as exc:
        message = str(exc)
    except ModuleNotFoundError as exc:  # an import no `needed` block covers
        top = (exc.name or "").split(".")[0]
        extra = next((e for e, modules in EXTRAS.items() if top in modules), None)
        if extra is None:
            raise
        message = f"{exc.name} is not installed: pip install {install_line(extra)}"
    print(f"distill-guard {args.command}: error: {message}", file=sys.stderr)
    return EXIT_USAGE
