"""``distill-guard``: replay a run's metric history; probe, preflight or serve a teacher.

Exit codes everywhere: 0 healthy; 1 the guard found a problem (warn or above, a repair or a
halt); 2 usage, input or connection error, with a message naming what was wrong.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence

from distill_guard.config import PRESETS

EXIT_OK, EXIT_FOUND, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """Bad input: reported in one line, exit 2."""


def _key_value(text: str) -> tuple[str, str]:
    role, sep, name = text.partition("=")
    if not sep or not role or not name:
        raise argparse.ArgumentTypeError(f"expected ROLE=NAME, got {text!r}")
    return role, name


def add_replay_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "replay",
        help="replay a metric history (JSONL or wandb CSV) through the guard",
        description="Replay a run's per-step metrics through a guard preset and report what it "
        "would have found and done. Metric names default to Relax's.",
    )
    p.add_argument(
        "path", help="history file: JSONL (one object per step) or CSV with a _step column"
    )
    p.add_argument(
        "--key",
        action="append",
        type=_key_value,
        default=[],
        metavar="ROLE=NAME",
        help="map a role (loss, student_entropy, truncated_ratio, teacher_logprob, eval_accuracy) "
        "to a metric name in the file; repeatable",
    )
    p.add_argument("--loss", choices=["jsd", "reverse_kl", "forward_kl"], default="jsd")
    p.add_argument("--beta", type=float, default=0.5, help="JSD teacher weight (default 0.5)")
    p.add_argument("--vocab-size", type=int, default=None, help="teacher vocabulary size V")
    p.add_argument(
        "--loss-scale", type=float, default=1.0, help="factor applied to the logged loss"
    )
    p.add_argument("--preset", default="default", help=f"guard preset: {', '.join(PRESETS)}")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Hydra override on the guard config, e.g. checks.entropy_drift.h=6; repeatable",
    )
    p.add_argument("--json", action="store_true", help="print the machine-readable result")
    p.add_argument("--plot", metavar="FILE.png", help="draw the signals with the findings marked")
    p.set_defaults(func=run_replay)


def run_replay(args: argparse.Namespace) -> int:
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from distill_guard.history import HistoryError, load_history
    from distill_guard.replay import format_table, replay

    if args.preset not in PRESETS:
        raise UsageError(f"unknown preset '{args.preset}'; choose one of {', '.join(PRESETS)}")
    overrides = [
        f"run.loss={args.loss.upper()}",
        f"run.beta={args.beta}",
        f"run.loss_scale={args.loss_scale}",
        f"run.vocab_size={args.vocab_size if args.vocab_size is not None else 'null'}",
        *args.set,
    ]
    try:
        history = load_history(args.path, dict(args.key))
        result = replay(history, args.preset, overrides)
    except HistoryError as exc:
        raise UsageError(str(exc)) from None
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        raise UsageError(f"bad guard setting: {str(exc).splitlines()[0]}") from None
    if args.plot:
        from distill_guard.report import plot_replay

        plot_replay(result, args.plot)
    if args.json:
        print(json.dumps(result.to_json(), indent=None))
    else:
        print(format_table(result))
        if args.plot:
            print(f"\nplot written to {args.plot}")
    return result.exit_code()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="distill-guard",
        description="Guards for on-policy distillation: catch a dead teacher, repair it, or halt.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log the guard's own messages")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_replay_command(sub)
    try:
        from distill_guard.cli_live import add_live_commands
    except ImportError:  # the live-teacher layer is optional at import time
        pass
    else:
        add_live_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.ERROR,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        return args.func(args)
    except UsageError as exc:
        print(f"distill-guard {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
