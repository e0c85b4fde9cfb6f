"""SGLang's ``token_ids_logprob``: the logprob of given ids at every scored position, as the
HTTP client, the in-process teacher and the reference server each give it, and the ids SGLang
would die on (past the vocabulary) never sent."""

from __future__ import annotations

import httpx
import pytest
import torch

from distill_guard.errors import GuardValueError
from distill_guard.teachers import SGLangHTTPTeacher, TorchTeacher

from .test_sglang_http import assert_gone

SEQS = [list(range(3, 30)), [5, 9, 2, 2, 2, 2, 41]]
IDS = [[7, 3, 7, 511], [0, 11]]  # a repeat, and the last id of the vocabulary


@pytest.mark.parametrize("start", [0, 4])
def test_given_ids_are_scored_over_http_as_in_process(tiny_dir, serve, start) -> None:
    url, _ = serve(tiny_dir)
    local = TorchTeacher.from_pretrained(tiny_dir)
    want = local.score_token_ids(SEQS, IDS, logprob_start_len=start)
    full = local.score(SEQS, logprob_start_len=start)
    with SGLangHTTPTeacher(url) as remote:
        got = remote.score_token_ids(SEQS, IDS, logprob_start_len=start)
    # the server's process computes with its own thread count, so float32 may differ in the
    # last bits (seen: 1.9e-6 at |logprob| ≈ 18, one ulp, on a 2-core AMD EPYC); a wrong id or
    # offset is off by O(1)
    for seq, ids, a, b in zip(SEQS, IDS, got.token_ids_logprobs, want.token_ids_logprobs):
        assert a.shape == (len(seq) - start - 1, len(ids))
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    assert torch.equal(got.token_ids_logprobs[0][:, 0], got.token_ids_logprobs[0][:, 2])  # repeats
    for a, b in zip(got.token_logprobs, full.token_logprobs):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_the_wire_shape_is_sglangs(tiny_dir, serve) -> None:
    url, _ = serve(tiny_dir)
    body = {"input_ids": [1, 2, 3, 4], "sampling_params": {"max_new_tokens": 0},
            "return_logprob": True, "logprob_start_len": 1, "token_ids_logprob": [9, 4]}  # fmt: skip
    meta = httpx.post(url + "/generate", json=body).json()["meta_info"]
    rows = meta["input_token_ids_logprobs"]
    assert rows[0] is None and len(rows) == len(meta["input_token_logprobs"]) == 3
    assert [[e[1] for e in row] for row in rows[1:]] == [[9, 4], [9, 4]]


def test_an_id_past_the_vocabulary_is_refused_before_it_is_sent(tiny_dir, serve) -> None:
    url, _ = serve(tiny_dir)
    with SGLangHTTPTeacher(url) as remote:
        for bad, why in (
            ([[512]], "outside the vocabulary"),
            ([[-1]], "outside"),
            ([[]], "non-empty"),
        ):
            with pytest.raises(GuardValueError, match=why):
                remote.score_token_ids(SEQS[:1], bad)
        with pytest.raises(GuardValueError, match="one each"):
            remote.score_token_ids(SEQS, [[1]])
        remote.score(SEQS)  # nothing was sent: the server still serves


def test_a_raw_id_past_the_vocabulary_kills_the_reference_server(tiny_dir, serve) -> None:
    """Up to 0.5.13 SGLang indexes its logprobs with the ids unchecked: a device-side assert on
    a GPU (from 0.5.14 it refuses them: tests/testing/test_reference_server_versions.py)."""
    url, _ = serve(tiny_dir, version="0.5.13")
    body = {"input_ids": [1, 2, 3, 4], "sampling_params": {"max_new_tokens": 0},
            "return_logprob": True, "token_ids_logprob": [512]}  # fmt: skip
    assert httpx.post(url + "/generate", json=body).status_code == 500
    assert_gone(url)


def test_a_raw_negative_id_is_read_as_torch_indexing_reads_it(tiny_dir, serve) -> None:
    """Up to 0.5.13 a negative id is no error: it indexes from the end of the vocabulary."""
    url, _ = serve(tiny_dir, version="0.5.13")
    body = {"input_ids": [1, 2, 3, 4], "sampling_params": {"max_new_tokens": 0},
            "return_logprob": True, "logprob_start_len": 0, "token_ids_logprob": [-1, 511]}  # fmt: skip
    rows = httpx.post(url + "/generate", json=body).json()["meta_info"]["input_token_ids_logprobs"]
    assert all(row[0][0] == row[1][0] and row[0][1] == -1 for row in rows[1:])


def test_a_different_set_of_ids_per_row_is_scored_in_windows(tiny_dir, serve) -> None:
    from distill_guard.teachers.per_row_ids import score_ids_per_row

    url, _ = serve(tiny_dir)
    local = TorchTeacher.from_pretrained(tiny_dir)
    seq, start = SEQS[0], 5
    rows = len(seq) - start - 1
    row_ids = torch.randint(0, 512, (rows, 4), generator=torch.Generator().manual_seed(0))
    logp = torch.log_softmax(
        local.model(input_ids=torch.tensor([seq])).logits[0, start:-1].float(), -1
    ).detach()
    want = logp.gather(1, row_ids)
    with SGLangHTTPTeacher(url) as remote:
        for budget in (8, 40, 1 << 16):  # one row a window, a few rows, all rows at once
            got = score_ids_per_row(remote, seq, start, row_ids, max_entries=budget)
            torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    with pytest.raises(GuardValueError, match=r"must be \[21, K\]"):
        score_ids_per_row(local, seq, start, row_ids[1:])


def _concurrently(*calls):
    """Run each call in its own thread at once; return their results (an exception as it is)."""
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(c) for c in calls]
        out = []
        for f in futures:
            try:
                out.append(f.result(timeout=20))
            except Exception as e:  # noqa: BLE001 - the test reads it
                out.append(e)
        return out


@pytest.mark.parametrize("version", ["0.5.12", "0.5.16"])
def test_the_clients_requests_follow_traffic_that_carries_ids(tiny_dir, serve, version) -> None:
    """SGLang 0.5.10–0.5.15 die on a prefill batch mixing ``token_ids_logprob`` with a logprob
    request without it: a client told the traffic carries ids sends ids with its own top-k
    scoring (the canary's request) too, so the two run in one batch and the server lives."""
    url, _ = serve(tiny_dir, version=version, latency_s=0.3)
    host = SGLangHTTPTeacher(url, traffic_token_ids=True)
    guard = SGLangHTTPTeacher(url, traffic_token_ids=True)
    local = TorchTeacher.from_pretrained(tiny_dir)
    with host, guard:
        by_ids, canary = _concurrently(
            lambda: host.score_token_ids(SEQS, IDS), lambda: guard.score(SEQS, top_k=4)
        )
        assert not isinstance(by_ids, Exception) and not isinstance(canary, Exception)
        want = local.score(SEQS, top_k=4)
        for a, b in zip(canary.topk_logprobs, want.topk_logprobs):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-6)  # the ids asked change nothing
        guard.score(SEQS)  # still serving


def test_a_client_told_no_ids_never_sends_them_where_mixing_kills(tiny_dir, serve) -> None:
    """Where the traffic carries no ids, ``score_token_ids`` is refused before anything is sent
    on 0.5.10–0.5.15 (it would kill the server beside the traffic's logprob requests), and is
    served from 0.5.16."""
    from distill_guard.teachers import TeacherStateError

    url, _ = serve(tiny_dir, version="0.5.15")
    with SGLangHTTPTeacher(url) as remote:
        with pytest.raises(TeacherStateError, match="0.5.16"):
            remote.score_token_ids(SEQS, IDS)
        remote.score(SEQS, top_k=2)  # nothing was sent: the server still serves
    url, _ = serve(tiny_dir, version="0.5.16")
    with SGLangHTTPTeacher(url) as remote:
        remote.score_token_ids(SEQS, IDS)


def test_without_the_rule_the_mixed_batch_kills_the_reference_server(tiny_dir, serve) -> None:
    """What the rule prevents: on 0.5.12 a top-k request without ids running beside one with
    ids kills the server (the client bypassed with ``traffic_token_ids=True`` on one side
    only, as a host that never told the guard would)."""
    # 1 s of running: the two requests overlap (one batch) even on a loaded machine
    url, _ = serve(tiny_dir, version="0.5.12", latency_s=1.0)
    host = SGLangHTTPTeacher(url, traffic_token_ids=True, max_retries=0)
    guard = SGLangHTTPTeacher(url, max_retries=0)  # told no ids: its top-k request carries none
    with host, guard:
        results = _concurrently(
            lambda: host.score_token_ids(SEQS, IDS), lambda: guard.score(SEQS, top_k=4)
        )
    assert any(isinstance(r, Exception) for r in results)
    assert_gone(url)
