"""SGLangHTTPTeacher against the reference server over real loopback HTTP, and against fakes."""

from __future__ import annotations

import math
import socket
import time

import httpx
import pytest
import torch

from distill_guard.teachers import (
    ALL_TAGS,
    SGLangHTTPTeacher,
    TeacherHTTPError,
    TeacherStateError,
    TeacherUnreachable,
    TorchTeacher,
)

SEQS = [list(range(3, 30)), [5, 9, 2, 2, 2, 2, 41]]
U512 = -math.log(512)


def test_wire_shape_has_sglang_leading_nulls(tiny_dir, serve) -> None:
    url, _ = serve(tiny_dir)
    body = {"input_ids": [1, 2, 3, 4], "sampling_params": {"max_new_tokens": 0},
            "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 2}  # fmt: skip
    item = httpx.post(url + "/generate", json=body).json()
    meta = item["meta_info"]
    assert meta["input_token_logprobs"][0] == [None, 1, None]
    assert [e[1] for e in meta["input_token_logprobs"]] == [1, 2, 3, 4]
    assert meta["input_top_logprobs"][0] is None and len(meta["input_top_logprobs"][1]) == 2
    assert meta["output_token_logprobs"] == [] and meta["completion_tokens"] == 0
    batch = httpx.post(url + "/generate", json={**body, "input_ids": [[1, 2, 3], [4, 5]]}).json()
    assert isinstance(batch, list) and [
        len(b["meta_info"]["input_token_logprobs"]) for b in batch
    ] == [3, 2]
    body["logprob_start_len"] = 2
    meta = httpx.post(url + "/generate", json=body).json()["meta_info"]
    assert (
        meta["input_token_logprobs"][0] == [None, 3, None]
        and len(meta["input_token_logprobs"]) == 2
    )


@pytest.mark.parametrize("start", [0, 4])
def test_scores_match_the_in_process_teacher(tiny_dir, serve, start) -> None:
    url, _ = serve(tiny_dir)
    local = TorchTeacher.from_pretrained(tiny_dir).score(SEQS, top_k=5, logprob_start_len=start)
    with SGLangHTTPTeacher(url) as remote:
        res = remote.score(SEQS, top_k=5, logprob_start_len=start)
        assert remote.vocab_size == 512  # read from config.json at the server's model_path
    for a, b in zip(res.token_logprobs, local.token_logprobs):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    for a, b in zip(res.topk_ids, local.topk_ids):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    ("kw", "expect"),
    [({}, "uniform"), ({"fault": "garbage"}, "garbage"),
     ({"enable_cpu_backup": True}, "same"), ({"enable_cpu_backup": True, "fault": "garbage"}, "same")],
)  # fmt: skip
def test_fault_modes_over_http(tiny_dir, serve, kw, expect) -> None:
    url, _ = serve(tiny_dir, **kw)
    t = SGLangHTTPTeacher(url)
    before = t.score(SEQS[:1], top_k=4).topk_logprobs[0]
    t.release()
    t.resume()
    after = t.score(SEQS[:1], top_k=4).topk_logprobs[0]
    delta = float((after - before).abs().max())
    if expect == "same":
        assert delta == 0.0
    elif expect == "uniform":
        assert float((after - U512).abs().max()) < 1e-5
    else:
        assert delta > 1.0 and float((after - U512).abs().max()) > 0.1


def test_client_refuses_double_release_and_scoring_while_asleep(tiny_dir, serve) -> None:
    url, teacher = serve(tiny_dir)
    t = SGLangHTTPTeacher(url)
    t.release(["weights"])
    with pytest.raises(TeacherStateError, match="kills SGLang's scheduler"):
        t.release(["weights"])
    with pytest.raises(TeacherStateError, match="asleep"):
        t.score(SEQS)
    assert teacher.sleep_state.released == {"weights"}  # the server never saw the second release
    t.resume()
    assert not t.asleep and t.score(SEQS).token_logprobs[0].numel() == 26


def test_a_raw_double_release_kills_the_reference_server(tiny_dir, serve) -> None:
    url, _ = serve(tiny_dir)
    assert httpx.post(url + "/release_memory_occupation", json={"tags": ["weights"]}).json() is None
    second = httpx.post(url + "/release_memory_occupation", json={"tags": ["weights"]})
    assert second.status_code == 500 and "scheduler died" in second.json()["error"]["message"]
    assert_gone(url)


def assert_gone(url: str, within_s: float = 5.0) -> None:
    """The server process is gone: nothing answers on its port (as after SGLang's kill)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            status = httpx.get(url + "/health", timeout=0.5).status_code
        except httpx.TransportError:
            return
        assert status == 503  # dying: the scheduler is dead, the server not yet down
        time.sleep(0.05)
    raise AssertionError(f"{url} still answers {within_s} s after its scheduler died")


def test_health_stays_green_with_zeroed_weights(tiny_dir, serve) -> None:
    url, _ = serve(tiny_dir)
    t = SGLangHTTPTeacher(url)
    t.release()
    t.resume()
    assert t.health() and httpx.get(url + "/health_generate").status_code == 200
    assert float((t.score(SEQS[:1]).token_logprobs[0] - U512).abs().max()) < 1e-5


def test_a_server_that_ignores_tags_releases_everything(tiny_dir, serve) -> None:
    url, teacher = serve(tiny_dir, version="0.4.7")
    assert httpx.get(url + "/server_info").status_code == 404
    t = SGLangHTTPTeacher(url)
    assert t.server_info()["model_path"] == str(tiny_dir) and not t.capabilities.tags
    t.release(["kv_cache"])  # 0.4.7 releases everything, weights included
    assert t.sleep_state.released == set(ALL_TAGS)
    assert teacher.sleep_state.released == {"weights", "kv_cache"}
    with pytest.raises(TeacherStateError):
        t.release(["weights"])
    t.resume(["kv_cache"])
    assert not t.asleep and not teacher.asleep


def test_api_key_is_read_from_the_environment(tiny_dir, serve, monkeypatch) -> None:
    url, _ = serve(tiny_dir, api_key="s3cret")
    monkeypatch.delenv("SGLANG_API_KEY", raising=False)
    with pytest.raises(TeacherHTTPError) as err:
        SGLangHTTPTeacher(url).score(SEQS)
    assert err.value.status == 401 and "SGLANG_API_KEY" in str(err.value)
    monkeypatch.setenv("MY_TEACHER_KEY", "s3cret")
    t = SGLangHTTPTeacher(url, api_key_env="MY_TEACHER_KEY")
    assert len(t.score(SEQS)) == 2
    t.release()
    t.resume()


def test_sglang_error_bodies_are_surfaced(tiny_dir, serve) -> None:
    url, _ = serve(tiny_dir)
    t = SGLangHTTPTeacher(url)
    with pytest.raises(TeacherHTTPError, match="unknown memory tags") as err:  # {"error": {...}}
        t.request("POST", "/release_memory_occupation", json={"tags": ["gpu"]}, admin=True)
    assert err.value.status == 400
    with pytest.raises(TeacherStateError, match="none of"):  # never an empty list (= all)
        SGLangHTTPTeacher(serve(tiny_dir, version="0.5.3")[0])._release(("cuda_graph",))
    with pytest.raises(TeacherHTTPError, match="no \\*.safetensors") as err:  # {"success": false}
        t.reload_weights("/nonexistent/checkpoint")
    assert err.value.body["success"] is False
    with pytest.raises(TeacherHTTPError, match="greater than the input length"):
        t._request("POST", "/generate", json={"input_ids": [1, 2], "return_logprob": True,
                   "logprob_start_len": 5, "sampling_params": {"max_new_tokens": 0}})  # fmt: skip
    with pytest.raises(TeacherHTTPError, match="input_ids is required"):  # {"error": "..."}
        t._request("POST", "/generate", json={"sampling_params": {}})
    t.flush_cache()  # plain-text 200


def _mock(handler) -> httpx.MockTransport:
    return httpx.MockTransport(handler)


def test_success_false_with_status_200_is_an_error() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, json={"success": False, "message": "load failed: disk", "num_paused_requests": 0}
        )

    t = SGLangHTTPTeacher("http://teacher", transport=_mock(handler))
    with pytest.raises(TeacherHTTPError, match="load failed: disk"):
        t.reload_weights("/ckpt")


def test_plain_text_error_and_fastapi_detail_are_surfaced() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/get_server_info":
            return httpx.Response(200, json={"version": "0.5.23"})
        if req.url.path == "/flush_cache":
            return httpx.Response(400, text="Cache not flushed. Requests are running.")
        return httpx.Response(422, json={"detail": [{"msg": "Field required"}]})

    t = SGLangHTTPTeacher("http://teacher", transport=_mock(handler))
    with pytest.raises(TeacherHTTPError, match="Cache not flushed"):
        t.flush_cache()
    with pytest.raises(TeacherHTTPError, match="Field required"):
        t.score([[1, 2]])


def test_only_idempotent_reads_are_retried() -> None:
    calls: list[str] = []

    def handler(req: httpx.Request) -> httpx.Response:
        calls.append(req.url.path)
        if calls.count("/generate") == 1 or req.url.path == "/release_memory_occupation":
            return httpx.Response(503, json={"error": {"message": "starting"}})
        if req.url.path == "/get_server_info":
            return httpx.Response(200, json={"model_path": "/m", "version": "0.5.23"})
        meta = {"input_token_logprobs": [[None, 1, None], [-0.5, 2, None]]}
        return httpx.Response(200, json=[{"text": "", "meta_info": meta}])

    t = SGLangHTTPTeacher("http://teacher", transport=_mock(handler), retry_backoff_s=0.0)
    assert t.score([[1, 2]]).token_logprobs[0].tolist() == [-0.5]
    assert calls == ["/generate", "/generate"]
    with pytest.raises(TeacherHTTPError, match="starting"):
        t.release()
    assert calls[2:] == ["/get_server_info", "/release_memory_occupation"]
    assert not t.asleep  # a failed release does not count as released


def test_null_logprob_past_entry_zero_is_nan_as_orjson_writes_it() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        meta = {"input_token_logprobs": [[None, 1, None], [None, 2, None], [-1.0, 3, None]]}
        return httpx.Response(200, json={"text": "", "meta_info": meta})

    t = SGLangHTTPTeacher("http://teacher/generate", transport=_mock(handler))
    assert t.url == "http://teacher"
    lp = t.score([[1, 2, 3]]).token_logprobs[0]
    assert math.isnan(lp[0]) and lp[1] == -1.0


def test_wrong_lengths_are_reported() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, json=[{"meta_info": {"input_token_logprobs": [[None, 1, None]]}}]
        )

    t = SGLangHTTPTeacher("http://teacher", transport=_mock(handler))
    with pytest.raises(Exception, match="expected 3"):
        t.score([[1, 2, 3]])


def test_unreachable_server_fails_fast_with_a_typed_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t = SGLangHTTPTeacher(f"http://127.0.0.1:{port}", timeout_s=2.0, retry_backoff_s=0.05)
    t0 = time.monotonic()
    with pytest.raises(TeacherUnreachable, match="cannot reach"):
        t.server_info()
    assert time.monotonic() - t0 < 2.0


def test_a_silent_server_times_out_within_the_limit() -> None:
    with socket.socket() as s:  # accepts connections (backlog) but never answers
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        t = SGLangHTTPTeacher(
            f"http://127.0.0.1:{s.getsockname()[1]}", timeout_s=0.6, max_retries=3
        )
        t0 = time.monotonic()
        with pytest.raises(TeacherUnreachable, match="no answer within 0.6 s"):
            t.score([[1, 2]])
        assert time.monotonic() - t0 < 1.5
