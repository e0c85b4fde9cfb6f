"""``distill-guard``: replay a run's metric history; probe, preflight or serve a teacher.

One exit-code scheme for every command: 0 healthy; 1 the guard found a problem (warn or above,
a lost teacher even if the probe repaired it, a critical configuration); 2 usage, input or
connection error, or a missing extra, said in one line naming what was wrong, never a traceback;
141 when the reader of the output went away (``... | head``), quietly.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from distill_guard import __version__
from distill_guard.config import PRESETS
from distill_guard.extras import EXTRAS, MissingExtra, install_line, require
from distill_guard.findings import Finding, Severity

if TYPE_CHECKING:
    from distill_guard.teachers.sglang_http import SGLangHTTPTeacher

EXIT_OK, EXIT_FOUND, EXIT_USAGE = 0, 1, 2
EXIT_PIPE = 141
"""The reader of our stdout went away (``... | head``): 128 + SIGPIPE, as a shell reports it."""
SGLANG_MODULES = ("sglang.launch_server", "sglang_router.launch_server")
SGLANG_LAUNCHERS = (*(f"python -m {m} ..." for m in SGLANG_MODULES), "sglang serve ...")
RELAX_FLAGS = "--use-opd, --teacher-hf-checkpoint, --opd-teacher-url, --teacher-sglang-*"


class UsageError(Exception):
    """Bad input, an unreachable teacher, a missing extra: reported in one line, exit 2."""


SECRET_OPTION = re.compile(r"(--[\w-]*(?:key|token|secret|password)[\w-]*)(=|\s+)(?!-)(\S+)")


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


def _command(
    sub: argparse._SubParsersAction, name: str, func: Callable[..., int], summary: str
) -> argparse.ArgumentParser:
    """A subcommand that runs ``func(args) -> exit code``, described by ``func``'s docstring,
    and can print JSON."""
    description = " ".join((func.__doc__ or summary).split())
    p = sub.add_parser(
        name, help=summary, description=description, allow_abbrev=False, parents=[_global_flags()]
    )
    p.add_argument("--json", action="store_true", help="print one JSON object, not a table")
    p.set_defaults(func=func)
    return p


# ---------------------------------------------------------------------------------- replay


def add_replay(sub: argparse._SubParsersAction) -> None:
    summary = "replay a metric history (JSONL or wandb CSV) through the guard"
    p = _command(sub, "replay", cmd_replay, summary)
    p.add_argument("path", help="history: JSONL (one object per step) or CSV with a _step column")
    p.add_argument(
        "--key",
        action="append",
        type=_key_value,
        default=[],
        metavar="ROLE=NAME",
        help="map a role (loss, student_entropy, truncated_ratio, teacher_logprob, eval_accuracy) "
        "to a metric name in the file; repeatable",
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
    p.add_argument("--preset", default="default", help=f"guard preset: {', '.join(PRESETS)}")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Hydra override on the guard config, e.g. checks.entropy_drift.threshold_sigma=4; repeatable",
    )
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
    halt_step, notices) and --plot. Metric names default to Relax's."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

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
    try:
        history = load_history(args.path, dict(args.key))
        result = replay(history, args.preset, overrides)
    except HistoryError as exc:
        raise UsageError(str(exc)) from None
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        raise UsageError(f"bad guard setting: {str(exc).splitlines()[0]}") from None
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


# ---------------------------------------------------------------------------------- live teachers


def _connection_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help="teacher base URL, e.g. http://127.0.0.1:30000")
    p.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        help="seconds for one read, retries included (default 30); release, resume and reload "
        "get 20x",
    )
    p.add_argument(
        "--api-key-env",
        default="SGLANG_API_KEY",
        help="environment variable holding the server's --api-key (default SGLANG_API_KEY)",
    )


def add_live(sub: argparse._SubParsersAction) -> None:
    summary = "preflight a live teacher, then sleep/wake it N times with the canary"
    p = _command(sub, "probe", cmd_probe, summary)
    _connection_args(p)
    p.add_argument("--cycles", type=int, default=3, help="sleep/wake cycles (default 3)")
    p.add_argument(
        "--tags",
        nargs="*",
        default=None,
        choices=["weights", "kv_cache", "cuda_graph"],
        help="memory tags to release and resume (default: all)",
    )
    p.add_argument("--top-k", type=int, default=16, help="canary top-k (default 16)")
    p.add_argument("--canary-length", type=int, default=64, help="canary tokens (default 64)")
    p.add_argument("--seed", type=int, default=0, help="canary seed (default 0)")
    p.add_argument("--no-repair", action="store_true", help="report a lost teacher, do not repair")

    summary = "check a teacher's configuration (live server or launch command)"
    p = _command(sub, "preflight", cmd_preflight, summary)
    _connection_args(p)
    p.add_argument("--args", dest="launch_args", help="launch command line, quoted")
    p.add_argument(
        "--teacher-temperature",
        type=float,
        default=None,
        metavar="T",
        help="the run's configured teacher temperature (> 0). T != 1 on an SGLang teacher is "
        "reported: no SGLang release applies it to input logprobs. With --url it is measured "
        "on the canary (scored at 1, at T, at 1 again)",
    )

    p = sub.add_parser(
        "serve-reference",
        parents=[_global_flags()],
        help="serve a tiny torch teacher over SGLang's native API (NOT SGLang; offline/tests)",
        description="A TorchTeacher behind SGLang's native HTTP endpoints, on 127.0.0.1. It is not "
        "SGLang: it only scores (max_new_tokens 0), has no tokenizer, and emulates the memory "
        "saver's sleep/wake on CPU.",
        allow_abbrev=False,
    )
    p.add_argument("--model", required=True, help="checkpoint dir (config.json + *.safetensors)")
    p.add_argument("--port", type=int, required=True, help="TCP port to listen on")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument(
        "--build-tiny",
        type=int,
        metavar="V",
        default=None,
        help="first write a tiny seeded Qwen3 with vocabulary V to --model if it has no config.json",
    )
    p.add_argument("--enable-weights-cpu-backup", action="store_true", help="keep weights on sleep")
    p.add_argument("--disable-memory-saver", action="store_true", help="sleep keeps everything")
    p.add_argument(
        "--enable-deterministic-inference", action="store_true", help="report deterministic"
    )
    p.add_argument("--weight-cache-mode", default="off", help="reported; not 'off' disables backup")
    p.add_argument(
        "--fault",
        choices=["zeros", "garbage"],
        default="zeros",
        help="what a no-backup wake leaves",
    )
    p.add_argument(
        "--sglang-version",
        default="0.5.23",
        help="the SGLang release whose API and failure modes to emulate (default 0.5.23)",
    )
    p.add_argument(
        "--api-key-env",
        default=None,
        help="environment variable holding an API key to require (Authorization: Bearer)",
    )
    p.add_argument(
        "--torch-threads",
        type=int,
        default=None,
        help="torch intra-op threads (1 is fastest for tiny models on a busy CPU)",
    )
    p.set_defaults(func=cmd_serve_reference)


def _connect(args: argparse.Namespace) -> SGLangHTTPTeacher:
    from distill_guard.teachers import SGLangHTTPTeacher

    if not args.url:
        raise UsageError(f"{args.command} needs --url URL")
    return SGLangHTTPTeacher(
        args.url,
        api_key_env=args.api_key_env,
        timeout_s=args.timeout,
        admin_timeout_s=max(args.timeout * 20, args.timeout),
        max_retries=1,
    )


def _print_findings(findings: list[Finding]) -> None:
    for f in findings:
        print(f"[{f.severity.value.upper():8}] {f.code}: {f.message}")


def cmd_preflight(args: argparse.Namespace) -> int:
    """Check a teacher's configuration only: from a live server's /server_info (--url) or from
    an SGLang or Relax launch command line (--args); with --teacher-temperature, also whether
    the teacher will score at the run's teacher temperature (measured on the canary with
    --url)."""
    from distill_guard.live.preflight import (
        check_teacher_temperature,
        parse_launch_command,
        preflight_server_args,
        preflight_teacher,
    )

    if bool(args.url) == bool(args.launch_args):
        raise UsageError('preflight needs exactly one of --url URL or --args "..."')
    try:
        temperature = check_teacher_temperature(
            args.teacher_temperature, name="--teacher-temperature"
        )
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.launch_args:
        try:
            server_args = parse_launch_command(args.launch_args)
        except ValueError as e:
            raise UsageError(f"cannot parse --args: {e}") from None
        _check_launcher(args.launch_args, server_args["launcher"])
        source = f"{server_args['launcher']} command line"
        findings = preflight_server_args(server_args, teacher_temperature=temperature)
    else:
        with _connect(args) as teacher:
            findings = preflight_teacher(teacher, teacher_temperature=temperature)
        source = args.url
    bad = any(f.severity >= Severity.CRITICAL for f in findings)
    if args.json:
        print(json.dumps({"ok": not bad, "findings": [f.to_dict() for f in findings]}, indent=2))
    else:
        print(f"preflight of {source}: {'problems found' if bad else 'no critical problem'}")
        _print_findings(findings)
    return EXIT_FOUND if bad else EXIT_OK


def _check_launcher(command: str, launcher: str) -> None:
    """preflight reads any unknown command line as SGLang flags and would find nothing wrong in
    it: refuse a command that names none of the launchers it knows."""
    if launcher != "sglang":
        return
    words = command.split()
    if any(w in SGLANG_MODULES for w in words) or any(
        Path(a).name == "sglang" and b == "serve" for a, b in zip(words, words[1:])
    ):
        return
    raise UsageError(
        f"--args: not a launch command preflight recognises (looked for "
        f"{', '.join(SGLANG_LAUNCHERS)}, or a Relax training command with {RELAX_FLAGS}); "
        f"got {command[:80]!r}"
    )


def cmd_probe(args: argparse.Namespace) -> int:
    """Preflight, then N release/resume cycles, each verified by the canary. A cycle that loses
    the weights is repaired (resume, reload, flush, verify) before exiting."""
    from distill_guard.live.canary import Canary
    from distill_guard.live.probe import format_report, run_probe

    for name, low in (("cycles", 0), ("top_k", 0), ("canary_length", 2)):
        if getattr(args, name) < low:
            raise UsageError(
                f"--{name.replace('_', '-')} must be >= {low}, got {getattr(args, name)}"
            )
    if not args.timeout > 0:
        raise UsageError(f"--timeout must be > 0 seconds, got {args.timeout}")
    canary = Canary(top_k=args.top_k, length=args.canary_length, seed=args.seed)
    # a SIGTERM ends the probe like Ctrl-C: the probe puts the teacher back before exiting
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    with _connect(args) as teacher:
        report = run_probe(
            teacher, args.cycles, args.tags or None, canary, repair=not args.no_repair
        )
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
        return report.exit_code
    print(format_report(report, args.url, args.cycles, canary))
    return report.exit_code


def cmd_serve_reference(args: argparse.Namespace) -> int:
    require("distill-guard serve-reference", "server,hf", "fastapi", "uvicorn", "transformers")
    from distill_guard.teachers import TorchTeacher
    from distill_guard.testing.reference_server import ReferenceServer, serve
    from distill_guard.testing.tiny import build_tiny_qwen3

    if args.torch_threads:
        import torch

        torch.set_num_threads(args.torch_threads)
    model = Path(args.model)
    if args.build_tiny and not (model / "config.json").exists():
        build_tiny_qwen3(model, vocab_size=args.build_tiny)
    if not (model / "config.json").exists():
        raise UsageError(f"no config.json in {model} (--build-tiny V creates a tiny model there)")
    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            raise UsageError(f"--api-key-env {args.api_key_env}: the variable is not set")
    teacher = TorchTeacher.from_pretrained(
        model,
        enable_memory_saver=not args.disable_memory_saver,
        enable_cpu_backup=args.enable_weights_cpu_backup,
        fault=args.fault,
        enable_deterministic_inference=args.enable_deterministic_inference,
        weight_cache_mode=args.weight_cache_mode,
    )
    server = ReferenceServer(
        teacher, version=args.sglang_version, api_key=api_key, launch_command=" ".join(sys.argv)
    )
    print(
        f"distill_guard reference server (NOT SGLang) for {model} on http://{args.host}:{args.port}",
        flush=True,
    )
    serve(server, host=args.host, port=args.port)
    return EXIT_OK


# ---------------------------------------------------------------------------------- entry


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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from distill_guard.teachers.base import TeacherError

    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.ERROR,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        code = int(args.func(args))
        sys.stdout.flush()  # a closed pipe shows here, inside the try
        return code
    except BrokenPipeError:
        # the reader left (`| head`): nothing more to say; stdout's last flush at exit must not
        # raise again, so it goes to /dev/null
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_PIPE
    except (UsageError, TeacherError, MissingExtra) as exc:
        message = str(exc)
    except ModuleNotFoundError as exc:  # an import no `needed` block covers
        top = (exc.name or "").split(".")[0]
        extra = next((e for e, modules in EXTRAS.items() if top in modules), None)
        if extra is None:
            raise
        message = f"{exc.name} is not installed: pip install {install_line(extra)}"
    print(f"distill-guard {args.command}: error: {message}", file=sys.stderr)
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
