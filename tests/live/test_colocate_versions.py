"""The guard's own sleep, wake and repair against the reference server set to each version of
the table, with traffic in flight: the server lives through every action, no request is lost that
the version would not lose anyway, and no request is answered by a teacher nobody verified.

The reference server dies where SGLang dies, per version (``docs/sglang-contract.md`` §7.2;
``tests/testing/test_reference_server_versions.py`` proves it row by row), so a guard action that
would kill a real teacher fails these tests."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from distill_guard.findings import Code, Severity
from distill_guard.live.canary import Canary
from distill_guard.live.colocate import ColocatedTeacher
from distill_guard.teachers import SGLangHTTPTeacher, TorchTeacher
from distill_guard.teachers.base import ReleaseUnsafe
from distill_guard.teachers.capabilities import Pause, SleepPlan, capabilities_for, plan_sleep
from distill_guard.testing.servers import reference_teacher
from distill_guard.testing.tiny import build_tiny_qwen3

SEQ = list(range(3, 30))
BODY = {
    "input_ids": SEQ,
    "sampling_params": {"max_new_tokens": 0},
    "return_logprob": True,
    "logprob_start_len": 0,
}
ONE_PER_GUARD_ROW = ["0.4.8", "0.4.9", "0.5.5", "0.5.7", "0.5.11", "0.5.17", "0.5.22"]
"""A version per row of ``docs/teachers.md`` §7.1 (what the guard does differs between them)."""


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_qwen3(tmp_path_factory.mktemp("versions_tiny"), vocab_size=512)


@pytest.fixture(scope="module")
def healthy(tiny_dir: Path) -> list[float]:
    """What a never-slept teacher answers for ``SEQ``."""
    return TorchTeacher.from_pretrained(tiny_dir).score([SEQ]).token_logprobs[0].tolist()


@dataclass
class Traffic:
    """Clients sending scoring requests throughout, with short random gaps between them."""

    url: str
    threads: int = 2
    gap_s: float = 0.08
    """The longest random pause between one client's requests."""
    answers: list[tuple[int, dict]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._workers = [threading.Thread(target=self._run, args=(i,)) for i in range(self.threads)]

    def _run(self, seed: int) -> None:
        rng = random.Random(seed)
        while not self._stop.is_set():
            try:
                r = httpx.post(self.url + "/generate", json=BODY, timeout=60)
                self.answers.append((r.status_code, r.json() if r.status_code == 200 else {}))
            except httpx.HTTPError as e:
                self.errors.append(f"{type(e).__name__}: {e}")
                return
            time.sleep(rng.uniform(0.0, self.gap_s))

    def __enter__(self) -> Traffic:
        for w in self._workers:
            w.start()
        time.sleep(0.2)  # requests are in flight when the guard starts
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for w in self._workers:
            w.join(60)


def _alive(url: str) -> bool:
    try:
        return httpx.get(url + "/get_server_info", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def _aborted(answer: dict) -> bool:
    reason = (answer.get("meta_info") or {}).get("finish_reason") or {}
    return isinstance(reason, dict) and reason.get("type") == "abort"


def _values(answer: dict) -> list[float]:
    return [e[0] for e in answer["meta_info"]["input_token_logprobs"][1:]]


@pytest.mark.parametrize("version", ONE_PER_GUARD_ROW)
def test_a_busy_teacher_lives_through_every_guard_action_and_serves_only_verified_weights(
    tiny_dir, healthy, version
) -> None:
    caps = capabilities_for(version)
    with reference_teacher(tiny_dir, version=version, latency_s=0.15) as (url, _):
        teacher = SGLangHTTPTeacher(url, drain_timeout_s=3.0)
        colocated = ColocatedTeacher(teacher, Canary(length=16), repair_backoff_s=0.0)
        seen: list[str] = []
        with Traffic(url) as traffic:
            for step in range(2):
                seen += [f.code for f in colocated.sleep(step)]
                assert _alive(url), f"the sleep of step {step} killed SGLang {version}"
                woke = colocated.wake(step)
                seen += [f.code for f in woke]
                assert _alive(url), f"the wake of step {step} killed SGLang {version}"
                if any(f.severity is Severity.CRITICAL for f in woke):
                    outcome, _ = colocated.repair(step, woke)
                    assert outcome.ok, outcome.findings
                    assert _alive(url), f"the repair of step {step} killed SGLang {version}"
                assert not colocated.held and not teacher.asleep
        assert _alive(url) and traffic.errors == [], traffic.errors
    statuses = {status for status, _ in traffic.answers}
    assert statuses == {200}, statuses
    aborted = [a for _, a in traffic.answers if _aborted(a)]
    if caps.pause is not Pause.ABORT_ALL:  # only 0.4.9-0.5.5's own pause aborts requests
        assert aborted == []
    scored = [a for _, a in traffic.answers if not _aborted(a)]
    assert len(scored) >= 4
    for answer in scored:  # not one answer from a teacher that lost its weights
        assert _values(answer) == pytest.approx(healthy, abs=1e-5)
    plan = plan_sleep(caps)
    if plan is SleepPlan.NEVER:
        assert seen == [Code.TEACHER_RELEASE_SKIPPED]  # said once, never released
    elif plan is not SleepPlan.ONLY_IF_IDLE:  # released every time: lost, held, repaired
        assert {Code.TEACHER_FINGERPRINT_MISMATCH, Code.TEACHER_WEIGHTS_NOT_KEPT} & set(seen)
        assert Code.TEACHER_UNIFORM not in seen  # no canary ever ran on the lost weights


def test_a_release_that_would_kill_0_5_17_is_not_made(tiny_dir) -> None:
    """0.5.17's release counts the requests a retract pause puts back in the queue: with one
    running at the sleep, the drain lets it run on (nothing lost) and does not release; once it
    is done, the drain holds the traffic and the release goes through."""
    with reference_teacher(tiny_dir, version="0.5.17", latency_s=1.5) as (url, _):
        teacher = SGLangHTTPTeacher(url, drain_timeout_s=0.2)
        answers: list[httpx.Response] = []
        worker = threading.Thread(
            target=lambda: answers.append(httpx.post(url + "/generate", json=BODY, timeout=30))
        )
        worker.start()
        time.sleep(0.3)  # running, 1.2 s to go: longer than the drain waits for quiet
        with pytest.raises(ReleaseUnsafe, match=r"SGLang 0\.5\.17 the release asserts fully idle"):
            teacher.drain()
        assert not teacher.asleep and _alive(url)
        worker.join(30)
        assert answers[0].status_code == 200 and not _aborted(answers[0].json())
        assert _values(answers[0].json())  # retracted, then run to the end after the continue
        assert teacher.drain() is True  # idle now: held, and the release's assert will pass
        teacher.release()
        teacher.resume()
        teacher.undrain()
        assert _alive(url)


def test_a_release_the_version_cannot_make_safe_is_said_once() -> None:
    from distill_guard.teachers.base import TrackedTeacher

    class Unsafe(TrackedTeacher):
        def drain(self) -> bool:
            raise ReleaseUnsafe("SGLang 0.4.8 has no /pause_generation")

    colocated = ColocatedTeacher(Unsafe(), Canary(length=16))
    colocated.canary.fingerprint = lambda *a, **k: None  # type: ignore[method-assign]
    first, second = colocated.sleep(0), colocated.sleep(1)
    assert [f.code for f in first] == [Code.TEACHER_RELEASE_SKIPPED] and second == []
    assert first[0].severity is Severity.WARN and "0.4.8" in first[0].message


def test_a_host_that_resumes_behind_the_guards_back_never_gets_a_forward_on_a_released_teacher(
    tiny_dir,
) -> None:
    with reference_teacher(tiny_dir, enable_cpu_backup=True) as (url, server_side):
        guard_side, host = SGLangHTTPTeacher(url), SGLangHTTPTeacher(url)
        colocated = ColocatedTeacher(guard_side, Canary(length=16))
        colocated.sleep(0, release=host.release)  # the host's own handle releases it
        forwards: list[int] = []
        server_side.model.register_forward_hook(lambda *a: forwards.append(1))
        found = colocated.wake(0)  # and it says nothing of its resume
        assert [f.code for f in found] == [Code.TEACHER_STATE_UNKNOWN]
        assert forwards == [] and _alive(url)  # nothing sent: no forward, no resume
        outcome, _ = colocated.repair(0, found)  # a repair cannot reach it either
        assert not outcome.ok and forwards == [] and _alive(url)
        # what the old "is it awake?" probe (a two-token scoring call) does to a released teacher
        httpx.post(url + "/generate", json={**BODY, "input_ids": [0, 0]}, timeout=10)
        assert _gone(url)


def test_a_release_or_resume_with_no_answer_makes_the_state_unknown_and_nothing_follows(
    tiny_dir,
) -> None:
    with reference_teacher(tiny_dir, enable_cpu_backup=True) as (url, _):
        t = SGLangHTTPTeacher(url)
        colocated = ColocatedTeacher(t, Canary(length=16))
        colocated.fingerprint(0)
        real = t._release

        def lost_answer(tags: tuple[str, ...]) -> None:
            real(tags)
            raise_unreachable()

        t._release = lost_answer  # type: ignore[method-assign]
        found = colocated.sleep(0)
        assert [f.code for f in found] == [Code.TEACHER_STATE_UNKNOWN] and t.state_unknown
        again = colocated.wake(0)
        assert [f.code for f in again] == [Code.TEACHER_STATE_UNKNOWN] and _alive(url)
        with pytest.raises(Exception, match="cannot be known"):
            t.score([SEQ])
        t.mark_released(by_host=False)  # the user checked: the guard's own release went through
        colocated.held = True
        assert Code.TEACHER_STATE_UNKNOWN not in {f.code for f in colocated.wake(1)}


def raise_unreachable() -> None:
    from distill_guard.teachers import TeacherUnreachable

    raise TeacherUnreachable("no answer within 0.1 s", endpoint="/release_memory_occupation")


def _gone(url: str, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not _alive(url):
            return True
        time.sleep(0.05)
    return False


def test_every_row_of_the_guard_table_has_a_version_tested_above() -> None:
    from distill_guard.teachers.capabilities import repair_plan, wake_plan
    from distill_guard.teachers.sglang_versions import RELEASES_READ

    def row(version: str) -> tuple[str, str, str]:
        caps = capabilities_for(version)
        return plan_sleep(caps).value, wake_plan(caps), repair_plan(caps)

    every = {row(".".join(map(str, v))) for v in RELEASES_READ}
    assert {row(v) for v in ONE_PER_GUARD_ROW} == every


def test_a_wake_whose_resume_failed_keeps_the_traffic_held(tiny_dir) -> None:
    """The resume answered an error: the teacher is still released, so the requests the pause
    holds must not run (a forward on released memory kills); whatever the decision, they stay
    held until it is awake."""
    from distill_guard.policy import Action, Decision
    from distill_guard.teachers import TeacherHTTPError

    with reference_teacher(tiny_dir, enable_cpu_backup=True) as (url, _):
        t = SGLangHTTPTeacher(url)
        colocated = ColocatedTeacher(t, Canary(length=16))
        assert colocated.sleep(0) == [] and t.asleep and colocated.held
        real = t._resume

        def refused(tags: tuple[str, ...]) -> None:
            raise TeacherHTTPError("/resume_memory_occupation", 400, "refused")

        t._resume = refused  # type: ignore[method-assign]
        found = colocated.wake(0)
        assert [f.code for f in found] == [Code.TEACHER_UNREACHABLE] and t.asleep
        colocated.settle(Decision(0, Action.CONTINUE))  # the run goes on: still held
        assert colocated.held and _alive(url)
        held: list[httpx.Response] = []
        worker = threading.Thread(
            target=lambda: held.append(httpx.post(url + "/generate", json=BODY, timeout=30))
        )
        worker.start()
        time.sleep(0.3)
        assert held == [] and _alive(url)  # held, not run on released memory
        t._resume = real  # type: ignore[method-assign]
        assert colocated.wake(1) == [] and not colocated.held  # awake: verified, then let go
        worker.join(30)
        assert held[0].status_code == 200 and _alive(url)


def test_a_checksum_that_cannot_be_read_after_the_wake_still_keeps_lost_weights_held(
    tiny_dir,
) -> None:
    """0.5.23 without a backup, its checksum unreadable after the wake: the server's own
    arguments still say the weights are gone, so the traffic stays held for the repair."""
    from distill_guard.teachers import TeacherHTTPError

    with reference_teacher(tiny_dir) as (url, _):
        t = SGLangHTTPTeacher(url)
        colocated = ColocatedTeacher(t, Canary(length=16), repair_backoff_s=0.0)
        assert colocated.sleep(0) == [] and colocated.held
        real = t.checksum

        def unreadable() -> str | None:
            raise TeacherHTTPError("/weights_checker", 404, "Not Found")

        t.checksum = unreadable  # type: ignore[method-assign]
        found = colocated.wake(0)
        assert [f.code for f in found] == [
            Code.TEACHER_CHECK_UNAVAILABLE,
            Code.TEACHER_WEIGHTS_NOT_KEPT,
        ]
        assert colocated.held and _alive(url)
        t.checksum = real  # type: ignore[method-assign]
        outcome, _ = colocated.repair(0, found)
        assert outcome.ok and not colocated.held
