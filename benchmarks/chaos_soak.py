"""A chaos soak of the guarded training loop: 10,000 steps with faults at seeded random steps.

The demo's guarded loop (``examples/sdpo_sciknoweval``), shrunk to run 10k steps on a CPU in
minutes: a tiny Qwen3 student (V = 128, hidden 32, one layer) samples 4 responses of 4 tokens
to prompts from a fixed pool; a tiny Qwen3 teacher served by the package's reference server
(real HTTP on 127.0.0.1, through a fault proxy) scores prompt + response through
``SGLangHTTPTeacher`` (top-16 logprobs, ``timeout_s`` 0.5 s); the guard (``build_guard("default",
...)`` with the live teacher, as the demo's ``arms.make_guard`` builds it, plus the webhook of
the alerts config) sleeps and wakes the teacher every step and runs its canary after every
wake; the student takes its optimizer step (JSD over the teacher's top-16 and a tail bin, the
demo's ``jsd_topk_tail_loss``) only when the guard's decision at ``on_teacher_scores`` does not
act (skip_batch / rewake / halt), exactly as the demo's guarded arm consumes it.

Faults, each at steps drawn from a seeded schedule (about 1 % of the steps, never overlapping):

- ``zeroed_wake``: the served TorchTeacher is released without its CPU backup that cycle and
  wakes with zeros; ``garbage_wake``: the same with seeded noise (``fault="garbage"``);
- ``hang``, ``http_500``, ``reset``: the fault proxy holds every ``/generate`` past the client's
  timeout, answers it with an HTTP 500, or resets the connection after the request's headers,
  for the whole step (the guard's canary and the loop's scoring; admin calls pass);
- ``rank_death``: the supervisor checkpoints and runs the step and the next as a 2-rank gloo
  segment (two spawned processes, each with its own reference server and a
  ``DistributedReducer``), where rank 1 ``os._exit``s before its second wake; rank 0 must halt
  without an exception and write the halt into its event file (the main one); the supervisor
  then resumes single-process from rank 0's checkpoint with a fresh guard
  (``load_state_dict(..., keep_halt=False)``), as torchrun would restart it;
- ``disk_full``: ``RLIMIT_FSIZE`` lowered to the event file's size (SIGXFSZ ignored) for 4
  steps, then raised back to the hard limit; a zeroed wake at its second step gives the guard
  something to write;
- ``webhook_drip``: for 10 steps the webhook receiver (``DISTILL_GUARD_WEBHOOK_URL``) answers
  with headers, then one byte a second; a zeroed wake at its second step sends an alert into it
  (``alerts.min_interval_s=0``, so every alert reaches the webhook).

Ground truth comes from outside the guard. A poisoned update is an optimizer step whose loss used
teacher scores (the consumed top-16 and token logprobs) that differ by more than 1e-4 from a
never-slept in-process TorchTeacher's on the same sequences, or that was taken while the served
teacher's weights (read by the injector) were not the checkpoint's. An exception into the loop
is any exception out of a guard hook or a package adapter call (``TeacherError`` from the loop's
own scoring call is the client's documented answer and is counted apart). Recorded: the event
file (``read_events``) holds, at the fault's step or the next two, the record the table names
per kind. Memory is the main process's resident set every 1,000 steps; flat means the last
reading within 2 % of the first. A seed passes with 0 poisoned updates, 0 exceptions, every
injected fault recorded, no step of a drip window at 1 s or more, and flat memory.

Run (the three seeds of the report): ``.venv/bin/python benchmarks/chaos_soak.py --seed 0 1 2``
(``--steps 500`` to try it; ``--json FILE`` writes the per-seed results; ``--keep DIR`` keeps each
seed's event file; ``--preset monitor_only`` shows the ground truth at work: the same faults
then poison updates).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import http.server
import json
import logging
import math
import multiprocessing
import os
import platform
import random
import re
import resource
import select
import signal
import socket
import struct
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the demo's loop pieces live in examples/, beside the package
    sys.path.insert(0, str(ROOT))

from benchmarks.soak import rss_mib  # noqa: E402  (the resident set, as the 100k soak reads it)
from distill_guard import build_guard  # noqa: E402
from distill_guard.alerts.webhook import WEBHOOK_ENV  # noqa: E402
from distill_guard.cli.progress import Progress  # noqa: E402
from distill_guard.events import read_events  # noqa: E402
from distill_guard.teachers import SGLangHTTPTeacher, TeacherError, TorchTeacher  # noqa: E402
from distill_guard.testing.servers import free_port, reference_teacher  # noqa: E402
from distill_guard.testing.tiny import build_tiny_qwen3, tiny_qwen3  # noqa: E402
from examples.sdpo_sciknoweval.opd import (  # noqa: E402
    jsd_topk_tail_loss,
    response_logits,
    sample_responses,
    student_stats,
)

V = 128
MODEL = {"vocab_size": V, "hidden_size": 32, "num_layers": 1, "intermediate_size": 64}
BATCH, NEW_TOKENS, PROMPT_LEN, POOL, TOP_K = 4, 4, 6, 64, 16
LR = 1e-3
EOS, PAD = 1, 0
TIMEOUT_S = 0.5
"""The client's overall deadline of one scoring call (retries included)."""
ADMIN_TIMEOUT_S = 5.0
POISON_TOL = 1e-4
WEBHOOK_TIMEOUT_S = 5.0
DRIP_BYTES = 12
"""A dripping webhook answer: headers, then this many body bytes, one a second."""
CONSENSUS_TIMEOUT_S = 3.0
WAITED_S = 1.0
"""A step in a drip window that took this long would have waited on one dripped byte."""
EVERY = 1_000
FLAT = 1.02
"""Memory is flat when the last resident-set reading is within 2 % of the first (step 1,000)."""

# kind: (faults per step, at least, steps the fault occupies, step of its zeroed-wake carrier)
KINDS: dict[str, tuple[float, int, int, int | None]] = {
    "zeroed_wake": (0.0015, 1, 1, None),
    "garbage_wake": (0.0015, 1, 1, None),
    "hang": (0.0010, 1, 1, None),
    "http_500": (0.0015, 1, 1, None),
    "reset": (0.0015, 1, 1, None),
    "rank_death": (0.0003, 1, 2, None),
    "disk_full": (0.0004, 1, 4, 1),
    "webhook_drip": (0.0004, 1, 10, 1),
}
RECORD_RULE = {
    "zeroed_wake": "a teacher finding (critical) and a repair.* record",
    "garbage_wake": "a teacher finding (critical) and a repair.* record",
    "hang": "teacher.unreachable naming the timeout",
    "http_500": "teacher.unreachable naming HTTP 500",
    "reset": "teacher.unreachable naming the dropped connection",
    "rank_death": "a halt record of rank 0 (the ranks could not agree)",
    "disk_full": "the lost events reported (at close, or once the disk frees)",
    "webhook_drip": "the carrier's alert record (and no step waited >= 1 s)",
}
GAP = 8
"""Healthy steps kept between two faults' windows."""

# ---------------------------------------------------------------------------------- helpers


class Captured(logging.Handler):
    """The package's log, kept out of the output: counts per level, and the event log's own
    reports of what it could not write (the full-disk fault's record outside the file)."""

    LOST = re.compile(r"(\d+) event\(s\) not written to (\S+)")

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.levels: Counter[str] = Counter()
        self.lost_reports: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.levels[record.levelname] += 1
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad record is not this benchmark's concern
            return
        if (m := self.LOST.search(message)) is not None:
            self.lost_reports.append((int(m.group(1)), m.group(2)))


def source_digest() -> str:
    """The package's and the demo's source as this run imports it (the spawned ranks import it
    afresh: a file edited during a run would make them run other code than the supervisor)."""
    digest = hashlib.sha256()
    for root in (ROOT / "distill_guard", ROOT / "examples" / "sdpo_sciknoweval"):
        for path in sorted(root.rglob("*.py")):
            digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def quiet_logs() -> Captured:
    handler = Captured()
    pkg = logging.getLogger("distill_guard")
    pkg.handlers[:] = [handler]
    pkg.setLevel(logging.WARNING)
    pkg.propagate = False
    for name in ("httpx", "httpcore", "uvicorn", "uvicorn.error", "transformers"):
        logging.getLogger(name).setLevel(logging.ERROR)
    return handler


def build_teacher(root: Path) -> Path:
    return build_tiny_qwen3(root / "teacher", seed=0, max_positions=256, **MODEL)


def make_student() -> torch.nn.Module:
    model = tiny_qwen3(seed=1, max_positions=256, **MODEL)
    model.config.eos_token_id, model.config.pad_token_id = EOS, PAD
    return model.train()


def prompt_pool(seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(10_000 + seed)
    return [torch.randint(2, V, (PROMPT_LEN,), generator=gen).tolist() for _ in range(POOL)]


PRESET = os.environ.get("CHAOS_SOAK_PRESET", "default")
"""The guard's preset (``--preset``; an environment variable so the spawned ranks see it too)."""


def make_guard(teacher: Any, events: Path, rank: int = 0) -> Any:
    """The demo's guarded arm: the ``default`` preset with the live teacher and the event file;
    alerts to the logger, the event file and the webhook of ``$DISTILL_GUARD_WEBHOOK_URL``."""
    overrides = [f"run.vocab_size={V}", "alerts.use_wandb=false", "alerts.min_interval_s=0"]
    overrides.append(f"alerts.webhook_timeout_s={WEBHOOK_TIMEOUT_S}")
    return build_guard(PRESET, overrides, teacher=teacher, events=events, rank=rank)


def http_teacher(url: str) -> SGLangHTTPTeacher:
    return SGLangHTTPTeacher(
        url,
        timeout_s=TIMEOUT_S,
        admin_timeout_s=ADMIN_TIMEOUT_S,
        max_retries=2,
        retry_backoff_s=0.05,
        vocab_size=V,
    )


# ------------------------------------------------------------------------------ fault proxy


class FaultProxy:
    """A loopback HTTP/1.1 proxy in front of the reference server. ``mode`` applies to
    ``/generate`` only: ``pass``, ``hang`` (read the request, never answer, until the mode
    changes or the client gives up), ``http_500`` (an SGLang-shaped JSON 500), ``reset`` (RST
    once the request's headers are in, its body unread)."""

    ANSWER_500 = json.dumps({"error": {"message": "chaos proxy: injected 500"}}).encode()

    def __init__(self, upstream: str) -> None:
        host, port = upstream.removeprefix("http://").split(":")
        self.upstream = (host, int(port))
        self.mode = "pass"
        self.faulted: Counter[str] = Counter()
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="chaos-proxy").start()

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        up: socket.socket | None = None  # opened at the first request passed on
        buf, reset = b"", False
        try:
            while True:
                head, buf = self._read_head(client, buf)
                if head is None:
                    return
                path = head.split(b" ", 2)[1].decode(errors="replace")
                mode = self.mode if path.startswith("/generate") else "pass"
                if mode == "reset":
                    self.faulted["reset"] += 1
                    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    reset = True
                    return
                body, buf = self._read_body(client, head, buf)
                if body is None:
                    return
                if mode == "pass":
                    if up is None:
                        up = socket.create_connection(self.upstream, timeout=10)
                        up.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                        up.settimeout(None)
                        threading.Thread(
                            target=self._splice, args=(up, client), daemon=True
                        ).start()
                    up.sendall(head + body)
                elif mode == "http_500":
                    self.faulted["http_500"] += 1
                    client.sendall(
                        b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\n"
                        + f"content-length: {len(self.ANSWER_500)}\r\n\r\n".encode()
                        + self.ANSWER_500
                    )
                else:  # hang: the request is in, no answer comes
                    self.faulted["hang"] += 1
                    deadline = time.monotonic() + 30
                    while self.mode == "hang" and time.monotonic() < deadline:
                        ready, _, _ = select.select([client], [], [], 0.05)
                        if ready and not client.recv(1, socket.MSG_PEEK):
                            break  # the client gave up
                    return
        except OSError:
            return
        finally:  # shutdown wakes the splice thread's blocked recv; close alone would not
            if up is not None:
                with contextlib.suppress(OSError):
                    up.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    up.close()
            if not reset:  # a reset closes with SO_LINGER 0 only: an RST, not a FIN
                with contextlib.suppress(OSError):
                    client.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                client.close()

    @staticmethod
    def _read_head(sock: socket.socket, buf: bytes) -> tuple[bytes | None, bytes]:
        while b"\r\n\r\n" not in buf:
            data = sock.recv(65536)
            if not data:
                return None, buf
            buf += data
        end = buf.index(b"\r\n\r\n") + 4
        return buf[:end], buf[end:]

    @staticmethod
    def _read_body(sock: socket.socket, head: bytes, buf: bytes) -> tuple[bytes | None, bytes]:
        m = re.search(rb"(?im)^content-length:\s*(\d+)", head)
        n = int(m.group(1)) if m else 0
        while len(buf) < n:
            data = sock.recv(65536)
            if not data:
                return None, buf
            buf += data
        return buf[:n], buf[n:]

    @staticmethod
    def _splice(up: socket.socket, client: socket.socket) -> None:
        try:
            while data := up.recv(65536):
                client.sendall(data)
        except OSError:
            pass
        finally:  # the server closed (idle keep-alive): so does the client's side
            with contextlib.suppress(OSError):
                client.shutdown(socket.SHUT_RDWR)


# ------------------------------------------------------------------------- webhook receiver


class WebhookReceiver:
    """A Slack-style receiver on 127.0.0.1: answers at once, or (``drip``) sends its headers and
    then one body byte a second."""

    def __init__(self) -> None:
        receiver = self
        self.drip = False
        self.requests: list[dict[str, Any]] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                t0 = time.monotonic()
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                drip = receiver.drip
                try:
                    title = json.loads(raw)["blocks"][0]["text"]["text"]
                except (ValueError, KeyError, IndexError, TypeError):
                    title = "?"
                body = b"o" * DRIP_BYTES if drip else b"ok"
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    if drip:
                        for b in body:
                            self.wfile.write(bytes([b]))
                            self.wfile.flush()
                            time.sleep(1.0)
                    else:
                        self.wfile.write(body)
                except OSError:
                    pass
                entry = {"title": title, "drip": drip, "seconds": time.monotonic() - t0}
                if len(receiver.requests) < 10_000:
                    receiver.requests.append(entry)

        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}/services/T0/B0/chaos"
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


# -------------------------------------------------------------------------------- schedule


@dataclass(frozen=True)
class Fault:
    kind: str
    step: int
    span: int
    carrier: int | None
    """The step of the zeroed wake that gives a disk-full or drip window something to do."""

    @property
    def steps(self) -> range:
        return range(self.step, self.step + self.span)


def make_schedule(steps: int, seed: int) -> list[Fault]:
    """Seeded fault steps: each kind ``max(at least, round(rate * steps))`` times, windows never
    overlapping (``GAP`` healthy steps between, one more before a wake fault, whose setup is at
    the previous step's sleep), none in the first 20 steps (the guard's warm-up) nor across a
    memory reading (a full disk must not meet the output)."""
    rng = random.Random(seed)
    wanted = [
        k
        for k, (rate, least, _, _) in KINDS.items()
        for _ in range(max(least, round(rate * steps)))
    ]
    rng.shuffle(wanted)
    taken: list[tuple[int, int]] = []
    faults = []
    for kind in wanted:
        _, _, span, carrier = KINDS[kind]
        for _ in range(10_000):
            s = rng.randrange(20, max(21, steps - span - 2))
            lo, hi = s - 1 - GAP, s + span + GAP
            if any(lo < b and a < hi for a, b in taken):
                continue
            if (s // EVERY) != ((s + span) // EVERY) or (s + span) % EVERY == 0:
                continue
            taken.append((s - 1, s + span))
            carrier_step = s + carrier if carrier is not None else None
            faults.append(Fault(kind, s, span, carrier_step))
            break
        else:
            raise SystemExit(f"cannot place {len(wanted)} faults in {steps} steps; use more steps")
    return sorted(faults, key=lambda f: f.step)


# --------------------------------------------------------------------------------- trainer


@dataclass
class Tally:
    """What the loop saw: updates, poisoned updates, exceptions, scoring failures."""

    updates: int = 0
    skipped: int = 0
    poisoned: list[tuple[int, str]] = field(default_factory=list)
    exceptions: list[tuple[int, str, str]] = field(default_factory=list)
    score_failures: Counter[str] = field(default_factory=Counter)
    score_failure_steps: list[int] = field(default_factory=list)
    halts: list[tuple[int, str]] = field(default_factory=list)

    def merge(self, other: dict[str, Any]) -> None:
        self.updates += other["updates"]
        self.skipped += other["skipped"]
        self.poisoned += [tuple(p) for p in other["poisoned"]]
        self.exceptions += [tuple(e) for e in other["exceptions"]]
        self.score_failures.update(other["score_failures"])
        self.score_failure_steps += other["score_failure_steps"]
        self.halts += [tuple(h) for h in other["halts"]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "updates": self.updates,
            "skipped": self.skipped,
            "poisoned": self.poisoned[:50],
            "exceptions": self.exceptions[:50],
            "score_failures": dict(self.score_failures),
            "score_failure_steps": self.score_failure_steps[:500],
            "halts": self.halts[:50],
        }


class Trainer:
    """One rank's loop: the student, its optimizer, the teacher client, the guard, the healthy
    reference teacher (in process, never slept) and the injector's view of the served weights."""

    def __init__(
        self,
        *,
        seed: int,
        rank: int,
        teacher: SGLangHTTPTeacher,
        served: TorchTeacher,
        teacher_dir: Path,
        events: Path,
        tally: Tally,
    ) -> None:
        self.seed, self.rank = seed, rank
        self.teacher, self.served = teacher, served
        self.reference = TorchTeacher.from_pretrained(teacher_dir, enable_memory_saver=False)
        self.checkpoint = {
            n: p.detach().clone() for n, p in self.reference.model.named_parameters()
        }
        self.events = events
        self.tally = tally
        self.pool = prompt_pool(seed)
        self.student = make_student()
        self.opt = torch.optim.AdamW(self.student.parameters(), lr=LR, weight_decay=0.0)
        self.guard: Any = None
        self.step_seconds = 0.0

    # -- the package's calls, each counted if it raises ------------------------------------

    def call(self, step: int, name: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - what the benchmark counts
            tb = traceback.format_exc(limit=4).replace("\n", " | ")
            if len(self.tally.exceptions) < 200:
                self.tally.exceptions.append((step, name, f"{type(exc).__name__}: {exc} [{tb}]"))
            return None

    def new_guard(self, step: int, state: dict | None = None, *, keep_halt: bool = True) -> None:
        self.guard = self.call(
            step, "build_guard", make_guard, self.teacher, self.events, self.rank
        )
        if self.guard is not None and state is not None:
            self.call(
                step, "load_state_dict", self.guard.load_state_dict, state, keep_halt=keep_halt
            )

    def close_guard(self, step: int) -> None:
        if self.guard is not None:
            self.call(step, "close", self.guard.close)

    @property
    def halted(self) -> bool:
        return bool(self.guard is not None and self.guard.halted)

    # -- checkpoints ---------------------------------------------------------------------

    def save(self, path: Path, next_step: int) -> None:
        guard_state = self.call(next_step, "state_dict", self.guard.state_dict)
        state = {
            "student": self.student.state_dict(),
            "opt": self.opt.state_dict(),
            "guard": guard_state,
            "step": next_step,
        }
        torch.save(state, path)

    def load(self, path: Path) -> dict[str, Any]:
        state = torch.load(path, weights_only=False)
        self.student.load_state_dict(state["student"])
        self.opt.load_state_dict(state["opt"])
        return state

    # -- ground truth --------------------------------------------------------------------

    def served_intact(self) -> bool:
        """The injector's look at the served teacher's weights: the checkpoint's, exactly."""
        params = dict(self.served.model.named_parameters())
        return all(torch.equal(params[n], t) for n, t in self.checkpoint.items())

    def differs(self, seqs: list[list[int]], start: int, rows: list[tuple]) -> str | None:
        """Whether the consumed scores stray from the healthy teacher's on the same sequences."""
        ref = self.reference.score(seqs, top_k=TOP_K, logprob_start_len=start)
        assert ref.topk_logprobs is not None
        worst = 0.0
        for b, (top, tok) in enumerate(rows):
            n = top.shape[0]
            worst = max(worst, float((top - ref.topk_logprobs[b][-n:]).abs().max()))
            worst = max(worst, float((tok - ref.token_logprobs[b][-n:]).abs().max()))
        return f"max |consumed - healthy| = {worst:.3g}" if worst > POISON_TOL else None

    # -- one step ------------------------------------------------------------------------

    def step(self, step: int, before_sleep: Any = None) -> bool:
        """One colocated OPD step as the demo's guarded arm runs it; True if the guard halted."""
        guard = self.guard
        t0 = time.perf_counter()
        gen = torch.Generator().manual_seed((self.seed * 1_000_003 + step) * 7 + self.rank)
        self.call(step, "wake", guard.wake, step)  # the demo acts on a halt here, nothing else
        if self.halted:
            return True
        index = torch.randint(POOL, (BATCH,), generator=gen).tolist()
        prompts = [self.pool[i] for i in index]
        with torch.no_grad():
            rollout = sample_responses(self.student, prompts, NEW_TOKENS, 1.0, gen)
        responses = rollout.responses
        seqs = [p + r for p, r in zip(prompts, responses)]
        start = min(len(p) for p in prompts) - 1
        trained = False
        try:
            scores = self.teacher.score(seqs, top_k=TOP_K, logprob_start_len=start)
        except TeacherError as exc:  # the client's documented answer: no scores, no update
            self.tally.score_failures[type(exc).__name__] += 1
            if len(self.tally.score_failure_steps) < 500:
                self.tally.score_failure_steps.append(step)
            scores = None
        except Exception as exc:  # noqa: BLE001 - anything else escaped the adapter
            self.tally.exceptions.append((step, "teacher.score", f"{type(exc).__name__}: {exc}"))
            scores = None
        if scores is not None:
            intact = self.served_intact()
            trained = self._train(step, prompts, rollout, seqs, start, scores, intact)
            if self.halted:
                return True
        if not trained:
            self.tally.skipped += 1
            self.call(step, "summary.add_skipped_update", guard.summary.add_skipped_update)
        if before_sleep is not None:
            before_sleep()
        self.call(step, "sleep", guard.sleep, step)
        self.step_seconds = time.perf_counter() - t0
        return self.halted

    def _train(self, step, prompts, rollout, seqs, start, scores, intact) -> bool:
        """Score-check, loss, the update if the decision allows it, the step's metrics."""
        guard = self.guard
        responses = rollout.responses
        logits, mask = response_logits(self.student, prompts, responses)
        t_max = mask.shape[1]
        ids = torch.zeros(BATCH, t_max, TOP_K, dtype=torch.long)
        lps = torch.zeros(BATCH, t_max, TOP_K)
        tok = torch.zeros(BATCH, t_max)
        rows = []
        for b, r in enumerate(responses):
            n = len(r)
            ids[b, :n] = scores.topk_ids[b][-n:]
            lps[b, :n] = scores.topk_logprobs[b][-n:].float()
            tok[b, :n] = scores.token_logprobs[b][-n:].float()
            rows.append((lps[b, :n].clone(), tok[b, :n].clone()))
        sampled = torch.tensor([r + [PAD] * (t_max - len(r)) for r in responses])
        sample = torch.arange(BATCH)[:, None].expand_as(mask)
        decision = self.call(
            step,
            "on_teacher_scores",
            guard.on_teacher_scores,
            step,
            token_logprobs=tok[mask],
            topk_logprobs=lps[mask],
            topk_ids=ids[mask],
            token_ids=sampled[mask],
            sample_index=sample[mask],
        )
        if self.halted:
            return False
        trained = decision is not None and not decision.acts
        _, loss = jsd_topk_tail_loss(logits[mask], ids[mask], lps[mask], 0.5)
        self.opt.zero_grad()
        if trained:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.student.parameters(), 1.0)
            self.opt.step()
            self.tally.updates += 1
            why = self.differs(seqs, start, rows)
            if why is None and not intact:
                why = "taken while the served weights were not the checkpoint's"
            if why is not None and len(self.tally.poisoned) < 200:
                self.tally.poisoned.append((step, why))
        stats = student_stats(logits.detach(), mask, rollout, EOS)
        metrics = {
            "loss": loss.item(),
            "student_entropy": stats["student_entropy"],
            "teacher_logprob": float(tok[mask].mean()),
        }
        self.call(step, "on_step_metrics", guard.on_step_metrics, step, metrics)
        return trained


# ------------------------------------------------------------------------ 2-rank segments


def _rank_main(rank: int, port: int, job: dict[str, Any]) -> None:
    """One rank of a rank-death segment (a spawned process): steps ``start`` and ``start + 1``
    from the supervisor's checkpoint; rank 1 dies before its second wake."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    captured = quiet_logs()
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    import transformers

    transformers.utils.logging.disable_progress_bar()
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=30),
    )
    from distill_guard.consensus import attach

    tally = Tally()
    start = job["start"]
    result: dict[str, Any] = {"rank": rank, "halted_at": None}
    with reference_teacher(job["teacher_dir"], enable_cpu_backup=True) as (url, served):
        teacher = http_teacher(url)
        trainer = Trainer(
            seed=job["seed"],
            rank=rank,
            teacher=teacher,
            served=served,
            teacher_dir=Path(job["teacher_dir"]),
            events=Path(job["events"]),
            tally=tally,
        )
        state = trainer.load(Path(job["checkpoint"]))
        trainer.new_guard(start)
        trainer.call(
            start, "consensus.attach", attach, trainer.guard, timeout_s=CONSENSUS_TIMEOUT_S
        )
        trainer.call(start, "load_state_dict", trainer.guard.load_state_dict, state["guard"])
        trainer.call(start, "sleep", trainer.guard.sleep, start - 1)  # the launch sleep
        for step in (start, start + 1):
            if rank == 1 and step == start + 1:
                os._exit(3)  # the process is gone: no exception, no goodbye
            t0 = time.perf_counter()
            if trainer.step(step):
                result["halted_at"] = step
                result["halt_seconds"] = time.perf_counter() - t0
                tally.halts.append((step, trainer.guard.halt.message[:300]))
                trainer.save(Path(job["out"]), step + 1)
                break
        trainer.close_guard(start + 1)
        result["tally"] = tally.to_dict()
        result["log_levels"] = dict(captured.levels)
    Path(job["result"]).write_text(json.dumps(result))
    os._exit(0)  # a process group with a dead peer cannot be torn down politely


def run_segment(job: dict[str, Any], timeout_s: float = 180.0) -> tuple[list[int | None], float]:
    ctx = multiprocessing.get_context("spawn")
    port = free_port()
    t0 = time.monotonic()
    procs = [ctx.Process(target=_rank_main, args=(r, port, job), daemon=True) for r in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(max(1.0, timeout_s - (time.monotonic() - t0)))
    codes = [p.exitcode for p in procs]
    for p in procs:
        if p.exitcode is None:
            p.kill()
            p.join()
    return codes, time.monotonic() - t0


# ------------------------------------------------------------------------------ supervisor


class Soak:
    """One seed: the served teacher behind the fault proxy, the webhook receiver, the trainer,
    the schedule, and the supervisor that restarts the loop after a halt."""

    def __init__(self, seed: int, steps: int, root: Path, captured: Captured) -> None:
        self.seed, self.steps, self.root = seed, steps, root
        self.captured = captured
        self.schedule = make_schedule(steps, seed)
        self.at = {f.step: f for f in self.schedule}
        self.carriers = {f.carrier: f for f in self.schedule if f.carrier is not None}
        self.events = root / "events.jsonl"
        self.teacher_dir = build_teacher(root)
        self.tally = Tally()
        self.fired: dict[Fault, dict[str, Any]] = {}
        self.restarts: list[dict[str, Any]] = []
        self.memory: list[tuple[int, float, int]] = []
        self.block: list[tuple[int, float, float]] = []
        self.lost_wakes: list[int] = []
        self.window_max: dict[Fault, float] = {}
        self.hard_fsize = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
        self.disk_full = False
        self.now = -1

    # -- the injector --------------------------------------------------------------------

    def _watch_region(self, served: TorchTeacher) -> None:
        """Note each wake that found no CPU backup (the weights came back zeroed or garbage)."""
        region = served._region
        resume = region.resume

        def watched() -> None:
            lost = region._backup is None
            resume()
            if lost:
                self.lost_wakes.append(self.now)

        region.resume = watched

    def _lose_weights_at_next_wake(self, served: TorchTeacher, garbage: bool) -> None:
        served._region._cpu_backup = False
        served._region._fault = "garbage" if garbage else "zeros"

    def _keep_weights(self, served: TorchTeacher) -> None:
        served._region._cpu_backup = True
        served._region._fault = "zeros"

    def _fill_disk(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        size = self.events.stat().st_size if self.events.exists() else 0
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, self.hard_fsize))
        self.disk_full = True

    def _free_disk(self) -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (self.hard_fsize, self.hard_fsize))
        self.disk_full = False

    # -- the run -------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        t_start = time.perf_counter()
        self.receiver = WebhookReceiver()
        os.environ[WEBHOOK_ENV] = self.receiver.url
        with reference_teacher(self.teacher_dir, enable_cpu_backup=True) as (url, served):
            self.served = served
            self._watch_region(served)
            self.proxy = FaultProxy(url)
            teacher = http_teacher(self.proxy.url)
            self.trainer = Trainer(
                seed=self.seed,
                rank=0,
                teacher=teacher,
                served=served,
                teacher_dir=self.teacher_dir,
                events=self.events,
                tally=self.tally,
            )
            self.trainer.new_guard(0)
            self.trainer.call(-1, "sleep", self.trainer.guard.sleep, -1)  # the launch sleep
            self._loop()
            self.trainer.close_guard(self.steps)
            self.proxy.close()
            teacher.close()
        self.receiver.close()
        os.environ.pop(WEBHOOK_ENV, None)
        return self._result(time.perf_counter() - t_start)

    def _loop(self) -> None:
        t_block, step = time.perf_counter(), 0
        block_max = 0.0
        while step < self.steps:
            self.now = step
            fault = self.at.get(step)
            if fault is not None and fault.kind == "rank_death":
                step = self._rank_death(fault)
                continue
            self._before_wake(step)
            halted = self.trainer.step(step, before_sleep=lambda s=step: self._before_sleep(s))
            self._after_sleep(step)
            block_max = max(block_max, self.trainer.step_seconds)
            for f in self._windows(step):
                self.window_max[f] = max(self.window_max.get(f, 0.0), self.trainer.step_seconds)
            if halted:
                self._restart_after_halt(step)
            step += 1
            if step % EVERY == 0 or step == self.steps:
                now = time.perf_counter()
                done = step - (self.block[-1][0] if self.block else 0)
                self.block.append((step, (now - t_block) / max(done, 1), block_max))
                self.memory.append((step, rss_mib(), threading.active_count()))
                PROGRESS.say(
                    f"# seed {self.seed} step {step} of {self.steps}: rss "
                    f"{self.memory[-1][1]:.1f} MiB, {self.block[-1][1] * 1000:.1f} ms/step"
                )
                t_block, block_max = now, 0.0

    def _windows(self, step: int) -> list[Fault]:
        return [f for f in self.schedule if step in f.steps]

    def _before_wake(self, step: int) -> None:
        fault = self.at.get(step)
        if fault is None:
            return
        if fault.kind in ("hang", "http_500", "reset"):
            self.proxy.mode = fault.kind
            self.fired[fault] = {"faulted_before": self.proxy.faulted[fault.kind]}
        elif fault.kind == "disk_full":
            self._fill_disk()
            self.fired[fault] = {"limit": self.events.stat().st_size, "filled": time.time()}
        elif fault.kind == "webhook_drip":
            self.receiver.drip = True
            self.fired[fault] = {}

    def _before_sleep(self, step: int) -> None:
        """The release at this step's sleep drops the weights when the next step's wake is a
        zeroed or garbage fault (or a window's carrier)."""
        self._keep_weights(self.served)
        nxt = self.at.get(step + 1)
        if nxt is not None and nxt.kind in ("zeroed_wake", "garbage_wake"):
            self._lose_weights_at_next_wake(self.served, nxt.kind == "garbage_wake")
        elif step + 1 in self.carriers:
            self._lose_weights_at_next_wake(self.served, False)

    def _after_sleep(self, step: int) -> None:
        fault = self.at.get(step)
        if fault is not None and fault.kind in ("zeroed_wake", "garbage_wake"):
            self.fired[fault] = {"lost": step in self.lost_wakes}
        if step in self.carriers:
            parent = self.carriers[step]
            self.fired.setdefault(parent, {})["carrier_lost"] = step in self.lost_wakes
        for f in self._windows(step):
            if step != f.steps[-1]:
                continue
            if f.kind in ("hang", "http_500", "reset"):
                self.proxy.mode = "pass"
                n = self.proxy.faulted[f.kind] - self.fired[f]["faulted_before"]
                self.fired[f]["faulted_requests"] = n
            elif f.kind == "disk_full":
                self._free_disk()
                self.fired[f]["freed"] = time.time()
            elif f.kind == "webhook_drip":
                self.receiver.drip = False

    def _restart_after_halt(self, step: int) -> None:
        """A halt in the main process: checkpoint, close, a fresh guard from the checkpoint with
        the halt lifted, as a supervisor would restart the run."""
        if self.disk_full:
            self._free_disk()
        trainer = self.trainer
        halt = trainer.guard.halt
        self.tally.halts.append((step, halt.message[:300] if halt else "?"))
        path = self.root / f"halt_{step}.pt"
        trainer.save(path, step + 1)
        if trainer.teacher.asleep:  # as the demo's arm leaves its teacher at a halt
            trainer.call(step, "teacher.resume", trainer.teacher.resume)
        trainer.close_guard(step)
        state = trainer.load(path)
        trainer.new_guard(step + 1, state["guard"], keep_halt=False)
        self.restarts.append(
            {"step": step, "why": "halt", "message": halt.message[:200] if halt else ""}
        )

    def _rank_death(self, fault: Fault) -> int:
        """Steps ``fault.step`` and the next as a 2-rank gloo segment where rank 1 dies; resume
        single-process from rank 0's halt checkpoint with a fresh guard."""
        s = fault.step
        trainer = self.trainer
        ckpt_in, ckpt_out = self.root / f"seg_{s}_in.pt", self.root / f"seg_{s}_out.pt"
        result_path = self.root / f"seg_{s}_rank0.json"
        trainer.save(ckpt_in, s)
        trainer.close_guard(s)
        job = {
            "start": s,
            "seed": self.seed,
            "teacher_dir": str(self.teacher_dir),
            "events": str(self.events),
            "checkpoint": str(ckpt_in),
            "out": str(ckpt_out),
            "result": str(result_path),
        }
        codes, seconds = run_segment(job)
        info: dict[str, Any] = {"exit_codes": codes, "seconds": round(seconds, 1)}
        resume_at, state = s, None
        if result_path.exists():
            result = json.loads(result_path.read_text())
            self.tally.merge(result["tally"])
            info["halted_at"] = result["halted_at"]
            info["halt_seconds"] = result.get("halt_seconds")
        if ckpt_out.exists():
            state = trainer.load(ckpt_out)
            resume_at = state["step"]
        else:  # rank 0 did not halt: carry on from the segment's input checkpoint
            state = trainer.load(ckpt_in)
            resume_at = s + 2
        self.fired[fault] = info
        trainer.new_guard(resume_at, state["guard"], keep_halt=False)
        self.restarts.append({"step": s, "why": "rank_death", **info})
        return resume_at

    # -- the verdict ---------------------------------------------------------------------

    def _result(self, seconds: float) -> dict[str, Any]:
        events = self._events = read_events(self.events)
        by_step: dict[int, list[dict]] = {}
        for e in events:
            if isinstance(e.get("step"), int):
                by_step.setdefault(e["step"], []).append(e)
        rows: dict[str, Counter] = {k: Counter() for k in KINDS}
        missing: list[dict[str, Any]] = []
        faults: list[dict[str, Any]] = []
        for f in self.schedule:
            info = self.fired.get(f, {})
            injected = self._injected(f, info)
            row = rows[f.kind]
            row["scheduled"] += 1
            if not injected:
                continue
            row["injected"] += 1
            ok, why = self._recorded(f, info, by_step)
            safe = {k: v for k, v in info.items() if k not in ("filled", "freed")}
            faults.append({"kind": f.kind, "step": f.step, "recorded": ok, **safe})
            if ok:
                row["recorded"] += 1
            else:
                row["missing"] += 1
                missing.append({"kind": f.kind, "step": f.step, "why": why})
            if f.kind == "webhook_drip" and self.window_max.get(f, 0.0) >= WAITED_S:
                row["waited"] += 1
        poisoned_by: Counter[str] = Counter()
        for step, _ in self.tally.poisoned:
            hit = [f for f in self.schedule if f.step - 1 <= step <= f.step + f.span + 1]
            poisoned_by[hit[0].kind if hit else "healthy steps"] += 1
        in_fault = {s for f in self.schedule for s in f.steps}
        unexplained = {
            "scoring_failed": sorted(
                s for s in self.tally.score_failure_steps if s not in in_fault
            ),
            "teacher_unreachable": sorted(
                {
                    e["step"]
                    for e in events
                    if e.get("code") == "teacher.unreachable"
                    and isinstance(e.get("step"), int)
                    and e["step"] not in in_fault
                }
            ),
            "restarted_at": [r["step"] for r in self.restarts],
        }
        first = self.memory[0][1] if self.memory else float("nan")
        last = self.memory[-1][1] if self.memory else float("nan")
        dripped = [r for r in self.receiver.requests if r["drip"]]
        return {
            "seed": self.seed,
            "steps": self.steps,
            "seconds": round(seconds, 1),
            "rows": {k: dict(v) for k, v in rows.items()},
            "missing": missing,
            "faults": faults,
            "outside_faults": unexplained,
            "poisoned_by": dict(poisoned_by),
            "tally": self.tally.to_dict(),
            "restarts": self.restarts,
            "memory": self.memory,
            "blocks": self.block,
            "rss_ratio": last / first,
            "events": len(events),
            "event_kinds": dict(Counter(e["kind"] for e in events)),
            "lost_reports": self.captured.lost_reports,
            "log_levels": dict(self.captured.levels),
            "webhook": {
                "requests": len(self.receiver.requests),
                "dripped": len(dripped),
                "longest_dripped_s": round(max((r["seconds"] for r in dripped), default=0.0), 1),
                "alert_failed_records": sum(1 for e in events if e["kind"] == "alert_failed"),
            },
            "drip_window_max_step_s": round(
                max((v for f, v in self.window_max.items() if f.kind == "webhook_drip"), default=0),
                3,
            ),
        }

    def _disk_recorded(self, f: Fault, info: dict) -> tuple[bool, str]:
        """An ``events_lost`` record written once the disk freed (before the next fill), else
        the event log's report of lost events at close."""
        fills = sorted(i["filled"] for g, i in self.fired.items() if g.kind == "disk_full")
        until = next((t for t in fills if t > info["filled"]), math.inf)
        lost = [
            e
            for e in self._events
            if e["kind"] == "events_lost" and info["filled"] <= e["time"] < until
        ]
        if lost:
            info["events_lost"] = sum(int(e.get("count", 0)) for e in lost)
            return True, ""
        reports = [n for n, path in self.captured.lost_reports if Path(path) == self.events]
        if any(n > 0 for n in reports):
            info["reported_at_close"] = max(reports)
            return True, ""
        return False, "no events_lost record and no report of lost events"

    def _injected(self, f: Fault, info: dict[str, Any]) -> bool:
        if f.kind in ("zeroed_wake", "garbage_wake"):
            return bool(info.get("lost"))
        if f.kind in ("hang", "http_500", "reset"):
            return info.get("faulted_requests", 0) > 0
        if f.kind == "rank_death":
            return info.get("exit_codes", [None, None])[1] == 3
        if f.kind == "disk_full":
            return "limit" in info
        return f in self.fired  # webhook_drip

    def _recorded(self, f: Fault, info: dict, by_step: dict) -> tuple[bool, str]:
        near = [e for s in range(f.step, f.step + f.span + 2) for e in by_step.get(s, [])]
        if f.kind in ("zeroed_wake", "garbage_wake"):
            at = [e for s in (f.step, f.step + 1) for e in by_step.get(s, [])]
            teacher = [
                e
                for e in at
                if e["kind"] == "finding"
                and str(e.get("code", "")).startswith("teacher.")
                and e.get("severity") == "critical"
            ]
            repair = [e for e in at if str(e["kind"]).startswith("repair")]
            if teacher and repair:
                return True, ""
            return False, f"finding {len(teacher)}, repair records {len(repair)}"
        if f.kind in ("hang", "http_500", "reset"):
            words = {
                "hang": ("no answer within",),
                "http_500": ("http 500",),
                "reset": ("disconnected", "connection reset", "connection closed"),
            }[f.kind]
            hits = [
                e
                for e in by_step.get(f.step, [])
                if e["kind"] == "finding"
                and e.get("code") == "teacher.unreachable"
                and any(w in str(e.get("message", "")).lower() for w in words)
            ]
            return bool(hits), "" if hits else "no teacher.unreachable naming it"
        if f.kind == "rank_death":
            halts = [
                e
                for e in near
                if e["kind"] == "halt" and "could not agree" in str(e.get("message"))
            ]
            return bool(halts), "" if halts else "no halt record from rank 0"
        if f.kind == "disk_full":
            return self._disk_recorded(f, info)
        # webhook_drip: the carrier's alert is in the file
        alerts = [e for e in by_step.get(f.carrier, []) if e["kind"] == "alert"]
        return bool(alerts), "" if alerts else "no alert record at the carrier"


# ---------------------------------------------------------------------------------- output


def print_seed(r: dict[str, Any]) -> None:
    t = r["tally"]
    print(f"\n## seed {r['seed']}: {r['steps']} steps in {r['seconds']:.0f} s")
    print(f"{'fault':<14} {'sched':>5} {'inj':>4} {'rec':>4} {'miss':>4}  recorded means")
    for kind, row in r["rows"].items():
        note = RECORD_RULE[kind]
        if kind == "webhook_drip":
            note += f"; steps that waited: {row.get('waited', 0)}"
        print(
            f"{kind:<14} {row.get('scheduled', 0):>5} {row.get('injected', 0):>4} "
            f"{row.get('recorded', 0):>4} {row.get('missing', 0):>4}  {note}"
        )
    print(
        f"updates {t['updates']}, skipped {t['skipped']}, poisoned {len(t['poisoned'])}, "
        f"exceptions into the loop {len(t['exceptions'])}, scoring calls failed (TeacherError) "
        f"{sum(t['score_failures'].values())}, halts {len(t['halts'])}, restarts {len(r['restarts'])}"
    )
    for p in t["poisoned"][:5]:
        print(f"  poisoned at step {p[0]}: {p[1]}")
    for e in t["exceptions"][:5]:
        print(f"  exception at step {e[0]} in {e[1]}: {e[2][:300]}")
    u = r["outside_faults"]
    print(
        f"outside the injected faults: scoring failed at steps {u['scoring_failed'][:12]}, "
        f"teacher.unreachable recorded at steps {u['teacher_unreachable'][:12]} (restarts at "
        f"{u['restarted_at']})"
    )
    for m in r["missing"][:8]:
        print(f"  missing record: {m['kind']} @{m['step']}: {m['why']}")
    for rs in r["restarts"]:
        extra = {k: v for k, v in rs.items() if k not in ("step", "why")}
        print(f"  restart @{rs['step']} ({rs['why']}): {extra}")
    w = r["webhook"]
    print(
        f"webhook: {w['requests']} alerts received, {w['dripped']} of them dripped (held at most "
        f"{w['longest_dripped_s']} s before the sender hung up; its timeout "
        f"{WEBHOOK_TIMEOUT_S:g} s), alert_failed records {w['alert_failed_records']}; slowest "
        f"step in a drip window {r['drip_window_max_step_s']} s"
    )
    disk = [
        f"@{f['step']}: {f.get('events_lost', '-')} lost (events_lost record)"
        if "events_lost" in f
        else f"@{f['step']}: {f.get('reported_at_close', '-')} reported at close"
        for f in r["faults"]
        if f["kind"] == "disk_full"
    ]
    print(f"full disk: {'; '.join(disk) or '-'}; events in the file: {r['events']}")
    print(f"{'step':>6} {'rss MiB':>8} {'threads':>7} {'ms/step':>8} {'max step s':>10}")
    for (step, rss, threads), (_, per, mx) in zip(r["memory"], r["blocks"]):
        print(f"{step:>6} {rss:>8.1f} {threads:>7} {per * 1000:>8.1f} {mx:>10.2f}")
    print(f"rss last/first: {r['rss_ratio']:.3f}")


def verdict(r: dict[str, Any]) -> tuple[bool, str]:
    t = r["tally"]
    injected = sum(row.get("injected", 0) for row in r["rows"].values())
    recorded = sum(row.get("recorded", 0) for row in r["rows"].values())
    waited = r["rows"]["webhook_drip"].get("waited", 0)
    flat = r["rss_ratio"] <= FLAT
    ok = not t["poisoned"] and not t["exceptions"] and recorded == injected and waited == 0 and flat
    line = (
        f"seed {r['seed']}: poisoned {len(t['poisoned'])}, exceptions {len(t['exceptions'])}, "
        f"recorded {recorded}/{injected}, drip waits {waited}, rss last/first "
        f"{r['rss_ratio']:.3f}{'' if flat else ' (grew)'}, {r['seconds']:.0f} s"
    )
    return ok, line


PROGRESS = Progress.for_command()
"""Each block's step, memory and speed, on stderr to a terminal only (the results say them too)."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, nargs="+", default=[0])
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument(
        "--preset",
        default="default",
        help="the guard's preset; monitor_only shows the ground truth counting poisoned updates",
    )
    ap.add_argument("--keep", type=Path, default=None, help="keep each seed's files here")
    args = ap.parse_args()
    global PRESET
    PRESET = os.environ["CHAOS_SOAK_PRESET"] = args.preset
    torch.set_num_threads(1)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    captured = quiet_logs()
    import transformers

    transformers.utils.logging.disable_progress_bar()
    print(f"# {platform.platform()}, torch {torch.__version__}, 1 thread, {os.cpu_count()} cores")
    print(
        f"# {args.steps} steps per seed; V={V}, batch {BATCH} x {NEW_TOKENS} new tokens, top-{TOP_K};"
        f" client timeout {TIMEOUT_S} s; guard preset {PRESET}; faults {', '.join(KINDS)}"
    )
    results, lines, passed = [], [], True
    digest = source_digest()
    print(f"# source {digest} (distill_guard/ and examples/sdpo_sciknoweval/)")
    for seed in args.seed:
        captured.lost_reports.clear()
        captured.levels.clear()
        with contextlib.ExitStack() as stack:
            if args.keep is None:
                tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="chaos_soak_")))
            else:
                tmp = args.keep / f"seed{seed}"
                tmp.mkdir(parents=True, exist_ok=True)
                (tmp / "events.jsonl").unlink(missing_ok=True)
            result = Soak(seed, args.steps, tmp, captured).run()
        result["source_changed"] = source_digest() != digest
        print_seed(result)
        ok, line = verdict(result)
        if result["source_changed"]:
            ok, line = False, line + " -- INVALID: the package's source changed during this seed"
            digest = source_digest()
        passed &= ok
        lines.append(("PASS " if ok else "FAIL ") + line)
        results.append(result)
    print()
    for line in lines:
        print(line)
    print(
        f"chaos soak: {'PASS' if passed else 'FAIL'} at seeds {args.seed} ({args.steps} steps each)"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
