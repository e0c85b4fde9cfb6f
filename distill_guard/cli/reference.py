"""``distill-guard reference``: the teacher's reference from its checkpoint, as a file a launcher
ships with the run (for a teacher too large to load a second time in the trainer)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from distill_guard.cli.base import UsageError, _command, _guard_config_args, examples
from distill_guard.presets import PRESETS

DTYPES = ("float32", "bfloat16", "float16")


def add_reference(sub: argparse._SubParsersAction) -> None:
    summary = "make the teacher's reference file from its checkpoint (canary logprobs)"
    epilog = examples(
        "distill-guard reference /ckpt/teacher --out teacher_reference.json",
        "distill-guard reference /ckpt/teacher --out ref.json --teacher-temperature 0.7 "
        "--device cuda --dtype bfloat16",
    )
    p = _command(sub, "reference", cmd_reference, summary, epilog)
    p.add_argument("model_path", help="the checkpoint directory the teacher is launched from")
    p.add_argument("--out", required=True, metavar="FILE.json", help="where to write it")
    p.add_argument(
        "--teacher-temperature",
        type=float,
        default=1.0,
        help="the temperature the run consumes the teacher at (default 1: the model's own)",
    )
    p.add_argument("--device", default="cpu", help="where to run the forward (default cpu)")
    p.add_argument(
        "--dtype",
        choices=DTYPES,
        default="float32",
        help="dtype of the reference forward (default float32: the most exact there is)",
    )
    p.add_argument(
        "--tolerance-mean",
        type=float,
        default=None,
        help="largest mean |Δ logprob| (nats) of a healthy teacher against it; default by the "
        "teacher's serving dtype (bf16 0.5, fp16 0.1, fp32 0.02)",
    )
    p.add_argument(
        "--tolerance-max",
        type=float,
        default=None,
        help="largest single |Δ logprob| (nats); default by dtype (bf16 3, fp16 0.5, fp32 0.1)",
    )
    _guard_config_args(
        p, "for the canary: checks.canary.top_k=8 (the run's guard must use the same canary)"
    )


def cmd_reference(args: argparse.Namespace) -> int:
    """Load the teacher's checkpoint once, in a process that never slept, score the guard's
    canary at the run's teacher temperature, and write the result: give it to the run as
    ``teacher_reference=FILE.json``. Every wake, in-process step and repair is then held
    against it, so a teacher wrong from its first wake (garbage, another checkpoint, another
    temperature, a copy of the student) is caught before its first update."""
    import torch
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from distill_guard.config import compose_guard_config
    from distill_guard.errors import GuardValueError
    from distill_guard.live.teacher_reference import reference_from_checkpoint
    from distill_guard.live.teacher_temperature import check_teacher_temperature

    if args.preset not in PRESETS:
        raise UsageError(f"unknown preset '{args.preset}'; choose one of {', '.join(PRESETS)}")
    for name in ("tolerance_mean", "tolerance_max"):
        value = getattr(args, name)
        if value is not None and not value > 0:
            raise UsageError(f"--{name.replace('_', '-')} must be > 0, got {value}")
    out = Path(args.out)
    if not out.resolve().parent.is_dir():
        raise UsageError(f"--out {out}: the folder {out.parent} does not exist")
    try:
        temperature = check_teacher_temperature(
            args.teacher_temperature, name="--teacher-temperature"
        )
        node = compose_guard_config(args.preset, list(args.set))
        canary = OmegaConf.to_object(node).checks.canary  # type: ignore[union-attr]
        ref = reference_from_checkpoint(
            args.model_path,
            canary,
            temperature=temperature,
            dtype=getattr(torch, args.dtype),
            device=args.device,
        )
    except GuardValueError as exc:  # a bad temperature, a checkpoint that cannot be read
        raise UsageError(str(exc)) from None
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        from distill_guard.config import describe_bad_override

        why = describe_bad_override(args.preset, args.set, exc)
        raise UsageError(f"bad guard setting: {why}") from None
    ref.tolerance_mean, ref.tolerance_max = args.tolerance_mean, args.tolerance_max
    ref.save(out)
    summary = {
        "out": str(out),
        "source": ref.source,
        "temperature": ref.temperature,
        "tokens": len(ref.tokens),
        "top_k": len(ref.topk_logprobs[0]) if ref.topk_logprobs else 0,
        "dtype": ref.dtype,
        "seconds": round(ref.seconds, 3),
    }
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"teacher reference written to {out}: the canary ({summary['tokens']} tokens, top-"
            f"{summary['top_k']}) as {ref.source} scores it at temperature "
            f"{ref.temperature:g} ({ref.dtype}, {ref.seconds:.2f} s).\n"
            f"Give it to the run: teacher_reference={out}"
        )
    return 0
