"""``distill-guard probe | preflight | serve-reference``: the commands that talk to live teachers.

Exit codes: 0 healthy; 1 the teacher lost its weights or preflight found a critical problem (also
when the probe then repaired it: the configuration is still wrong); 2 usage or connection error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from distill_guard.findings import Finding, Severity

EXIT_OK = 0
EXIT_UNHEALTHY = 1
EXIT_ERROR = 2


def _add_connection_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help="teacher base URL, e.g. http://127.0.0.1:30000")
    p.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        help="seconds for one read, retries included (default 30); release, resume and reload get 20x",
    )
    p.add_argument(
        "--api-key-env",
        default="SGLANG_API_KEY",
        help="environment variable holding the server's --api-key (default SGLANG_API_KEY)",
    )


def add_live_commands(subparsers: Any) -> None:
    """Register ``probe``, ``preflight`` and ``serve-reference``; each sets ``func=(args) -> int``."""
    p = subparsers.add_parser(
        "probe",
        help="preflight a live teacher, then sleep/wake it N times with the canary",
        description="Preflight, then N release/resume cycles, each verified by the canary. A cycle "
        "that loses the weights is repaired (resume, reload, flush, verify) before exiting.",
    )
    _add_connection_args(p)
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
    p.add_argument(
        "--no-repair", action="store_true", help="report a lost teacher, do not repair it"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.set_defaults(func=cmd_probe)

    p = subparsers.add_parser(
        "preflight",
        help="check a teacher's configuration (live server or launch command)",
        description="Check a teacher's configuration only: from a live server's /server_info "
        "(--url) or from an SGLang or Relax launch command line (--args).",
    )
    _add_connection_args(p)
    p.add_argument("--args", dest="launch_args", help="launch command line, quoted")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_preflight)

    p = subparsers.add_parser(
        "serve-reference",
        help="serve a tiny torch teacher over SGLang's native API (NOT SGLang; offline/tests)",
        description="A TorchTeacher behind SGLang's native HTTP endpoints, on 127.0.0.1. It is not "
        "SGLang: it only scores (max_new_tokens 0), has no tokenizer, and emulates the memory "
        "saver's sleep/wake on CPU.",
    )
    p.add_argument("--model", required=True, help="checkpoint dir (config.json + *.safetensors)")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument(
        "--build-tiny",
        type=int,
        metavar="V",
        default=None,
        help="first write a tiny seeded Qwen3 with vocabulary V to --model if it has no config.json",
    )
    p.add_argument("--enable-weights-cpu-backup", action="store_true")
    p.add_argument("--disable-memory-saver", action="store_true")
    p.add_argument("--enable-deterministic-inference", action="store_true")
    p.add_argument("--weight-cache-mode", default="off")
    p.add_argument("--fault", choices=["zeros", "garbage"], default="zeros")
    p.add_argument(
        "--old-api", action="store_true", help="serve /get_server_info only; ignore tags"
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


def _error(message: str) -> int:
    print(f"distill-guard: error: {message}", file=sys.stderr)
    return EXIT_ERROR


def _connect(args: argparse.Namespace) -> Any:
    from distill_guard.teachers import SGLangHTTPTeacher

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
    from distill_guard.preflight import parse_launch_command, preflight_server_args
    from distill_guard.teachers import TeacherError

    if bool(args.url) == bool(args.launch_args):
        return _error('preflight needs exactly one of --url URL or --args "..."')
    if args.launch_args:
        try:
            server_args = parse_launch_command(args.launch_args)
        except ValueError as e:
            return _error(f"cannot parse --args: {e}")
        source = f"{server_args['launcher']} command line"
    else:
        try:
            with _connect(args) as teacher:
                server_args = teacher.server_info()
        except TeacherError as e:
            return _error(str(e))
        source = args.url
    findings = preflight_server_args(server_args)
    bad = any(f.severity >= Severity.CRITICAL for f in findings)
    if args.json:
        print(json.dumps({"ok": not bad, "findings": [f.to_dict() for f in findings]}, indent=2))
    else:
        print(f"preflight of {source}: {'problems found' if bad else 'no critical problem'}")
        _print_findings(findings)
    return EXIT_UNHEALTHY if bad else EXIT_OK


def cmd_probe(args: argparse.Namespace) -> int:
    from distill_guard.checks.canary import CanaryCheck
    from distill_guard.probe import format_table, run_probe
    from distill_guard.teachers import TeacherError

    if not args.url:
        return _error("probe needs --url URL")
    if args.cycles < 0:
        return _error("--cycles must be >= 0")
    canary = CanaryCheck(top_k=args.top_k, length=args.canary_length, seed=args.seed)
    try:
        with _connect(args) as teacher:
            report = run_probe(
                teacher, args.cycles, args.tags or None, canary, repair=not args.no_repair
            )
    except TeacherError as e:
        return _error(str(e))
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
        return report.exit_code
    print(
        f"probe of {args.url}: {args.cycles} sleep/wake cycle(s), canary of {canary.length} tokens, top-{canary.top_k}"
    )
    pre = [f for f in report.findings if f.code.startswith("config.")]
    if pre:
        print("preflight:")
        _print_findings(pre)
    if report.cycles:
        print(format_table(report))
    rest = [f for f in report.findings if not f.code.startswith("config.")]
    if rest:
        print("findings:")
        _print_findings(rest)
    lost = any(c.lost_weights for c in report.cycles)
    if lost and report.repaired:
        print(
            "The teacher lost its weights and was repaired (resume, reload, flush) and verified by the canary; it is as the probe found it. Fix the configuration above: it will happen again at the next wake."
        )
    elif lost:
        print(
            "The teacher lost its weights and was NOT repaired: reload its weights or restart it before use."
        )
    print("result: " + ("healthy" if report.ok else "UNHEALTHY") + f" (exit {report.exit_code})")
    return report.exit_code


def cmd_serve_reference(args: argparse.Namespace) -> int:
    from pathlib import Path

    from distill_guard.teachers.reference_server import ReferenceServer, serve
    from distill_guard.teachers.tiny import build_tiny_qwen3
    from distill_guard.teachers.torch_teacher import TorchTeacher

    if args.torch_threads:
        import torch

        torch.set_num_threads(args.torch_threads)
    model = Path(args.model)
    if args.build_tiny and not (model / "config.json").exists():
        build_tiny_qwen3(model, vocab_size=args.build_tiny)
    if not (model / "config.json").exists():
        return _error(
            f"no config.json in {model} (use --build-tiny V to create a tiny model there)"
        )
    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            return _error(f"--api-key-env {args.api_key_env}: the variable is not set")
    teacher = TorchTeacher.from_pretrained(
        model,
        enable_memory_saver=not args.disable_memory_saver,
        enable_cpu_backup=args.enable_weights_cpu_backup,
        fault=args.fault,
        enable_deterministic_inference=args.enable_deterministic_inference,
        weight_cache_mode=args.weight_cache_mode,
    )
    server = ReferenceServer(
        teacher, old_api=args.old_api, api_key=api_key, launch_command=" ".join(sys.argv)
    )
    print(
        f"distill_guard reference server (NOT SGLang) for {model} on http://{args.host}:{args.port}",
        flush=True,
    )
    serve(server, host=args.host, port=args.port)
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry (``python -m distill_guard.cli_live``) until ``distill_guard.cli`` wires it."""
    parser = argparse.ArgumentParser(prog="distill-guard")
    add_live_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
