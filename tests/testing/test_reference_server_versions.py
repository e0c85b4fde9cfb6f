"""The reference server against SGLang's version table: a test per row of
``docs/sglang-contract.md`` §7.2 (:data:`~distill_guard.teachers.sglang_versions.FACTS`).

Each row's test runs on one version per run of bands over which the row (with the rows it
needs) keeps its value, and asserts over real loopback HTTP what the row says SGLang does there
(a run whose value an earlier run already had, as harmless again after a band that kills, is
marked slow: ``make test-all``).
Where the row says "kills", the server must be gone afterwards: one that lives on fails.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from distill_guard.teachers import TorchTeacher
from distill_guard.teachers.capabilities import Capabilities, capabilities_for, parse_version
from distill_guard.teachers.sglang_versions import (
    FACT_BY_NAME,
    FACTS,
    Checksum,
    IdleCheck,
    Outcome,
    Pause,
    Version,
    bands,
)
from distill_guard.testing.reference_server import ReferenceServer, serve_in_thread
from distill_guard.testing.reference_server.scheduler import UNLIMITED, Phase
from distill_guard.testing.tiny import build_tiny_qwen3

LATENCY = 0.25
SCORE = {
    "input_ids": list(range(3, 20)),
    "sampling_params": {"max_new_tokens": 0},
    "return_logprob": True,
    "logprob_start_len": 0,
}
FLUSHED = (
    "Cache flushed.\nPlease check backend logs for more details. (When there are running "
    "or waiting requests, the operation will not be performed.)\n"
)
PAUSED = {"message": "Generation paused successfully.", "status": "ok"}
CONTINUED = {"message": "Generation continued successfully.", "status": "ok"}
COUNTS_WAITING = {IdleCheck.NO_REQUEST_WITH_WAITING, IdleCheck.FULLY_IDLE_WITH_WAITING}
"""The checks a waiting request fails, the engine not paused (plus FULLY_IDLE_UNLESS_PAUSED)."""


# -- versions ---------------------------------------------------------------------------------


def _text(v: Version) -> str:
    return ".".join(map(str, v))


def representatives(*names: str, where: Callable[[Capabilities], bool] | None = None) -> list[str]:
    """The first version of each run of bands over which the facts ``names`` keep their
    values (bands whose capabilities fail ``where`` left out)."""
    runs: list[tuple[tuple[Any, ...], str]] = []
    for first, _ in bands():
        if where is not None and not where(capabilities_for(_text(first))):
            continue
        key = tuple(FACT_BY_NAME[n].value_at(first) for n in names)
        if not runs or runs[-1][0] != key:
            runs.append((key, _text(first)))
    return [v for _, v in runs]


def repeats_slow(versions: list[str], *names: str) -> list[Any]:
    """``versions`` as parameters, a version whose values of ``names`` an earlier one already
    had marked slow (``make test-all``): the same behaviour, through the same code path, again
    (e.g. a row that is harmless, kills over a band, then is harmless again)."""
    seen: set[tuple[Any, ...]] = set()
    params = []
    for v in versions:
        key = tuple(row(n, v) for n in names)
        params.append(pytest.param(v, marks=pytest.mark.slow) if key in seen else v)
        seen.add(key)
    return params


def row(name: str, version: str) -> Any:
    """The table's value of ``name`` on ``version``."""
    v = parse_version(version)
    assert v is not None
    return FACT_BY_NAME[name].value_at(v)


# -- servers and traffic ------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_qwen3(tmp_path_factory.mktemp("versions_tiny"), vocab_size=512)


@pytest.fixture(scope="session")
def newer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Other weights of the same shape (a reload target that can be told apart)."""
    return build_tiny_qwen3(tmp_path_factory.mktemp("versions_newer"), vocab_size=512, seed=7)


@pytest.fixture(scope="session")
def base_model(tiny_dir: Path) -> torch.nn.Module:
    return TorchTeacher.from_pretrained(tiny_dir).model


@dataclass
class Served:
    url: str
    server: ReferenceServer
    teacher: TorchTeacher

    def post(self, path: str, body: Any = None) -> httpx.Response:
        return httpx.post(self.url + path, json=body, timeout=10)

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.url + path, timeout=10)

    def count(self, phase: Phase) -> int:
        with self.server.scheduler.loop:
            return self.server.scheduler.count(phase)

    def stall(self) -> None:
        """Running requests stay running until :meth:`let_run`: a control call sent meanwhile
        finds them running on any machine, however loaded (no window to land in)."""
        self.server.scheduler.stall()

    def let_run(self) -> None:
        self.server.scheduler.let_run()

    def until(self, phase: Phase, n: int = 1, within_s: float = 5.0) -> None:
        """Wait until ``n`` requests are in ``phase``."""
        deadline = time.monotonic() + within_s
        while self.count(phase) != n:
            assert time.monotonic() < deadline, f"never {n} request(s) {phase.name}"
            time.sleep(0.005)

    def alive(self) -> bool:
        return self.server.dead_reason is None and self.get("/get_server_info").status_code == 200


@pytest.fixture
def serve(tiny_dir: Path, base_model: torch.nn.Module) -> Iterator[Callable[..., Served]]:
    """``serve(version, latency_s=0, max_running=UNLIMITED)``: a reference server on loopback
    with its own copy of the tiny model; at the end anything still held or waiting is let go."""
    with contextlib.ExitStack() as stack:

        def _serve(version: str, *, latency_s: float = 0.0, max_running: int = UNLIMITED) -> Served:
            teacher = TorchTeacher(copy.deepcopy(base_model), model_path=tiny_dir)
            server = ReferenceServer(
                teacher, version=version, latency_s=latency_s, max_running_requests=max_running
            )
            url = stack.enter_context(serve_in_thread(server))
            stack.callback(_let_go, server)
            return Served(url, server, teacher)

        yield _serve


def _let_go(server: ReferenceServer) -> None:
    if server.dead_reason is None:
        server.fatal("the test is over")


class Call(threading.Thread):
    """One ``/generate`` (or other POST) in the background."""

    def __init__(self, s: Served, path: str = "/generate", body: Any = SCORE) -> None:
        super().__init__(daemon=True)
        self.url, self.body = s.url + path, body
        self.response: httpx.Response | None = None
        self.start()

    def run(self) -> None:
        with contextlib.suppress(httpx.TransportError):
            self.response = httpx.post(self.url, json=self.body, timeout=10)

    def result(self, within_s: float = 5.0) -> httpx.Response | None:
        self.join(within_s)
        assert not self.is_alive(), f"{self.url} did not answer in {within_s} s"
        return self.response


def finish(r: httpx.Response | None) -> dict[str, Any]:
    assert r is not None and r.status_code == 200, r and r.text
    return r.json()["meta_info"]["finish_reason"]


def assert_killed(r: httpx.Response | None, why: str = "") -> None:
    """The call that killed the server got the dying 500, or no answer at all."""
    if r is not None:
        assert r.status_code == 500 and "scheduler died" in r.text and why in r.text, r.text


def assert_gone(s: Served, within_s: float = 3.0) -> None:
    """Nothing answers on the server's port any more (as after SGLang's kill)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            status = httpx.get(s.url + "/get_server_info", timeout=0.5).status_code
        except httpx.TransportError:
            return
        assert status == 503  # dying: the scheduler is dead, the server not yet down
        time.sleep(0.02)
    raise AssertionError(f"{s.url} still answers {within_s} s after its scheduler died")


# -- the rows ------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", representatives("tags"))
def test_tags(serve, version) -> None:
    """A tagged release acts on its tags only where tags are honoured (0.4.8+); 0.4.7 releases
    everything."""
    s = serve(version)
    assert s.post("/release_memory_occupation", {"tags": ["kv_cache"]}).status_code == 200
    want = {"kv_cache"} if row("tags", version) else set(s.server.caps.memory_tags)
    assert s.teacher.sleep_state.released == want
    assert s.post("/resume_memory_occupation", {"tags": ["kv_cache"]}).status_code == 200
    assert not s.teacher.asleep and s.alive()


@pytest.mark.parametrize("version", representatives("default_tags"))
def test_default_tags(serve, version) -> None:
    """An untagged release acts on the version's defaults (``cuda_graph`` too from 0.5.5), an
    untagged resume wakes them all."""
    s = serve(version)
    assert s.post("/release_memory_occupation", {}).status_code == 200
    assert s.teacher.sleep_state.released == set(row("default_tags", version))
    assert s.post("/resume_memory_occupation", {}).status_code == 200
    assert not s.teacher.asleep and s.alive()


@pytest.mark.parametrize("version", representatives("cuda_graph_tag", where=lambda c: c.tags))
def test_cuda_graph_tag(serve, version) -> None:
    """``cuda_graph`` can be released alone from 0.5.5; before, it names no memory (refused)."""
    s = serve(version)
    r = s.post("/release_memory_occupation", {"tags": ["cuda_graph"]})
    if row("cuda_graph_tag", version):
        assert r.status_code == 200 and s.teacher.sleep_state.released == {"cuda_graph"}
        assert s.post("/resume_memory_occupation", {"tags": ["cuda_graph"]}).status_code == 200
    else:
        assert r.status_code == 400 and "unknown memory tags" in r.text
    assert not s.teacher.asleep and s.alive()


@pytest.mark.parametrize("version", representatives("weights_cpu_backup"))
def test_weights_cpu_backup(serve, version) -> None:
    """``enable_weights_cpu_backup`` is a server argument from 0.5.3 only."""
    info = serve(version).get("/get_server_info").json()
    assert ("enable_weights_cpu_backup" in info) is row("weights_cpu_backup", version)


@pytest.mark.parametrize("version", representatives("server_info"))
def test_server_info(serve, version) -> None:
    """``/server_info``, ``/model_info`` from 0.5.6; ``/get_server_info``, ``/get_model_info``
    on every version."""
    s = serve(version)
    code = 200 if row("server_info", version) else 404
    assert s.get("/server_info").status_code == code == s.get("/model_info").status_code
    assert s.get("/get_server_info").status_code == 200 == s.get("/get_model_info").status_code


def _until(condition: Callable[[], bool], within_s: float = 5.0) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.005)


def _pause_none(s: Served) -> None:
    assert s.post("/pause_generation", {}).status_code == 404
    assert s.post("/continue_generation", {}).status_code == 404


def _pause_abort_all(s: Served) -> None:
    """0.4.9–0.5.5: no body read; waiting requests aborted at once; the call answers before the
    running request's last forward, which still runs and answers "Aborted"."""
    s.stall()
    running = Call(s)
    s.until(Phase.RUNNING)
    waiting = Call(s)
    s.until(Phase.WAITING)
    r = s.post("/pause_generation", {"mode": "retract"})  # not read: an abort all the same
    assert r.status_code == 200 and r.json() == PAUSED
    assert s.count(Phase.RUNNING) == 1  # answered before the running request's forward
    assert finish(waiting.result())["message"] == "Abort before prefill"
    s.let_run()
    aborted = running.result()
    assert finish(aborted)["type"] == "abort" and finish(aborted)["message"] == "Aborted"
    assert len(aborted.json()["meta_info"]["input_token_logprobs"]) == len(SCORE["input_ids"])
    r = s.post("/continue_generation")  # no body needed
    assert r.status_code == 200 and r.json() == CONTINUED
    assert finish(s.post("/generate", SCORE))["type"] == "length"


def _pause_modes(s: Served) -> None:
    """0.5.6+: a body is required, ``mode`` checked; retract applied before it answers; in_place
    freezes; abort (the default) answers once nothing is in flight, the engine not paused."""
    assert s.post("/pause_generation").status_code == 400
    assert s.post("/pause_generation", {"mode": "later"}).status_code == 400
    assert s.post("/continue_generation").status_code == 400
    s.stall()
    first = Call(s)
    s.until(Phase.RUNNING)
    second = Call(s)
    s.until(Phase.WAITING)
    assert s.post("/pause_generation", {"mode": "retract"}).json() == PAUSED
    assert (s.count(Phase.RUNNING), s.count(Phase.WAITING)) == (0, 2)
    assert s.post("/continue_generation").status_code == 400  # no body: still paused
    assert s.count(Phase.WAITING) == 2
    s.let_run()
    assert s.post("/continue_generation", {}).json() == CONTINUED
    assert finish(first.result())["type"] == "length" == finish(second.result())["type"]
    s.stall()
    frozen = Call(s)
    s.until(Phase.RUNNING)
    assert s.post("/pause_generation", {"mode": "in_place"}).status_code == 200
    s.let_run()
    time.sleep(3 * LATENCY + 0.1)
    assert frozen.is_alive() and s.count(Phase.RUNNING) == 1  # no progress while frozen
    assert s.post("/continue_generation", {}).status_code == 200
    assert finish(frozen.result())["type"] == "length"
    s.stall()
    running = Call(s)
    s.until(Phase.RUNNING)
    pause = Call(s, "/pause_generation", {})  # an abort: it answers once nothing is in flight
    _until(lambda: s.server.scheduler.hold)  # the pause is in: the request is aborted running
    assert pause.is_alive()
    s.let_run()
    assert pause.result().json() == PAUSED
    assert s.count(Phase.RUNNING) == 0 and not s.server.scheduler.engine_paused
    assert finish(running.result())["message"] == "Aborted"
    assert s.post("/continue_generation", {}).status_code == 200


@pytest.mark.parametrize("version", representatives("pause"))
def test_pause(serve, version) -> None:
    """``/pause_generation`` per version (none until 0.4.9)."""
    s = serve(version, latency_s=LATENCY, max_running=1)
    {Pause.NONE: _pause_none, Pause.ABORT_ALL: _pause_abort_all, Pause.MODES: _pause_modes}[
        row("pause", version)
    ](s)
    assert s.alive()


@pytest.mark.parametrize("version", representatives("held_while_paused", "pause"))
def test_held_while_paused(serve, version) -> None:
    """A ``/generate`` sent while paused waits for ``/continue_generation``, invisible to the
    flush's and the release's idle checks; with no pause (≤0.4.8) nothing holds it."""
    s = serve(version)
    if not row("held_while_paused", version):
        assert s.post("/pause_generation", {}).status_code == 404
        assert finish(s.post("/generate", SCORE))["type"] == "length"
        return
    assert s.post("/pause_generation", {"mode": "retract"}).status_code == 200
    held = Call(s)
    time.sleep(0.2)
    assert held.is_alive() and s.count(Phase.WAITING) == 0
    assert s.post("/flush_cache").status_code == 200
    assert s.post("/release_memory_occupation", {}).status_code == 200
    assert s.post("/resume_memory_occupation", {}).status_code == 200
    assert held.is_alive()
    assert s.post("/continue_generation", {}).status_code == 200
    assert finish(held.result())["type"] == "length" and s.alive()
    # /health's 1-token generation is held too (§7.6): 503 once SGLang's health timeout
    # passes, the forward never run; let go within it, it runs then and answers 200
    s.server.health_timeout_s = 0.3
    forwards = _counting_forwards(s)
    assert s.post("/pause_generation", {}).status_code == 200
    t0 = time.monotonic()
    assert s.get("/health").status_code == 503 == s.get("/health_generate").status_code
    assert time.monotonic() - t0 >= 0.6 and forwards == [] and s.alive()
    s.server.health_timeout_s = 10.0
    health = threading.Thread(target=lambda: forwards.append(s.get("/health").status_code))
    health.start()
    time.sleep(0.2)
    assert health.is_alive() and forwards == []
    assert s.post("/continue_generation", {}).status_code == 200
    health.join(5)
    assert forwards == ["forward", 200] and s.alive()


def _counting_forwards(s: Served) -> list:
    """The reference server's health forwards, as they run (appended to the list returned)."""
    ran: list = []
    guard = s.server._forward_guard

    def counted(*args, **kw):
        ran.append("forward")
        return guard(*args, **kw)

    s.server._forward_guard = counted
    return ran


@pytest.mark.parametrize("version", representatives("release_check"))
def test_release_check(serve, version) -> None:
    """The release's assert: a waiting request kills where the check counts waiting
    (FULLY_IDLE_UNLESS_PAUSED: unless retract-paused); a running one kills wherever there is
    a check, and where there is none its forward lands on released memory and kills."""
    check = row("release_check", version)
    s = serve(version, max_running=0)  # nothing ever runs: the request stays waiting
    waiting = Call(s)
    s.until(Phase.WAITING)
    if check is IdleCheck.FULLY_IDLE_UNLESS_PAUSED:
        assert s.post("/pause_generation", {"mode": "retract"}).status_code == 200
        assert s.post("/release_memory_occupation", {}).status_code == 200
        assert s.post("/resume_memory_occupation", {}).status_code == 200
        assert s.post("/continue_generation", {}).status_code == 200
    r = s.post("/release_memory_occupation", {})
    if check in COUNTS_WAITING or check is IdleCheck.FULLY_IDLE_UNLESS_PAUSED:
        assert_killed(r, "1 request(s) waiting")
        assert_gone(s)
        assert waiting.result() is None or waiting.result().status_code != 200
    else:
        assert r.status_code == 200 and s.alive()
        assert s.post("/resume_memory_occupation", {}).status_code == 200

    s = serve(version)
    s.stall()
    running = Call(s)
    s.until(Phase.RUNNING)
    r = s.post("/release_memory_occupation", {})
    if check is IdleCheck.NOTHING:
        assert r.status_code == 200
        s.let_run()
        assert_killed(running.result(), "a forward over released memory")
    else:
        assert_killed(r, "1 request(s) running")
    assert_gone(s)


@pytest.mark.parametrize("version", representatives("flush_check"))
def test_flush_check(serve, version) -> None:
    """``/flush_cache`` is refused (400, plain text) while a request runs on every version, and
    while one waits where the check counts waiting; it never kills."""
    check = row("flush_check", version)
    refused = "Flush cache failed.\n" if row("flush_timeout", version) else FLUSHED
    s = serve(version, max_running=0)
    request = Call(s)
    s.until(Phase.WAITING)
    r = s.post("/flush_cache")
    if check in COUNTS_WAITING or check is IdleCheck.FULLY_IDLE_UNLESS_PAUSED:
        assert (r.status_code, r.text) == (400, refused)
    else:
        assert (r.status_code, r.text) == (200, FLUSHED)
    if check is IdleCheck.FULLY_IDLE_UNLESS_PAUSED:  # retract-paused: waiting not counted ...
        assert s.post("/pause_generation", {"mode": "retract"}).status_code == 200
        assert s.post("/flush_cache").status_code == 200
        r = s.post("/flush_cache?timeout=0.1")  # ... except by a flush that waits (answers Q5)
        assert (r.status_code, r.text) == (400, "Timed out waiting for idle state.")
        assert s.post("/continue_generation", {}).status_code == 200
    s.stall()
    s.server.scheduler.set_max_running(1)
    s.until(Phase.RUNNING)
    r = s.post("/flush_cache")
    assert (r.status_code, r.text) == (400, refused)
    s.let_run()
    assert finish(request.result())["type"] == "length"
    assert (s.post("/flush_cache").status_code, s.alive()) == (200, True)


@pytest.mark.parametrize("version", representatives("flush_timeout"))
def test_flush_timeout(serve, version) -> None:
    """``?timeout=S`` waits for idle from 0.5.10 (else 400 "Timed out ..."; a negative S is a
    validation 400); before, the parameter is ignored and a busy server answers 400 at once."""
    s = serve(version, latency_s=LATENCY)
    if not row("flush_timeout", version):
        s.stall()  # refused at once: the request it would wait for still runs
    request = Call(s)
    s.until(Phase.RUNNING)
    r = s.post("/flush_cache?timeout=5")
    if row("flush_timeout", version):
        assert (r.status_code, r.text) == (200, FLUSHED)
        assert s.count(Phase.RUNNING) == 0  # it waited for the running request to finish
        assert request.result() is not None
        s.stall()
        request = Call(s)
        s.until(Phase.RUNNING)
        r = s.post("/flush_cache?timeout=0.05")
        assert (r.status_code, r.text) == (400, "Timed out waiting for idle state.")
        s.let_run()
        request.result()
        r = s.post("/flush_cache?timeout=-1")
        assert r.status_code == 400 and r.json()["code"] == 400  # FastAPI's check, as 400
    else:
        assert (r.status_code, r.text) == (400, FLUSHED)
        assert request.is_alive()
        s.let_run()
        request.result()
        assert s.post("/flush_cache?timeout=-1").status_code == 200  # not read
    assert s.alive()


@pytest.mark.parametrize("version", representatives("reload_fields"))
def test_reload_fields(serve, tiny_dir, version) -> None:
    """``weight_version`` is applied from 0.5.1; ``flush_cache: false`` skips the reload's own
    flush from 0.5.6, and is ignored before (the flush always runs)."""
    fields = row("reload_fields", version)
    s = serve(version)
    flushes: list[int] = []
    s.teacher.flush_cache = lambda: flushes.append(1)  # type: ignore[method-assign]
    body = {"model_path": str(tiny_dir), "weight_version": "v2", "flush_cache": False}
    r = s.post("/update_weights_from_disk", body)
    assert r.status_code == 200 and r.json()["success"] is True
    want = "v2" if "weight_version" in fields else "default"
    assert s.get("/get_model_info").json()["weight_version"] == want
    assert len(flushes) == (0 if "flush_cache" in fields else 1)


@pytest.mark.parametrize(
    "version",
    representatives("reload_flush_refused", where=lambda c: c.pause is Pause.MODES),
)
def test_reload_flush_refused(serve, tiny_dir, newer_dir, version) -> None:
    """Unpaused, a reload waits for the request in flight and its flush passes. Paused in place
    with a request running, it loads at once and its flush is refused: that kills until 0.5.22,
    which answers 400 with the new weights in. (The refusal needs a pause that keeps requests
    in the scheduler: 0.5.6+.)"""
    s = serve(version, latency_s=LATENCY)
    request = Call(s)
    s.until(Phase.RUNNING)
    r = s.post("/update_weights_from_disk", {"model_path": str(tiny_dir)})
    assert r.status_code == 200 and r.json()["success"] is True
    assert finish(request.result())["type"] == "length"
    s.stall()  # the in-place pause reaches the server while this request runs
    frozen = Call(s)
    s.until(Phase.RUNNING)
    assert s.post("/pause_generation", {"mode": "in_place"}).status_code == 200
    s.let_run()  # still frozen: paused in place
    r = s.post("/update_weights_from_disk", {"model_path": str(newer_dir)})
    if row("reload_flush_refused", version) is Outcome.KILLS:
        assert_killed(r, "Cache flush failed after updating weights")
        assert_gone(s)
        return
    assert r.status_code == 400 and r.json() == {
        "success": False,
        "message": "Weights were updated, but the cache was not flushed because requests are "
        "still running or queued. Retract or finish them, then call /flush_cache.",
        "num_paused_requests": 0,
    }
    newer = TorchTeacher.from_pretrained(newer_dir).model.state_dict()
    assert all(torch.equal(t, newer[n]) for n, t in s.teacher.model.state_dict().items())
    assert frozen.is_alive()
    assert s.post("/continue_generation", {}).status_code == 200
    assert finish(frozen.result())["type"] == "length" and s.alive()


@pytest.mark.parametrize("version", representatives("checksum", "server_info"))
def test_checksum(serve, version) -> None:
    """``/weights_checker {"action": "checksum"}``: no route before 0.5.6, a 400 until 0.5.12,
    per-tensor hashes on 0.5.12, and from 0.5.13 ``per_gpu_checksum`` per rank and a
    ``per_engine_checksum`` string (the action optional, GET allowed)."""
    shape = row("checksum", version)
    s = serve(version)
    r = s.post("/weights_checker", {"action": "checksum"})
    if not row("server_info", version):
        assert r.status_code == 404
        return
    if shape is Checksum.NONE:
        assert r.status_code == 400 and r.json()["success"] is False
        return
    body = r.json()
    assert r.status_code == 200 and (body["success"], body["message"]) == (True, "Success.")
    (rank,) = body["ranks"]
    sums = rank["checksums"]
    assert set(sums) == {n for n, _ in s.teacher.model.named_parameters()}  # no RoPE buffers
    assert all(re.fullmatch(r"[0-9a-f]{16}", h) for h in sums.values())
    assert rank["parallelism_info"]["tp_size"] == 1
    if shape is Checksum.PER_TENSOR:
        assert "per_engine_checksum" not in body and "per_gpu_checksum" not in rank
        assert s.post("/weights_checker", {}).status_code == 400  # action required
        return
    per_gpu = hashlib.sha256()
    for name in sorted(sums):
        per_gpu.update(name.encode() + sums[name].encode())
    assert rank["per_gpu_checksum"] == per_gpu.hexdigest()
    engine = body["per_engine_checksum"]
    assert (
        isinstance(engine, str)
        and engine == hashlib.sha256(per_gpu.hexdigest().encode()).hexdigest()
    )
    assert s.get("/weights_checker").json()["per_engine_checksum"] == engine


@pytest.mark.parametrize(
    "version", repeats_slow(representatives("health_while_released"), "health_while_released")
)
def test_health_while_released(serve, version) -> None:
    """On an idle released server, ``/health`` runs its 1-token forward and kills, except on
    0.5.1–0.5.9, which skip it and answer 503 (after 20 s in SGLang, at once here)."""
    s = serve(version)
    assert s.get("/health").status_code == 200 == s.get("/health_generate").status_code
    assert s.post("/release_memory_occupation", {}).status_code == 200
    if row("health_while_released", version) is Outcome.SKIPPED_503:
        assert s.get("/health").status_code == 503 == s.get("/health_generate").status_code
        assert s.alive() and s.post("/resume_memory_occupation", {}).status_code == 200
        assert s.get("/health").status_code == 200
        return
    assert_killed(s.get("/health"), "a forward over released memory")
    assert_gone(s)


@pytest.mark.parametrize("version", representatives("fatal_resume_unreleased", "tags"))
def test_fatal_resume_unreleased(serve, version) -> None:
    """A resume of a tag that is not released kills (another tag released or not)."""
    s = serve(version)
    if row("tags", version):
        assert s.post("/release_memory_occupation", {"tags": ["kv_cache"]}).status_code == 200
        r = s.post("/resume_memory_occupation", {"tags": ["weights"]})
    else:
        r = s.post("/resume_memory_occupation", {})
    assert row("fatal_resume_unreleased", version) is Outcome.KILLS
    assert_killed(r, "KeyError")
    assert_gone(s)


@pytest.mark.parametrize("version", representatives("fatal_second_release", "tags"))
def test_fatal_second_release(serve, version) -> None:
    """A second release of a released tag kills; releasing another tag does not."""
    s = serve(version)
    if row("tags", version):
        assert s.post("/release_memory_occupation", {"tags": ["kv_cache"]}).status_code == 200
        assert s.post("/release_memory_occupation", {"tags": ["weights"]}).status_code == 200
        r = s.post("/release_memory_occupation", {"tags": ["kv_cache"]})
    else:
        assert s.post("/release_memory_occupation", {}).status_code == 200
        r = s.post("/release_memory_occupation", {})
    assert row("fatal_second_release", version) is Outcome.KILLS
    assert_killed(r, "second release")
    assert_gone(s)


def _by_generate(s: Served, tags: list[str]) -> httpx.Response:
    return s.post("/generate", SCORE)


def _by_reload(s: Served, tags: list[str]) -> httpx.Response:
    return s.post("/update_weights_from_disk", {"model_path": s.teacher.model_path})


def _by_checksum(s: Served, tags: list[str]) -> httpx.Response:
    return s.post("/weights_checker", {"action": "checksum"})


_FIRST = representatives("fatal_forward_released")[0]
_TAGGED = representatives("fatal_forward_released", where=lambda c: c.tags)[0]
_CHECKSUM = representatives("fatal_forward_released", where=lambda c: c.checksum)[0]


@pytest.mark.parametrize(
    ("version", "tags", "call"),
    [
        pytest.param(_FIRST, [], _by_generate, id=f"{_FIRST}-generate"),
        pytest.param(_TAGGED, ["kv_cache"], _by_generate, id=f"{_TAGGED}-generate-kv_cache"),
        pytest.param(_FIRST, [], _by_reload, id=f"{_FIRST}-reload"),
        pytest.param(_CHECKSUM, ["weights"], _by_checksum, id=f"{_CHECKSUM}-checksum"),
    ],
)
def test_fatal_forward_released(serve, version, tags, call) -> None:
    """A forward over released memory kills: a ``/generate`` (any tag released), a reload or a
    checksum (the weights released)."""
    s = serve(version)
    assert s.post("/release_memory_occupation", {"tags": tags}).status_code == 200
    assert row("fatal_forward_released", version) is Outcome.KILLS
    assert_killed(call(s, tags), "a forward over released memory")
    assert_gone(s)


@pytest.mark.parametrize("version", representatives("token_ids_logprob"))
def test_token_ids_logprob(serve, version) -> None:
    """Given ids are answered at every scored position, in the order asked, entry 0 null."""
    s = serve(version)
    assert row("token_ids_logprob", version) is True
    body = {**SCORE, "logprob_start_len": 1, "token_ids_logprob": [[9, 4, 9]]}
    meta = s.post("/generate", body).json()["meta_info"]
    rows = meta["input_token_ids_logprobs"]
    assert rows[0] is None and len(rows) == len(meta["input_token_logprobs"])
    assert all([e[1] for e in r] == [9, 4, 9] and r[0][0] == r[2][0] for r in rows[1:])


@pytest.mark.parametrize("version", representatives("fatal_token_id_past_vocab"))
def test_fatal_token_id_past_vocab(serve, version) -> None:
    """Before 0.5.14 an id past the vocabulary kills (unchecked indexing) and a negative one
    wraps around; from 0.5.14 both are refused with a 400."""
    s = serve(version)
    vocab = s.teacher.vocab_size
    if row("fatal_token_id_past_vocab", version) is Outcome.REFUSED_400:
        for bad in (-1, vocab):
            r = s.post("/generate", {**SCORE, "token_ids_logprob": [[bad]]})
            assert r.status_code == 400 and "token_ids_logprob" in r.text, r.text
        assert s.post("/generate", SCORE).status_code == 200  # still serving
        return
    wrapped = s.post("/generate", {**SCORE, "token_ids_logprob": [[-1, vocab - 1]]}).json()
    assert all(r[0][0] == r[1][0] for r in wrapped["meta_info"]["input_token_ids_logprobs"][1:])
    assert row("fatal_token_id_past_vocab", version) is Outcome.KILLS
    r = s.post("/generate", {**SCORE, "token_ids_logprob": [[vocab]]})
    assert_killed(r, "past the vocabulary")
    assert_gone(s)


@pytest.mark.parametrize(
    "version",
    repeats_slow(representatives("fatal_mixed_token_ids_batch"), "fatal_mixed_token_ids_batch"),
)
def test_fatal_mixed_token_ids_batch(serve, version) -> None:
    """Two requests in one prefill batch, one asking ``token_ids_logprob`` and one asking input
    logprobs without it, kill 0.5.10–0.5.15; a batch whose requests all ask ids, or none,
    is served everywhere, and so is the mixed one elsewhere."""
    s = serve(version, latency_s=LATENCY)
    with_ids = {**SCORE, "token_ids_logprob": [[5, 6]]}
    for same in (SCORE, with_ids):  # all alike: one batch, served
        first, second = Call(s, body=same), Call(s, body=same)
        assert finish(first.result()) and finish(second.result())
    s.stall()
    first = Call(s, body=SCORE)
    s.until(Phase.RUNNING)
    second = Call(s, body=with_ids)
    s.until(Phase.RUNNING, 2)  # running together: one batch
    s.let_run()
    if row("fatal_mixed_token_ids_batch", version) is Outcome.KILLS:
        # whichever forward runs first kills; the other request is answered by a dying server
        answers = [r for r in (first.result(), second.result()) if r is not None]
        assert all(r.status_code in (500, 503) for r in answers), [r.text for r in answers]
        for r in answers:
            if r.status_code == 500:
                assert_killed(r, "mixing a token_ids_logprob request")
        assert "mixing a token_ids_logprob request" in (s.server.dead_reason or "")
        assert_gone(s)
        return
    assert row("fatal_mixed_token_ids_batch", version) is Outcome.HARMLESS
    assert finish(first.result()) and finish(second.result())
    assert s.alive()


@pytest.mark.parametrize("version", representatives("engine_pause", where=lambda c: c.checksum))
def test_engine_pause(serve, version) -> None:
    """The in-process ``sglang.Engine`` has no pause and no checksum; the reference server is
    the HTTP server, whose pause and checksum that row must not take away."""
    assert row("engine_pause", version) is False
    s = serve(version)
    assert s.post("/pause_generation", {}).status_code == 200
    assert s.post("/continue_generation", {}).status_code == 200
    assert s.post("/weights_checker", {"action": "checksum"}).status_code == 200


ROW_TESTS = {
    "tags": test_tags,
    "default_tags": test_default_tags,
    "cuda_graph_tag": test_cuda_graph_tag,
    "weights_cpu_backup": test_weights_cpu_backup,
    "server_info": test_server_info,
    "pause": test_pause,
    "held_while_paused": test_held_while_paused,
    "release_check": test_release_check,
    "flush_check": test_flush_check,
    "flush_timeout": test_flush_timeout,
    "reload_fields": test_reload_fields,
    "reload_flush_refused": test_reload_flush_refused,
    "checksum": test_checksum,
    "health_while_released": test_health_while_released,
    "fatal_resume_unreleased": test_fatal_resume_unreleased,
    "fatal_second_release": test_fatal_second_release,
    "fatal_forward_released": test_fatal_forward_released,
    "token_ids_logprob": test_token_ids_logprob,
    "fatal_token_id_past_vocab": test_fatal_token_id_past_vocab,
    "fatal_mixed_token_ids_batch": test_fatal_mixed_token_ids_batch,
    "engine_pause": test_engine_pause,
}


def test_every_row_has_a_test() -> None:
    assert set(ROW_TESTS) == {f.name for f in FACTS}


# -- the abort-all pause, beyond its row --------------------------------------------------------

_ABORT_ALL = representatives("release_check", where=lambda c: c.pause is Pause.ABORT_ALL)


@pytest.mark.parametrize("version", _ABORT_ALL)
def test_an_abort_all_pause_races_the_release(serve, version) -> None:
    """0.4.9–0.5.5: the pause answers before the running request's last forward, so a release
    sent at once kills: by that forward over released memory where the release checks nothing
    (≤0.5.4), by the release's own assert on 0.5.5."""
    s = serve(version)
    s.stall()  # the release reaches the server before the running request's last forward
    running = Call(s)
    s.until(Phase.RUNNING)
    assert s.post("/pause_generation").status_code == 200
    assert s.count(Phase.RUNNING) == 1
    r = s.post("/release_memory_occupation", {})
    if row("release_check", version) is IdleCheck.NOTHING:
        assert r.status_code == 200
        s.let_run()
        assert_killed(running.result(), "a forward over released memory")
    else:
        assert_killed(r, "1 request(s) running")
    assert_gone(s)


@pytest.mark.parametrize("version", _ABORT_ALL)
def test_a_request_aborted_in_the_waiting_queue(serve, version) -> None:
    """It is answered 200 at once: "Abort before prefill" until 0.5.4, "Abort in waiting queue"
    from 0.5.5 (``_handle_abort_req``)."""
    s = serve(version, max_running=0)
    waiting = Call(s)
    s.until(Phase.WAITING)
    assert s.post("/pause_generation").status_code == 200
    message = finish(waiting.result())["message"]
    before = parse_version(version) < (0, 5, 5)  # the wheels, not the server's derivation
    assert message == ("Abort before prefill" if before else "Abort in waiting queue")
    assert s.post("/continue_generation").status_code == 200 and s.alive()
