"""Malformed and over-long requests to the reference server: SGLang's JSON 400s, never a plain
500, and the server lives on (real loopback HTTP)."""

from __future__ import annotations

import httpx
import pytest

from distill_guard.teachers import SGLangHTTPTeacher, TeacherHTTPError
from distill_guard.testing.servers import reference_teacher
from distill_guard.testing.tiny import build_tiny_qwen3

CONTEXT = 16


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = build_tiny_qwen3(
        tmp_path_factory.mktemp("short_ctx"), vocab_size=64, max_positions=CONTEXT
    )
    with reference_teacher(model) as (url, _):
        yield url


def _score(**fields):
    return {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 0}, **fields}


MALFORMED = {
    "start_not_int": _score(return_logprob=True, logprob_start_len="zero"),
    "start_below_minus_one": _score(return_logprob=True, logprob_start_len=-5),
    "top_k_negative": _score(return_logprob=True, top_logprobs_num=-1),
    "top_k_float": _score(return_logprob=True, top_logprobs_num=2.5),
    "start_bool": _score(return_logprob=True, logprob_start_len=True),
    "sampling_params_string": {"input_ids": [1, 2], "sampling_params": "greedy"},
    "id_above_vocab": _score(input_ids=[1, 64], return_logprob=True),
    "negative_id": _score(input_ids=[1, -3], return_logprob=True),
    "nested_too_deep": _score(input_ids=[[[1, 2]]]),
    "per_item_length_mismatch": _score(input_ids=[[1, 2], [3, 4]], logprob_start_len=[0]),
    "not_an_object": [1, 2, 3],
}


@pytest.mark.parametrize("body", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_request_is_a_json_400_and_the_server_lives(server, body):
    r = httpx.post(f"{server}/generate", json=body, timeout=10)
    assert r.status_code == 400, r.text
    error = r.json()["error"]  # JSON, in one of SGLang's two error shapes
    message = error["message"] if isinstance(error, dict) else error
    assert message
    assert httpx.get(f"{server}/health", timeout=10).status_code == 200


def test_an_input_at_the_context_length_is_refused_as_sglang_refuses_it(server):
    info = httpx.get(f"{server}/server_info", timeout=10).json()
    assert info["max_req_input_len"] == CONTEXT - 1
    r = httpx.post(
        f"{server}/generate", json=_score(input_ids=list(range(CONTEXT - 1))), timeout=10
    )
    assert r.status_code == 200
    r = httpx.post(f"{server}/generate", json=_score(input_ids=list(range(CONTEXT))), timeout=10)
    assert r.status_code == 400
    assert r.json()["error"]["message"] == (
        f"The input ({CONTEXT} tokens) is longer than the model's context length "
        f"({CONTEXT} tokens)."
    )


def test_the_client_reports_an_over_long_input_without_retrying_it(server):
    teacher = SGLangHTTPTeacher(server, timeout_s=10, max_retries=2)
    with pytest.raises(TeacherHTTPError, match="context length") as err:
        teacher.score([list(range(CONTEXT + 4))])
    assert err.value.status == 400
    teacher.close()
