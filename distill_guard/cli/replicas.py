"""``distill-guard probe`` of a teacher made of replicas: ``--url`` repeated, or ``--router URL``
(its workers), each replica probed at its own address (:mod:`distill_guard.live.replica_probe`)."""

from __future__ import annotations

import argparse
import json
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING

from distill_guard.cli.base import CommandFailed, UsageError

if TYPE_CHECKING:
    from distill_guard.live.canary import Canary
    from distill_guard.teachers.sglang_http import SGLangHTTPTeacher


def probe_fleet(
    args: argparse.Namespace,
    urls: list[str],
    canary: Canary,
    connect: Callable[[argparse.Namespace], SGLangHTTPTeacher],
) -> int:
    """Probe every replica (``urls``, then the router's workers not among them); print a row
    per replica (or ``--json``, an entry per replica); exit 1 when any replica failed."""
    from distill_guard.cli.progress import Progress
    from distill_guard.errors import GuardValueError
    from distill_guard.live.probe import cycle_result
    from distill_guard.live.replica_probe import format_fleet, probe_replicas
    from distill_guard.teachers.base import TeacherError
    from distill_guard.teachers.replicas import replica_urls
    from distill_guard.teachers.sglang_router import SGLangRouter

    if args.conformance:
        raise UsageError("--conformance checks one server: give one --url, not several or --router")
    if args.teacher_temperature is not None:
        raise UsageError("--teacher-temperature is read only with --conformance")
    try:
        if args.router:
            with SGLangRouter(args.router, timeout_s=args.timeout) as router:
                replicas = replica_urls(urls, router)
        else:
            replicas = replica_urls(urls)
    except TeacherError as e:
        raise CommandFailed(f"router {args.router}: {e}") from None
    except GuardValueError as e:
        raise UsageError(str(e)) from None
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    progress = Progress.for_command(args.json)
    progress.say(f"probe: {len(replicas)} replica(s), {args.cycles} cycle(s) each")

    def opened(url: str) -> SGLangHTTPTeacher:
        return connect(argparse.Namespace(**{**vars(args), "url": url}))

    fleet = probe_replicas(
        replicas,
        opened,
        cycles=args.cycles,
        canary=canary,
        tags=args.tags or None,
        repair=not args.no_repair,
        router=args.router,
        on_replica=lambda url: progress.say(f"probe: {url}"),
        on_cycle=lambda url, c: progress.say(f"probe: {url} cycle {c.cycle}: {cycle_result(c)}"),
    )
    if args.json:
        print(json.dumps(fleet.to_json(), indent=2))
    else:
        print(format_fleet(fleet, args.cycles, canary))
    return fleet.exit_code
