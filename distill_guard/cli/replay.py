"""``distill-guard replay``: a run's metric history through a guard preset, offline."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from distill_guard.cli.base import UsageError, _command, _guard_config_args, _key_value, examples
from distill_guard.extras import require
from distill_guard.presets import PRESETS


def add_replay(sub: argparse._SubParsersAction) -> None:
    summary = "replay a metric history (JSONL or wandb CSV) through the guard"
    epilog = examples(
        "distill-guard replay run.jsonl --vocab-size 151936",
        "distill-guard replay run.csv --key loss=train/opd_loss --loss jsd --beta 0.5 --json",
        "distill-guard replay run.jsonl --preset strict --plot timeline.png",
        "distill-guard replay run.jsonl --set checks.entropy_drift.threshold_sigma=4",
    )
    p = _command(sub, "replay", cmd_replay, summary, epilog)
    p.add_argument("path", help="history: JSONL (one object per step) or CSV with a _step column")
    p.add_argument(
        "--key",
        action="append",
        type=_key_value,
        default=[],
        metavar="ROLE=NAME",
        help="map a role (loss, student_entropy, truncated_ratio, teacher_logprob, eval_accuracy) "
        "to a metric name in the file, in place of the names of every known convention "
        "(Relax, slime/miles, TRL/transformers, Lightning, the demo: docs/metric-names.md); "
        "repeatable",
    )
    p.add_argument(
        "--loss",
        choices=["jsd", "reverse_kl", "forward_kl"],
        default="jsd",
        help="the run's distillation loss, so the loss checks use its bounds (default jsd)",
    )
    p.add_argument("--beta", type=float, default=0.5, help="JSD teacher weight (default 0.5)")
    p.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        help="teacher vocabulary size V: makes the uniform-teacher test (−ln V) exact; without "
        "it V is only inferred from a flat teacher logprob column, and the replay says so",
    )
    p.add_argument("--loss-scale", type=float, default=1.0, help="factor applied to the loss")
    _guard_config_args(p, "e.g. checks.entropy_drift.threshold_sigma=4")
    p.add_argument(
        "--plot",
        metavar="FILE.png",
        help="draw the signals with their bounds (JSD ceiling, ±ln V), each finding's first "
        "step, the first action and the halt",
    )


def cmd_replay(args: argparse.Namespace) -> int:
    """Replay a run's per-step metrics through a guard preset and report what it would have
    found and done: each finding's first step, the first action (skip_batch, rewake or halt)
    and the halt, told apart and with the same steps in the table, --json (first_action,
    halt_step, notices) and --plot. Each role is read under the first of its names, across
    every known convention, that the file has; ``--key`` maps a role to one name instead."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from distill_guard.cli.progress import Progress
    from distill_guard.history import HistoryError, load_history
    from distill_guard.replay import format_table, replay

    if args.preset not in PRESETS:
        raise UsageError(f"unknown preset '{args.preset}'; choose one of {', '.join(PRESETS)}")
    if args.plot:
        require("distill-guard replay --plot", "plot")
    overrides = [
        f"run.loss={args.loss.upper()}",
        f"run.beta={args.beta}",
        f"run.loss_scale={args.loss_scale}",
        f"run.vocab_size={args.vocab_size if args.vocab_size is not None else 'null'}",
        *args.set,
    ]
    progress = Progress.for_command(args.json, delay_s=1.0)
    try:
        history = load_history(args.path, dict(args.key))
        result = replay(
            history,
            args.preset,
            overrides,
            on_step=lambda done, total: progress.count(done, total, "replay: steps"),
        )
    except HistoryError as exc:
        raise UsageError(str(exc)) from None
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        from distill_guard.config import describe_bad_override

        why = describe_bad_override(args.preset, args.set, exc)
        raise UsageError(f"bad guard setting: {why}") from None
    finally:
        progress.close()
    if args.plot and not Path(args.plot).resolve().parent.is_dir():
        raise UsageError(f"--plot {args.plot}: the folder {Path(args.plot).parent} does not exist")
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
