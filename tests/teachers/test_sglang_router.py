"""The router table (``docs/sglang-contract.md`` §8), a test per row, against the real
``sglang-router`` 0.3.2 started on loopback in front of reference servers.

Each test is named ``test_row_R<n>_...`` after its row; ``test_every_row_has_a_test`` holds the
table and this file to each other.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip(
    "sglang_router", reason="needs sglang-router: pip install 'distill_guard[router]'"
)

from distill_guard.teachers.sglang_router import ROUTER_VERSION, RouterError, SGLangRouter  # noqa: E402
from distill_guard.testing.router import reference_replicas, sglang_router  # noqa: E402

DOC = Path(__file__).resolve().parents[2] / "docs" / "sglang-contract.md"
SCORE = {
    "input_ids": [[1, 2, 3, 4, 5], [6, 7, 8]],
    "sampling_params": {"max_new_tokens": 0, "temperature": 0},
    "return_logprob": True,
    "logprob_start_len": 0,
    "top_logprobs_num": 3,
}


@pytest.fixture(scope="module")
def fleet(tiny_dir):
    """Four reference replicas (weights kept) behind one router with health checks off."""
    with (
        reference_replicas(tiny_dir, [True] * 4) as replicas,
        sglang_router([r.url for r in replicas]) as url,
    ):
        yield replicas, url


def _burst(client: httpx.Client, url: str, replicas, n: int) -> list[int]:
    before = [r.calls["generate"] for r in replicas]
    for _ in range(n):
        assert client.post(url + "/generate", json=SCORE).status_code == 200
    return [r.calls["generate"] - b for r, b in zip(replicas, before)]


def test_the_installed_router_is_the_one_the_table_was_read_from() -> None:
    from importlib.metadata import version

    assert version("sglang-router") == ROUTER_VERSION


def test_row_R1_get_workers_lists_each_worker_with_its_url_and_health(fleet) -> None:
    replicas, url = fleet
    body = httpx.get(url + "/workers").json()
    assert body["total"] == 4 and body["stats"]["regular_count"] == 4
    entries = {w["url"]: w for w in body["workers"]}
    assert set(entries) == {r.url for r in replicas}
    for w in entries.values():
        assert re.fullmatch(r"[0-9a-f-]{36}", w["id"]) and w["is_healthy"] is True
        assert w["disable_health_check"] is True  # started with --disable-health-check
    with SGLangRouter(url) as router:
        assert {w.url for w in router.workers()} == set(entries)
        assert all(w.healthy and not w.health_check for w in router.workers())


def test_row_R2_generate_round_robins_and_passes_the_scoring_request_as_sent(fleet) -> None:
    replicas, url = fleet
    with httpx.Client(timeout=10) as client:
        assert _burst(client, url, replicas, 40) == [10, 10, 10, 10]
        routed = client.post(url + "/generate", json=SCORE).json()
        direct = client.post(replicas[0].url + "/generate", json=SCORE).json()
        assert [r["meta_info"]["input_token_logprobs"] for r in routed] == [
            d["meta_info"]["input_token_logprobs"] for d in direct
        ]
        assert [r["meta_info"]["input_top_logprobs"] for r in routed] == [
            d["meta_info"]["input_top_logprobs"] for d in direct
        ]
        # token_ids_logprob is one flat list of ids in the router's GenerateRequest: one list
        # per input, which SGLang takes, is refused before any worker sees it
        before = [r.calls["generate"] for r in replicas]
        per_input = {**SCORE, "token_ids_logprob": [[5, 6], [7]]}
        refused = client.post(url + "/generate", json=per_input)
        assert refused.status_code == 422 and "token_ids_logprob" in refused.text
        assert [r.calls["generate"] for r in replicas] == before
        flat = client.post(url + "/generate", json={**SCORE, "token_ids_logprob": [5, 6]})
        assert flat.status_code == 200


def test_row_R3_a_deleted_worker_is_unlisted_and_gets_no_generate(fleet) -> None:
    replicas, url = fleet
    out = replicas[1]
    with httpx.Client(timeout=10) as client, SGLangRouter(url) as router:
        listed = router.worker(out.url)
        assert listed is not None
        resp = client.delete(f"{url}/workers/{listed.id}")
        assert resp.status_code == 202
        assert resp.json()["status"] == "accepted" and resp.json()["worker_id"] == listed.id
        t0 = time.monotonic()
        while router.worker(out.url) is not None:
            assert time.monotonic() - t0 < 5
            time.sleep(0.01)
        try:
            assert _burst(client, url, replicas, 30) == [10, 0, 10, 10]
            gone = client.delete(f"{url}/workers/{listed.id}")
            assert gone.status_code == 404 and gone.json()["code"] == "WORKER_NOT_FOUND"
            bad = client.delete(f"{url}/workers/not-a-uuid")
            assert bad.status_code == 400 and bad.json()["code"] == "BAD_REQUEST"
        finally:
            router.add(out.url, listed)


def test_row_R4_a_posted_worker_is_registered_with_one_health_call_under_a_new_id(fleet) -> None:
    replicas, url = fleet
    back = replicas[2]
    with httpx.Client(timeout=10) as client, SGLangRouter(url) as router:
        listed = router.remove(back.url)
        assert listed is not None and router.worker(back.url) is None
        health = back.calls["health"]
        resp = client.post(url + "/workers", json=listed.registration())
        assert resp.status_code == 202 and resp.json()["status"] == "accepted"
        new_id = resp.json()["worker_id"]
        assert new_id != listed.id and resp.headers["location"] == f"/workers/{new_id}"
        t0 = time.monotonic()
        while not ((w := router.worker(back.url)) and w.healthy):
            assert time.monotonic() - t0 < 5
            time.sleep(0.01)
        assert w.id == new_id and not w.health_check  # as it was listed before
        assert back.calls["health"] - health == 1  # registration's one GET /health
        again = client.post(url + "/workers", json={"url": back.url})
        assert again.status_code == 202
        time.sleep(0.3)
        assert len([x for x in router.workers() if x.url == back.url]) == 1  # not twice
        assert _burst(client, url, replicas, 40) == [10, 10, 10, 10]


def test_row_R5_the_health_checker_gets_health_of_every_worker_at_its_interval(tiny_dir) -> None:
    """Two routers side by side over the same 2.2 s: one started with
    ``--disable-health-check`` (the replica set-up's), then one checking at a 1 s interval, each
    with its own workers. The checking one last, so that its workers' counts are read as soon as
    it is up (before its checker's first round), as with a router of its own."""
    extra = ["--health-check-interval-secs", "1"]
    with (
        reference_replicas(tiny_dir, [True, True]) as checked,
        reference_replicas(tiny_dir, [True, True]) as unchecked,
        sglang_router([r.url for r in unchecked], health_check=False, extra=extra),
        sglang_router([r.url for r in checked], health_check=True, extra=extra),
    ):
        replicas = [*checked, *unchecked]
        start = [r.calls["health"] for r in replicas]
        assert start == [1, 1, 1, 1]  # the registration's GET /health (R4)
        time.sleep(2.2)
        grown = [r.calls["health"] - s for r, s in zip(replicas, start)]
    assert min(grown[:2]) >= 2  # about one a second each, whatever the worker is doing
    assert grown[2:] == [0, 0]


def test_row_R6_worker_routes_take_the_router_api_key(tiny_dir, monkeypatch) -> None:
    with (
        reference_replicas(tiny_dir, [True]) as replicas,
        sglang_router([replicas[0].url], extra=["--api-key", "router-key"]) as url,
    ):
        assert httpx.get(url + "/workers").status_code == 401
        bearer = {"Authorization": "Bearer router-key"}
        assert httpx.get(url + "/workers", headers=bearer).status_code == 200
        with pytest.raises(Exception, match="401"), SGLangRouter(url, api_key_env=None) as r:
            r.workers()
        monkeypatch.setenv("SGLANG_ROUTER_API_KEY", "router-key")
        with SGLangRouter(url) as router:
            assert [w.url for w in router.workers()] == [replicas[0].url]


def test_row_R7_with_no_worker_listed_generate_answers_503(tiny_dir) -> None:
    with (
        reference_replicas(tiny_dir, [True]) as replicas,
        sglang_router([replicas[0].url]) as url,
        SGLangRouter(url, settle_timeout_s=5) as router,
    ):
        router.remove(replicas[0].url)
        resp = httpx.post(url + "/generate", json=SCORE)
        assert resp.status_code == 503 and "no_available_workers" in resp.text
        assert replicas[0].calls["generate"] == 0
        assert router.remove(replicas[0].url) is None  # not listed: nothing to take out


def test_row_R8_a_routed_answer_does_not_name_the_worker_that_served(fleet) -> None:
    replicas, url = fleet
    ports = [str(httpx.URL(r.url).port) for r in replicas]
    with httpx.Client(timeout=10) as client:
        direct = client.post(replicas[0].url + "/generate", json=SCORE)
        added = set()
        for _ in range(8):  # two rounds of the round robin: every worker served twice
            routed = client.post(url + "/generate", json=SCORE)
            assert routed.status_code == 200
            added |= set(routed.headers) - set(direct.headers)
            said = " ".join([routed.text, *routed.headers.values()])
            # a port as a number of its own: the answer's logprobs are long runs of digits,
            # in which a worker's five digits turn up by chance (one run in a few failed so)
            named = [p for p in ports if re.search(rf"(?<!\d){p}(?!\d)", said)]
            assert named == [] and "127.0.0.1" not in said, named
            assert [a["meta_info"].keys() for a in routed.json()] == [
                d["meta_info"].keys() for d in direct.json()
            ]
        assert added == {
            "x-request-id",
            "vary",
            "access-control-allow-origin",
            "access-control-expose-headers",
        }


def test_router_client_errors_are_typed(tiny_dir) -> None:
    """A worker that never comes back healthy is a RouterError within settle_timeout_s."""
    with (
        reference_replicas(tiny_dir, [True]) as replicas,
        sglang_router([replicas[0].url]) as url,
        SGLangRouter(url, settle_timeout_s=0.5) as router,
    ):
        dead = f"http://127.0.0.1:{httpx.URL(replicas[0].url).port + 1}"
        with pytest.raises(RouterError, match="not listed healthy"):
            router.add(dead)


def test_every_row_has_a_test() -> None:
    section = DOC.read_text(encoding="utf-8").split("## 8. ", 1)[1]
    rows = set(re.findall(r"^\| (R\d+) \|", section, re.M))
    tested = {m.group(1) for m in re.finditer(r"def test_row_(R\d+)_", Path(__file__).read_text())}
    assert rows and rows == tested
