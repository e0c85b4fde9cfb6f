"""``distill-guard probe`` and ``preflight``: the commands that read or exercise a live teacher."""

from __future__ import annotations

import argparse
import json
import signal
from pathlib import Path
from typing import TYPE_CHECKING

from distill_guard.cli.base import (
    EXIT_FOUND,
    EXIT_OK,
    CommandFailed,
    UsageError,
    _command,
    examples,
)
from distill_guard.cli.serve_reference import add_serve_reference
from distill_guard.findings import Finding, Severity

if TYPE_CHECKING:
    from distill_guard.live.canary import Canary
    from distill_guard.live.probe import CycleReport
    from distill_guard.teachers.sglang_http import SGLangHTTPTeacher

SGLANG_MODULES = ("sglang.launch_server", "sglang_router.launch_server")
SGLANG_LAUNCHERS = (*(f"python -m {m} ..." for m in SGLANG_MODULES), "sglang serve ...")
RELAX_FLAGS = "--use-opd, --teacher-hf-checkpoint, --opd-teacher-url, --teacher-sglang-*"


def _connection_args(p: argparse.ArgumentParser, *, several: bool = False) -> None:
    if several:
        p.add_argument(
            "--url",
            action="append",
            help="teacher base URL, e.g. http://127.0.0.1:30000; repeat it for each replica of "
            "a teacher (each probed at its own address)",
        )
    else:
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
    p.add_argument(
        "--admin-api-key-env",
        default="SGLANG_ADMIN_API_KEY",
        help="environment variable holding the server's --admin-api-key, sent on the admin "
        "routes (pause, release, resume, reload, flush, checksum; default SGLANG_ADMIN_API_KEY)",
    )


def add_live(sub: argparse._SubParsersAction) -> None:
    """probe and preflight, then serve-reference: a teacher to point them at."""
    summary = "preflight a live teacher, then sleep/wake it N times with the canary"
    epilog = examples(
        "distill-guard probe --url http://127.0.0.1:30000",
        "distill-guard probe --url http://127.0.0.1:30000 --cycles 5 --tags weights --json",
        "distill-guard probe --url http://127.0.0.1:30000 --conformance > conformance.txt",
        "distill-guard probe --url http://127.0.0.1:30001 --url http://127.0.0.1:30002",
        "distill-guard probe --router http://127.0.0.1:30000 --json",
    )
    p = _command(sub, "probe", cmd_probe, summary, epilog)
    _connection_args(p, several=True)
    p.add_argument(
        "--router",
        metavar="URL",
        help="an sglang-router: probe each of its workers (GET /workers) at its own address, "
        "never through the router; the router's --api-key from $SGLANG_ROUTER_API_KEY",
    )
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
    p.add_argument(
        "--conformance",
        action="store_true",
        help="check every assumption the guard makes of this server (version, routes, auth, "
        "backup, each memory tag, sleep/wake, checksum, temperature on input logprobs) and print "
        "a table for a bug report; exit 1 if one FAILs. Precondition: the teacher must be awake "
        "when probed and nothing else may release or pause it meanwhile (SGLang cannot be asked "
        "whether it is released, and a scoring call on a released server kills it)",
    )
    p.add_argument(
        "--teacher-temperature",
        type=float,
        default=None,
        metavar="T",
        help="with --conformance: the temperature (> 0, not 1) sent to measure whether the "
        "server applies it to input logprobs (default 2)",
    )

    summary = "check a teacher's configuration (live server or launch command)"
    epilog = examples(
        "distill-guard preflight --url http://127.0.0.1:30000",
        'distill-guard preflight --args "python -m sglang.launch_server --model-path M '
        '--enable-memory-saver --enable-weights-cpu-backup"',
        "distill-guard preflight --url http://127.0.0.1:30000 --teacher-temperature 0.7",
    )
    p = _command(sub, "preflight", cmd_preflight, summary, epilog)
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

    add_serve_reference(sub)


def _connect(args: argparse.Namespace) -> SGLangHTTPTeacher:
    from distill_guard.teachers import SGLangHTTPTeacher

    if not args.url:
        raise UsageError(f"{args.command} needs --url URL")
    return SGLangHTTPTeacher(
        args.url,
        api_key_env=args.api_key_env,
        admin_api_key_env=args.admin_api_key_env,
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
    the weights is repaired (reload, flush, verify) before exiting. With --conformance,
    every assumption the guard makes of the server instead, as a table; the teacher must be
    awake when probed and nothing else may release or pause it meanwhile."""
    from distill_guard.cli.progress import Progress
    from distill_guard.live.canary import Canary
    from distill_guard.live.probe import cycle_result, format_report, run_probe

    for name, low in (("cycles", 0), ("top_k", 0), ("canary_length", 2)):
        if getattr(args, name) < low:
            raise UsageError(
                f"--{name.replace('_', '-')} must be >= {low}, got {getattr(args, name)}"
            )
    if not args.timeout > 0:
        raise UsageError(f"--timeout must be > 0 seconds, got {args.timeout}")
    canary = Canary(top_k=args.top_k, length=args.canary_length, seed=args.seed)
    urls = list(args.url or [])
    if args.router or len(urls) > 1:
        from distill_guard.cli.replicas import probe_fleet

        return probe_fleet(args, urls, canary, _connect)
    args.url = urls[0] if urls else None
    if args.conformance:
        return _conformance(args, canary)
    if args.teacher_temperature is not None:
        raise UsageError("--teacher-temperature is read only with --conformance")
    # a SIGTERM ends the probe like Ctrl-C: the probe puts the teacher back before exiting
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    progress = Progress.for_command(args.json)
    progress.say(f"probe: preflight and canary of {args.url}, then {args.cycles} cycle(s)")

    def on_cycle(c: CycleReport) -> None:
        progress.say(
            f"probe: cycle {c.cycle} of {args.cycles}: {cycle_result(c)} "
            f"(sleep+wake {c.sleep_wake_s:.2f} s, canary {c.canary_s:.2f} s)"
        )

    with _connect(args) as teacher:
        report = run_probe(
            teacher,
            args.cycles,
            args.tags or None,
            canary,
            repair=not args.no_repair,
            on_cycle=on_cycle,
        )
    if report.stopped:
        progress.say(f"probe: {report.stopped}")
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
        return report.exit_code
    print(format_report(report, args.url, args.cycles, canary))
    return report.exit_code


def _conformance(args: argparse.Namespace, canary: Canary) -> int:
    """``probe --conformance``: the table (or ``--json``), exit 1 if a row FAILs; a probe that
    could not start is one line, exit 2, with the URL's userinfo redacted."""
    from distill_guard.live.conformance import (
        format_conformance,
        run_conformance,
        scrub,
        url_secrets,
    )
    from distill_guard.live.preflight import check_teacher_temperature
    from distill_guard.teachers.base import TeacherError

    if args.tags:
        raise UsageError("--conformance releases each memory tag itself: drop --tags")
    if args.no_repair:
        raise UsageError("--conformance always repairs what its cycles broke: drop --no-repair")
    try:
        t = check_teacher_temperature(args.teacher_temperature, name="--teacher-temperature")
    except ValueError as e:
        raise UsageError(str(e)) from None
    if t is not None and t == 1.0:
        raise UsageError("--teacher-temperature must differ from 1 to measure anything")
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        with _connect(args) as teacher:
            report = run_conformance(teacher, canary, cycles=args.cycles, temperature=t or 2.0)
    except TeacherError as e:
        raise CommandFailed(scrub(str(e), url_secrets(args.url))) from None
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(format_conformance(report))
    return report.exit_code
