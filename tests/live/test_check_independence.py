"""Fail closed per check: of two checks on one code path (the wake's canary and its weights
checksum, the checksum and the server's arguments), one that cannot run is a finding of its own
and never switches the other off. Each test breaks one check and shows the other still catches
a wake that lost its weights."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from distill_guard.findings import Code, Severity
from distill_guard.live.colocate import ColocatedTeacher
from distill_guard.teachers import TeacherError, TeacherHTTPError, TeacherUnreachable, TorchTeacher
from distill_guard.testing.tiny import build_tiny_qwen3


class Checked(TorchTeacher):
    """A teacher with SGLang's exact weights checksum, whose checks can be broken one by one."""

    broken_checksum: Exception | None = None
    broken_server_info = False
    broken_scores: list[Exception]

    def checksum(self) -> str | None:
        if self.broken_checksum is not None:
            raise self.broken_checksum
        digest = hashlib.sha256()
        for name, t in sorted(self.model.state_dict().items()):
            digest.update(name.encode() + t.detach().float().numpy().tobytes())
        return digest.hexdigest()

    def server_info(self):
        if self.broken_server_info:
            raise TeacherHTTPError("/server_info", 404, "Not Found")
        return super().server_info()

    def _score(self, sequences, top_k, logprob_start_len):
        if getattr(self, "broken_scores", None):
            raise self.broken_scores.pop(0)
        return super()._score(sequences, top_k, logprob_start_len)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_qwen3(tmp_path_factory.mktemp("independence"), vocab_size=64)


@pytest.fixture
def teacher(tiny_dir):
    def make(**kw) -> Checked:
        return Checked.from_pretrained(tiny_dir, enable_memory_saver=True, **kw)

    return make


def codes(findings) -> set[str]:
    return {f.code for f in findings}


def test_a_checksum_that_cannot_be_read_leaves_the_canary_its_reference(teacher) -> None:
    """The checksum answers 404 at every step, and the server's arguments cannot be read
    either: the canary still has its fingerprint, and a garbage wake is caught."""
    t = teacher(enable_cpu_backup=True)
    t.broken_checksum = TeacherHTTPError("/weights_checker", 404, "<html>")
    t.broken_server_info = True
    col = ColocatedTeacher(t)
    said = []
    for step in range(3):  # healthy wakes: the broken checksum is said once, not a verdict
        found = col.sleep(step) + col.wake(step)
        said += found
        assert all(f.severity is Severity.WARN for f in found)
    assert [f.code for f in said] == [Code.TEACHER_CHECK_UNAVAILABLE]
    assert "the canary still judges" in said[0].message
    _lose_weights_at_next_wake(t)
    found = col.sleep(3) + col.wake(3)
    assert codes(found) & {Code.TEACHER_FINGERPRINT_MISMATCH, Code.TEACHER_UNIFORM}, found
    assert col.canary.last_fingerprint is not None


def test_a_canary_that_cannot_score_before_the_sleep_leaves_the_wake_its_checksum(teacher) -> None:
    """The fingerprint's scoring fails (an error answer): the checksum is still taken, and the
    wake that lost its weights is caught by it before any traffic runs."""
    t = teacher(enable_cpu_backup=False)
    t.broken_server_info = True  # and the arguments do not say it either
    t.broken_scores = [TeacherHTTPError("/generate", 500, "oops")]
    col = ColocatedTeacher(t)
    found = col.sleep(0) + col.wake(0)
    assert Code.TEACHER_UNREACHABLE in codes(found)  # the fingerprint's failure, said
    assert Code.TEACHER_FINGERPRINT_MISMATCH in codes(found), found
    mismatch = next(f for f in found if f.code == Code.TEACHER_FINGERPRINT_MISMATCH)
    assert mismatch.values["source"] == "weights_checker"


def test_a_teacher_that_does_not_answer_is_not_asked_its_checksum_too(teacher) -> None:
    """No answer at all to the fingerprint: the checksum would wait the same deadline for the
    same silence, so it is not asked; the finding is the fingerprint's."""
    t = teacher(enable_cpu_backup=True)
    t.broken_scores = [TeacherUnreachable("/generate: no answer within 30 s")]
    asked = []
    t.checksum = lambda: asked.append(1) or "x"  # type: ignore[method-assign]
    found = ColocatedTeacher(t).fingerprint(0)
    assert codes(found) == {Code.TEACHER_UNREACHABLE} and not asked


def test_a_checksum_episode_is_said_again_after_it_recovered(teacher) -> None:
    t = teacher(enable_cpu_backup=True)
    col = ColocatedTeacher(t)
    broken = TeacherError("/weights_checker answered without a checksum")
    said = []
    for step, fails in enumerate([True, True, False, True]):
        t.broken_checksum = broken if fails else None
        said += col.sleep(step) + col.wake(step)
    assert [f.step for f in said] == [0, 3]


def _lose_weights_at_next_wake(t: TorchTeacher) -> None:
    """The emulated memory saver keeps nothing at the next release, and wakes to garbage."""
    t._region._cpu_backup = False
    t._region._fault = "garbage"


def test_an_answer_without_a_checksum_is_an_error_not_no_checksum(tiny_dir) -> None:
    """A version that has the checksum answering without one (a proxy's JSON, an HTML page
    read as JSON elsewhere) is a failed check, never "this server has no checksum"."""
    import importlib

    from starlette.responses import JSONResponse

    from distill_guard.teachers import SGLangHTTPTeacher
    from distill_guard.testing.reference_server import ReferenceServer
    from distill_guard.testing.reference_server.app import create_app

    serve = importlib.import_module("distill_guard.testing.reference_server.serve")
    app = create_app(ReferenceServer(TorchTeacher.from_pretrained(tiny_dir), version="0.5.23"))

    @app.middleware("http")
    async def no_checksum(request, call_next):
        if request.url.path == "/weights_checker":
            return JSONResponse({"success": True})
        return await call_next(request)

    with (
        serve.ServerThread(app) as thread,
        SGLangHTTPTeacher(thread.url) as t,
        pytest.raises(TeacherError, match="without a checksum"),
    ):
        t.checksum()


def test_a_guard_restored_onto_a_paused_client_lets_its_traffic_go(tmp_path) -> None:
    """The run stops between the sleep and the wake (a halt, a preemption) and a new guard is
    built on the same client: its first wake resumes the teacher and lets the old pause go,
    so scoring answers (it used to wait behind the pause until its deadline, and the step
    blamed the teacher with teacher.unreachable). Found by benchmarks/chaos_soak.py."""
    from distill_guard import build_guard
    from distill_guard.policy import Action
    from distill_guard.teachers import SGLangHTTPTeacher
    from distill_guard.testing.servers import reference_teacher

    model = build_tiny_qwen3(tmp_path / "m", vocab_size=64)
    quiet = ["alerts.use_wandb=false", "events_path=null"]
    with reference_teacher(model, enable_cpu_backup=True) as (url, _):
        teacher = SGLangHTTPTeacher(url, timeout_s=2)
        first = build_guard("default", quiet, teacher=teacher)
        first.sleep(0)
        state = first.state_dict()
        first.close()
        second = build_guard("default", quiet, teacher=teacher)
        second.load_state_dict(state, keep_halt=False)
        d = second.wake(1)
        assert d.action is Action.CONTINUE, d
        assert not teacher.paused and teacher.score([[1, 2, 3, 4]], top_k=4).topk_logprobs
