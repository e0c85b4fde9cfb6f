"""``distill-guard serve-reference``: a tiny torch teacher behind SGLang's native API (not SGLang;
for offline runs and tests)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from distill_guard import redaction
from distill_guard.cli.base import EXIT_OK, UsageError, _global_flags, _HelpFormatter, examples
from distill_guard.extras import require


def add_serve_reference(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve-reference",
        parents=[_global_flags()],
        help="serve a tiny torch teacher over SGLang's native API (NOT SGLang; offline/tests)",
        description="A TorchTeacher behind SGLang's native HTTP endpoints, on 127.0.0.1. It is not "
        "SGLang: it only scores (max_new_tokens 0), has no tokenizer, and emulates the memory "
        "saver's sleep/wake on CPU.",
        epilog=examples(
            "distill-guard serve-reference --model /tmp/tiny --build-tiny 512 --port 30000",
            "distill-guard serve-reference --model /tmp/tiny --port 30000 "
            "--enable-weights-cpu-backup",
        ),
        formatter_class=_HelpFormatter,
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
        help="environment variable holding an API key to require (Authorization: Bearer); "
        "default SGLANG_API_KEY when it is set, the variable the clients send their key from",
    )
    p.add_argument(
        "--no-api-key",
        action="store_true",
        help="serve without a key even when SGLANG_API_KEY is set",
    )
    p.add_argument(
        "--torch-threads",
        type=int,
        default=None,
        help="torch intra-op threads (1 is fastest for tiny models on a busy CPU)",
    )
    p.set_defaults(func=cmd_serve_reference)


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
    api_key = _api_key(args)
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
    keyed = f", key from ${args.api_key_env or DEFAULT_KEY_ENV}" if api_key else ", no key"
    print(
        f"distill_guard reference server (NOT SGLang) for {model} on http://{args.host}:{args.port}"
        + keyed,
        flush=True,
    )
    serve(server, host=args.host, port=args.port)
    return EXIT_OK


DEFAULT_KEY_ENV = "SGLANG_API_KEY"


def _api_key(args: argparse.Namespace) -> str | None:
    """The key to require: from ``--api-key-env``, else from ``$SGLANG_API_KEY`` when it is set
    (fail closed: a key in the environment means one is meant), unless ``--no-api-key``. Real
    SGLang reads no key from its environment (only ``--api-key``); this is the tool's choice."""
    if args.no_api_key:
        if args.api_key_env:
            raise UsageError("--no-api-key and --api-key-env contradict each other: give one")
        return None
    name = args.api_key_env or DEFAULT_KEY_ENV
    key = (os.environ.get(name) or "").strip()
    if args.api_key_env and not key:
        raise UsageError(f"--api-key-env {args.api_key_env}: the variable is not set")
    redaction.register(key)
    return key or None
