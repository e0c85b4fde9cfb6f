"""Every network call of the package has a total deadline, not httpx's per-read one: the SGLang
transport (scoring, ``status_without_key``), the reference server's ``/health`` wait, and the
deadline backend itself, against ``tests/_drip.py`` on 127.0.0.1 (the webhook's own cases are in
``tests/test_webhook.py``)."""

from __future__ import annotations

import time

import httpx
import pytest

from distill_guard.http_deadline import WRITE_PIECE, bound, deadline_at, is_bounded
from distill_guard.teachers import SGLangHTTPTeacher, TeacherError, TeacherUnreachable
from distill_guard.teachers.sglang_transport import SGLangTransport
from distill_guard.testing.servers import wait_healthy
from tests._drip import DripServer

TIMEOUT_S = 1.0
MARGIN_S = 1.5


@pytest.mark.parametrize("mode", ["headers", "body", "silent"])
def test_a_teacher_that_drips_its_answer_or_its_headers_is_cut_at_the_deadline(mode):
    """Headers dripped a byte every 0.2 s held a scoring call past its deadline before: the
    per-chunk check saw only the body, and every read of the headers got the full timeout."""
    with DripServer(mode, every_s=0.2) as server:
        teacher = SGLangHTTPTeacher(server.url, timeout_s=TIMEOUT_S, max_retries=1)
        t0 = time.monotonic()
        with pytest.raises(TeacherError, match=r"no answer within 1 s"):
            teacher.score([[1, 2]], top_k=0)
        assert time.monotonic() - t0 < TIMEOUT_S + MARGIN_S
        teacher.close()


# one request, read whole inside its deadline_at block: the backend cuts the body as it cuts
# the headers (the teacher's cases above hold it to both), so the body's case is make test-all's
HEADERS_THEN_BODY = ["headers", pytest.param("body", marks=pytest.mark.slow)]


@pytest.mark.parametrize("mode", HEADERS_THEN_BODY)
def test_status_without_key_is_bounded_in_total(mode):
    """The conformance probe's keyless request: a plain httpx request before, per read only."""
    with DripServer(mode, every_s=0.2) as server:
        http = SGLangTransport(server.url, timeout_s=TIMEOUT_S)
        t0 = time.monotonic()
        with pytest.raises(TeacherUnreachable, match=r"/generate: no answer \(ReadTimeout\)"):
            http.status_without_key("POST", "/generate", {"input_ids": [1, 2]})
        assert time.monotonic() - t0 < TIMEOUT_S + MARGIN_S
        http.close()


def test_the_transport_still_talks_to_a_healthy_server():
    with DripServer("ok") as server:
        http = SGLangTransport(server.url, timeout_s=TIMEOUT_S)
        assert http.status_without_key("POST", "/generate", {}) == 200
        assert http.request("GET", "/health", idempotent=True).text == "ok"
        http.close()
        assert len(server.requests) == 2


class Running:
    """A process that is still starting (``poll`` is None), for :func:`wait_healthy`."""

    returncode = None
    stdout = None

    def poll(self) -> None:
        return None


@pytest.mark.parametrize("mode", HEADERS_THEN_BODY)
def test_waiting_for_the_reference_server_is_bounded_by_its_deadline(mode):
    """``reference_subprocess``'s ``/health`` poll: each probe had httpx's per-read timeout of
    1 s, so a dripping answer held the wait past ``timeout_s``."""
    with DripServer(mode, every_s=0.2) as server:
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match="did not answer"):
            wait_healthy(Running(), server.url, timeout_s=1.5)
        assert time.monotonic() - t0 < 1.5 + MARGIN_S


def test_waiting_for_a_healthy_reference_server_returns_at_once():
    with DripServer("ok") as server:
        t0 = time.monotonic()
        wait_healthy(Running(), server.url, timeout_s=5)
        assert time.monotonic() - t0 < 1


def test_every_pool_of_a_client_gets_the_deadline_backend(monkeypatch):
    """Pinned, since :func:`bound` reaches into httpx's and httpcore's pools: an httpx that
    moves them fails here, not silently in a run. Proxies from the environment count too."""
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    client = httpx.Client()
    assert client._mounts and not is_bounded(client)
    assert is_bounded(bound(client))
    client.close()
    assert is_bounded(SGLangTransport("http://127.0.0.1:9")._client)
    mocked = bound(httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(204))))
    assert mocked.get("http://x/").status_code == 204  # a mock has no pool: left as it is


def test_the_deadline_cuts_a_drip_outside_any_teacher():
    with DripServer("headers", every_s=0.2) as server, bound(httpx.Client(timeout=5)) as client:
        t0 = time.monotonic()
        with pytest.raises(httpx.ReadTimeout), deadline_at(time.monotonic() + 0.6):
            client.get(server.url)
        assert 0.5 < time.monotonic() - t0 < 0.6 + 0.5
        with deadline_at(time.monotonic() - 1), pytest.raises(httpx.ConnectTimeout):
            client.get(server.url)  # already past: not even a connect
        assert len(server.requests) == 1


def test_a_body_larger_than_a_write_piece_goes_out_whole():
    with DripServer("ok") as server, bound(httpx.Client(timeout=5)) as client:
        body = b"x" * (3 * WRITE_PIECE + 17)
        with deadline_at(time.monotonic() + 5):
            assert client.post(server.url, content=body).text == "ok"
        (request,) = server.requests
        assert request.endswith(b"\r\n\r\n" + body)


def test_a_name_is_looked_up_within_the_deadline():
    with (
        DripServer("ok") as server,
        bound(httpx.Client(timeout=5)) as client,
        deadline_at(time.monotonic() + 5),
    ):
        assert client.get(f"http://localhost:{server.port}/").text == "ok"  # ::1 is refused
