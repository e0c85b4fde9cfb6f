"""Acting on a live SGLang teacher without harming it, against the reference server's version
profiles (it dies where SGLang's process dies: ``docs/sglang-contract.md`` §7)."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from distill_guard.live.canary import Canary
from distill_guard.live.colocate import ColocatedTeacher
from distill_guard.live.probe import run_probe
from distill_guard.teachers import SGLangHTTPTeacher, TeacherStateError, TorchTeacher
from distill_guard.teachers.capabilities import capabilities_for

from .test_sglang_http import SEQS, assert_gone


@pytest.mark.parametrize(
    ("version", "tags", "server_info", "checksum", "defaults"),
    [
        ("0.4.7", False, False, False, ("weights", "kv_cache")),
        ("0.4.8", True, False, False, ("weights", "kv_cache")),
        ("0.5.5", True, False, False, ("weights", "kv_cache", "cuda_graph")),
        ("0.5.6", True, True, False, ("weights", "kv_cache", "cuda_graph")),
        ("0.5.23", True, True, True, ("weights", "kv_cache", "cuda_graph")),
        ("v0.5.6.post2", True, True, False, ("weights", "kv_cache", "cuda_graph")),
    ],
)
def test_capabilities_come_from_the_version(version, tags, server_info, checksum, defaults):
    caps = capabilities_for(version)
    assert caps.known and (caps.tags, caps.server_info, caps.checksum) == (
        tags,
        server_info,
        checksum,
    )
    assert caps.default_tags == defaults


def test_an_unknown_version_is_read_conservatively_and_says_so():
    caps = capabilities_for("distill_guard reference server (not SGLang)")
    assert not caps.known and not caps.tags and not caps.checksum and not caps.server_info
    assert "unknown server version" in caps.note and "conservatively" in caps.note


@pytest.mark.parametrize(
    "version", [0.5, 5, ["0.5.23"], {"v": 1}, True, "0.5.23rc1", "0.5.23.dev2"]
)
def test_a_version_that_names_no_release_is_unknown_never_an_error(version):
    """A JSON number, list or object, or a pre-release (built before its release, so neither
    its row nor the one before is known to hold): the conservative row, said in its note."""
    caps = capabilities_for(version)
    assert not caps.known and not caps.checksum and "conservatively" in caps.note
    assert capabilities_for("0.5.23.post1").known and capabilities_for("0.5.23").checksum


@pytest.mark.parametrize("version", ["0.4.8", "0.5.5"])
def test_tags_are_honoured_on_servers_without_server_info(tiny_dir, serve, version) -> None:
    url, teacher = serve(tiny_dir, version=version)
    assert httpx.get(url + "/server_info").status_code == 404
    t = SGLangHTTPTeacher(url)
    t.release(["kv_cache"])  # the weights stay: a kv_cache release must not drop them
    assert teacher.sleep_state.released == {"kv_cache"} == t.sleep_state.released
    t.resume(["kv_cache"])
    assert not teacher.asleep


@pytest.mark.parametrize("action", ["resume_unreleased", "release_busy"])
def test_the_reference_server_dies_where_sglang_dies(tiny_dir, serve, action) -> None:
    # a request runs 5 s unless the release kills it: the release lands inside it on any machine
    url, _ = serve(tiny_dir, latency_s=5.0)
    if action == "resume_unreleased":
        r = httpx.post(url + "/resume_memory_occupation", json={"tags": ["weights"]})
    else:
        worker = threading.Thread(
            target=lambda: httpx.post(url + "/generate", json=_score_body(), timeout=5)
        )
        worker.start()
        time.sleep(0.3)
        r = httpx.post(url + "/release_memory_occupation", json={})
        worker.join()
    assert r.status_code == 500 and "scheduler died" in r.text
    assert_gone(url)


def _score_body() -> dict:
    return {"input_ids": SEQS[0], "sampling_params": {"max_new_tokens": 0}, "return_logprob": True}


def test_probe_drains_a_teacher_with_requests_in_flight_and_leaves_it_serving(tiny_dir, serve):
    url, _ = serve(tiny_dir, enable_cpu_backup=True, latency_s=0.3)
    results: list[int] = []

    def traffic() -> None:
        for _ in range(6):
            results.append(
                httpx.post(url + "/generate", json=_score_body(), timeout=30).status_code
            )

    workers = [threading.Thread(target=traffic) for _ in range(2)]
    for w in workers:
        w.start()
    time.sleep(0.1)
    with SGLangHTTPTeacher(url) as t:
        report = run_probe(t, cycles=2, canary=Canary(length=16))
    for w in workers:
        w.join()
    assert report.ok and len(report.cycles) == 2
    assert results == [200] * 12  # every request in flight completed
    assert httpx.get(url + "/health").status_code == 200  # alive and serving


def test_a_teacher_released_by_its_own_client_is_resumed_by_the_guard(tiny_dir, serve) -> None:
    """A release made through the teacher object itself (a launch-time sleep) is known, so the
    guard may resume it; only a release through another handle waits for the host's word."""
    url, teacher = serve(tiny_dir, enable_cpu_backup=True)
    t = SGLangHTTPTeacher(url)
    t.release()  # before the guard: its own tracker knows
    colocated = ColocatedTeacher(t, Canary(length=16))
    assert colocated.wake(0) == [] and not teacher.asleep
    assert httpx.get(url + "/get_server_info").status_code == 200


def test_a_teacher_updated_from_a_second_path_is_repaired_to_that_path(tiny_dir, tmp_path, serve):
    from distill_guard.testing.tiny import build_tiny_qwen3

    newer = build_tiny_qwen3(tmp_path / "newer", vocab_size=512, seed=7)
    url, teacher = serve(tiny_dir, enable_cpu_backup=False)
    t = SGLangHTTPTeacher(url)
    t.reload_weights(str(newer))  # the run updates the teacher from another checkpoint
    httpx.post(
        url + "/update_weights_from_disk", json={"model_path": str(newer), "weight_version": "v2"}
    )
    assert t.model_info()["model_path"] == str(newer) and t.model_info()["weight_version"] == "v2"
    assert t.server_info()["model_path"] == str(tiny_dir)  # /server_info: still the launch path
    colocated = ColocatedTeacher(t, Canary(length=16), repair_backoff_s=0)
    colocated.sleep(0)
    cause = colocated.wake(0)
    assert cause  # it lost its weights at the wake
    outcome, _ = colocated.repair(0, cause)
    assert outcome.ok  # verified against the pre-sleep canary, which saw the newer weights
    assert teacher.model_path == str(newer) and t.model_info()["weight_version"] == "v2"


def test_a_reload_whose_builtin_flush_is_refused_is_not_repeated(tiny_dir, serve) -> None:
    url, _ = serve(tiny_dir, latency_s=0.4)
    t = SGLangHTTPTeacher(url)
    worker = threading.Thread(target=lambda: t.score(SEQS[:1]))
    worker.start()
    time.sleep(0.1)
    # SGLang's own flush would be refused now; the client asks for none and flushes after
    t.reload_weights()
    worker.join()
    raw = httpx.post(url + "/update_weights_from_disk", json={"model_path": t.model_path})
    assert raw.json()["success"] is True  # idle now: the built-in flush goes through


def test_the_checksum_catches_a_zeroed_teacher_without_a_forward_pass(tiny_dir, serve) -> None:
    url, teacher = serve(tiny_dir, enable_cpu_backup=False)
    t = SGLangHTTPTeacher(url)
    before = t.checksum()
    assert before and t.checksum() == before  # exact and repeatable
    forwards = []
    teacher.model.register_forward_hook(lambda *a: forwards.append(1))
    t.release()
    t.resume()
    assert t.checksum() != before and forwards == []  # no forward pass was needed
    t.reload_weights()
    assert t.checksum() == before


def test_no_checksum_where_the_version_has_none(tiny_dir, serve) -> None:
    url, _ = serve(tiny_dir, version="0.5.11")  # /weights_checker without the checksum action
    assert SGLangHTTPTeacher(url).checksum() is None  # and nothing was sent
    assert httpx.post(url + "/weights_checker", json={"action": "checksum"}).status_code == 400
    old_url, _ = serve(tiny_dir, version="0.5.5")
    assert SGLangHTTPTeacher(old_url).checksum() is None
    assert httpx.post(old_url + "/weights_checker", json={"action": "checksum"}).status_code == 404


def test_no_health_call_on_a_sleeping_teacher_and_keys_never_leave_server_info(tiny_dir, serve):
    url, _ = serve(tiny_dir, api_key="s3cret-key")
    import os

    os.environ["SGLANG_API_KEY_FOR_TEST"] = "s3cret-key"
    try:
        t = SGLangHTTPTeacher(url, api_key_env="SGLANG_API_KEY_FOR_TEST")
        info = t.server_info()
        assert info["api_key"] == "<redacted>" and "s3cret-key" not in str(info)
        t.release()
        with pytest.raises(TeacherStateError, match="asleep"):
            t.health()
        t.resume()
    finally:
        os.environ.pop("SGLANG_API_KEY_FOR_TEST")


def test_a_401_on_an_admin_endpoint_names_the_admin_key(tiny_dir, serve, monkeypatch) -> None:
    from distill_guard.teachers import TeacherHTTPError, TorchTeacher
    from distill_guard.testing.reference_server import ReferenceServer, serve_in_thread

    server = ReferenceServer(TorchTeacher.from_pretrained(tiny_dir), admin_api_key="adm1n")
    with serve_in_thread(server) as url:
        monkeypatch.setenv("SGLANG_ADMIN_API_KEY", "wrong")
        t = SGLangHTTPTeacher(url)
        with pytest.raises(
            TeacherHTTPError, match=r"--admin-api-key through \$SGLANG_ADMIN_API_KEY"
        ):
            t.release()


def test_the_wake_checks_the_checksum_before_the_held_traffic_runs(tiny_dir, serve) -> None:
    """No backup on 0.5.23: the wake's checksum fails while the guard's pause still holds a
    request sent during the sleep; it runs only after the repair verified the teacher."""
    from distill_guard.findings import Code

    expected = TorchTeacher.from_pretrained(tiny_dir).score(SEQS[:1]).token_logprobs[0]
    url, _ = serve(tiny_dir, enable_cpu_backup=False)
    t = SGLangHTTPTeacher(url)
    colocated = ColocatedTeacher(t, Canary(length=16), repair_backoff_s=0)
    colocated.sleep(0)
    held: list[httpx.Response] = []
    worker = threading.Thread(
        target=lambda: held.append(
            httpx.post(
                url + "/generate", json={**_score_body(), "logprob_start_len": 0}, timeout=30
            )
        )
    )
    worker.start()
    found = colocated.wake(0)
    assert [f.code for f in found] == [Code.TEACHER_FINGERPRINT_MISMATCH]
    assert found[0].values["source"] == "weights_checker" and colocated.held
    time.sleep(0.2)
    assert held == []  # still held: nothing ran on the lost weights
    outcome, _ = colocated.repair(0, found)
    worker.join(30)
    assert outcome.ok and not colocated.held
    got = [e[0] for e in held[0].json()["meta_info"]["input_token_logprobs"][1:]]
    assert got == pytest.approx(expected.tolist(), abs=1e-5)  # scored on the repaired weights
    healthy_url, _ = serve(tiny_dir, enable_cpu_backup=True)
    healthy = ColocatedTeacher(SGLangHTTPTeacher(healthy_url), Canary(length=16))
    for step in range(2):
        assert healthy.sleep(step) == [] and healthy.wake(step) == []
