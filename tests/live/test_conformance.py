"""``probe --conformance`` against reference servers over loopback HTTP, and in process."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from distill_guard.cli import main
from distill_guard.live.canary import Canary
from distill_guard.live.conformance import (
    ConformanceReport,
    ConformanceRow,
    Result,
    format_conformance,
    model_name,
    redact_url,
    run_conformance,
    scrub,
    url_secrets,
)
from distill_guard.teachers import SGLangEngineTeacher, SGLangHTTPTeacher, TorchTeacher
from distill_guard.teachers._sglang_wire import score_request
from distill_guard.testing.engine_standin import EngineStandIn
from distill_guard.testing.reference_server import ReferenceServer, serve_in_thread
from distill_guard.testing.servers import reference_teacher
from distill_guard.testing.tiny import build_tiny_qwen3

API_KEY, ADMIN_KEY = "k3y-api-Zq81", "k3y-adm1n-Wp42"
SEQ = [list(range(5, 40))]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_qwen3(tmp_path_factory.mktemp("conformance_tiny"), vocab_size=512)


def canary() -> Canary:
    return Canary(length=16, top_k=4)


def rows_by_check(report: ConformanceReport) -> dict[str, ConformanceRow]:
    return {r.check: r for r in report.rows}


@contextmanager
def keyed_server(tiny_dir: Path, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> Iterator[str]:
    """A reference server with an API key and an admin key, both in the client's environment."""
    teacher = TorchTeacher.from_pretrained(tiny_dir, enable_cpu_backup=kw.pop("backup", True))
    server = ReferenceServer(teacher, api_key=API_KEY, admin_api_key=ADMIN_KEY, **kw)
    monkeypatch.setenv("SGLANG_API_KEY", API_KEY)
    monkeypatch.setenv("SGLANG_ADMIN_API_KEY", ADMIN_KEY)
    with serve_in_thread(server) as url:
        yield url


class Rewriting(httpx.BaseTransport):
    """The real server over loopback, with the answers of one path rewritten: a server that
    answers differently from its version, without touching the reference server."""

    def __init__(self, path: str, rewrite: Callable[[dict[str, Any], Any], Any]) -> None:
        self.inner = httpx.HTTPTransport()
        self.path = path
        self.rewrite = rewrite

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        resp = self.inner.handle_request(request)
        if request.url.path != self.path or resp.status_code != 200:
            return resp
        resp.read()
        sent = json.loads(request.content or b"{}")
        return httpx.Response(200, json=self.rewrite(sent, json.loads(resp.content)))


def test_every_row_passes_on_a_healthy_backed_up_0_5_23_with_keys(tiny_dir, monkeypatch) -> None:
    with keyed_server(tiny_dir, monkeypatch) as url, SGLangHTTPTeacher(url) as t:
        report = run_conformance(t, canary(), cycles=2)
        assert not t.asleep and t.state_unknown is None
    rows = rows_by_check(report)
    assert {r.check: r.result for r in report.rows} == {r.check: Result.PASS for r in report.rows}
    assert list(rows) == [
        "version",
        "route /server_info",
        "route pause (POST /continue_generation {})",
        "route /weights_checker checksum",
        "auth: scoring",
        "auth: admin",
        "backup",
        "tag kv_cache",
        "tag cuda_graph",
        "tag weights",
        "full sleep/wake ×2",
        "checksum",
        "temperature on input logprobs",
        "left as found",
    ]
    assert "refused without it (401)" in rows["auth: scoring"].observed
    assert "$SGLANG_API_KEY (set)" in rows["auth: scoring"].observed
    assert "refused without one (401)" in rows["auth: admin"].observed
    assert "2 cycle(s): max |Δ logprob| 0" in rows["full sleep/wake ×2"].observed
    assert "across 5 sleep(s): the same" in rows["checksum"].observed
    assert report.exit_code == 0 and "verdict: the server behaves" in report.verdict
    text = format_conformance(report) + json.dumps(report.to_json())
    assert API_KEY not in text and ADMIN_KEY not in text


def test_without_backup_the_weights_are_lost_repaired_and_verified_at_the_end(tiny_dir) -> None:
    expected = TorchTeacher.from_pretrained(tiny_dir).score(SEQ, top_k=4)
    with reference_teacher(tiny_dir) as (url, _), SGLangHTTPTeacher(url) as t:
        report = run_conformance(t, canary(), cycles=2)
        after = t.score(SEQ, top_k=4)
    rows = rows_by_check(report)
    assert rows["backup"].result is Result.WARN and "no_weights_backup" in rows["backup"].observed
    assert rows["tag weights"].observed.startswith("lost, repaired"), rows["tag weights"]
    assert rows["tag weights"].result is Result.PASS
    assert rows["tag kv_cache"].result is Result.PASS  # the tag alone kept the weights
    assert rows["full sleep/wake ×2"].observed.startswith("lost, repaired")
    assert rows["left as found"].result is Result.PASS
    assert "canary as at the start" in rows["left as found"].observed
    assert rows["auth: admin"].result is Result.WARN and "OPEN" in rows["auth: admin"].observed
    assert report.exit_code == 0  # the guard's assumptions hold; the configuration only warns
    assert torch.equal(after.topk_logprobs[0], expected.topk_logprobs[0])


def test_0_4_8_is_never_released_and_stays_alive(tiny_dir) -> None:
    with reference_teacher(tiny_dir, version="0.4.8") as (url, _), SGLangHTTPTeacher(url) as t:
        report = run_conformance(t, canary(), cycles=2)
        assert len(t.score(SEQ).token_logprobs[0]) == len(SEQ[0]) - 1
        assert httpx.get(url + "/health", timeout=5).status_code == 200
    rows = rows_by_check(report)
    cycled = ["tag kv_cache", "tag weights", "full sleep/wake ×2"]
    for name in cycled:
        assert rows[name].result is Result.SKIPPED, rows[name]
        assert "no pause route" in rows[name].observed, rows[name]
    assert "tag cuda_graph" not in rows  # not a tag before 0.5.5
    assert rows["route pause (POST /continue_generation {})"].observed == "absent (404)"
    assert rows["route /server_info"].result is Result.PASS
    assert rows["route /weights_checker checksum"].result is Result.SKIPPED
    assert not report.failed


def test_0_5_17_under_traffic_stays_alive_and_every_request_succeeds(tiny_dir) -> None:
    statuses: list[int] = []
    stop = threading.Event()
    with reference_teacher(tiny_dir, version="0.5.17", enable_cpu_backup=True, latency_s=0.3) as (
        url,
        _,
    ):

        def traffic() -> None:
            with httpx.Client(base_url=url, timeout=30) as c:
                while not stop.is_set():
                    body = score_request([list(range(5, 20))], 0, 0)
                    statuses.append(c.post("/generate", json=body).status_code)

        threads = [threading.Thread(target=traffic) for _ in range(2)]
        for th in threads:
            th.start()
        try:
            time.sleep(0.35)  # both in flight before the first check
            with SGLangHTTPTeacher(url, drain_timeout_s=0.5) as t:
                report = run_conformance(t, canary(), cycles=1)
        finally:
            stop.set()
            for th in threads:
                th.join(timeout=30)
        assert httpx.get(url + "/health", timeout=5).status_code == 200
        with SGLangHTTPTeacher(url) as t:
            assert len(t.score(SEQ).token_logprobs[0]) == len(SEQ[0]) - 1
    assert len(statuses) >= 4 and set(statuses) == {200}, statuses
    assert not report.failed, format_conformance(report)
    assert rows_by_check(report)["left as found"].result is Result.PASS


def test_a_checksum_shape_other_than_its_versions_fails(tiny_dir) -> None:
    """0.5.23 answers ``per_engine_checksum`` as a string; one that answers only per-tensor
    hashes is not the version it says (the guard still reads it, from the ranks)."""

    def per_tensor_only(sent: Any, body: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in body.items() if k != "per_engine_checksum"}

    with (
        reference_teacher(tiny_dir, enable_cpu_backup=True) as (url, _),
        SGLangHTTPTeacher(url, transport=Rewriting("/weights_checker", per_tensor_only)) as t,
    ):
        report = run_conformance(t, canary())
    row = rows_by_check(report)["route /weights_checker checksum"]
    assert row.result is Result.FAIL and row.observed.startswith("per-tensor hashes only"), row
    assert rows_by_check(report)["checksum"].result is Result.PASS
    assert report.failed == [row] and report.exit_code == 1


def test_a_server_that_applies_temperature_to_input_logprobs_fails(tiny_dir) -> None:
    def tempered(sent: dict[str, Any], items: Any) -> Any:
        t = float(sent.get("sampling_params", {}).get("temperature") or 0)
        if t not in (0.0, 1.0):
            for item in items if isinstance(items, list) else [items]:
                meta = item["meta_info"]
                for entry in meta["input_token_logprobs"][1:]:
                    entry[0] /= t
                for row in meta.get("input_top_logprobs", [])[1:]:
                    for entry in row:
                        entry[0] /= t
        return items

    with (
        reference_teacher(tiny_dir, enable_cpu_backup=True) as (url, _),
        SGLangHTTPTeacher(url, transport=Rewriting("/generate", tempered)) as t,
    ):
        report = run_conformance(t, canary(), temperature=2.0)
    row = rows_by_check(report)["temperature on input logprobs"]
    assert row.result is Result.FAIL and row.observed.startswith("APPLIED"), row
    assert report.failed == [row]


def test_an_interrupted_run_puts_the_teacher_back(tiny_dir) -> None:
    """Ctrl-C while the teacher is released: the probe's restore wakes it, and it scores as
    before; the interruption goes on."""
    expected = TorchTeacher.from_pretrained(tiny_dir).score(SEQ, top_k=4)

    class InterruptFirstResume(httpx.HTTPTransport):
        interrupted = False

        def handle_request(self, request: httpx.Request) -> httpx.Response:
            if request.url.path == "/resume_memory_occupation" and not self.interrupted:
                type(self).interrupted = True
                raise KeyboardInterrupt
            return super().handle_request(request)

    with (
        reference_teacher(tiny_dir, enable_cpu_backup=True) as (url, _),
        SGLangHTTPTeacher(url, transport=InterruptFirstResume()) as t,
    ):
        with pytest.raises(KeyboardInterrupt):
            run_conformance(t, canary())
        assert InterruptFirstResume.interrupted and not t.asleep
        assert torch.equal(t.score(SEQ, top_k=4).topk_logprobs[0], expected.topk_logprobs[0])


def test_a_resume_with_no_answer_halts_and_nothing_more_is_sent(tiny_dir) -> None:
    """A resume that got no answer may have run or not: a second resume and a forward on a
    released server both kill it, so after it nothing at all is sent, and the last row says so."""

    class NoAnswerToResume(httpx.HTTPTransport):
        paths: list[str] = []

        def handle_request(self, request: httpx.Request) -> httpx.Response:
            self.paths.append(request.url.path)
            if request.url.path == "/resume_memory_occupation":
                raise httpx.ReadTimeout("no answer", request=request)
            return super().handle_request(request)

    transport = NoAnswerToResume()
    with (
        reference_teacher(tiny_dir, enable_cpu_backup=True) as (url, _),
        SGLangHTTPTeacher(url, transport=transport) as t,
    ):
        report = run_conformance(t, canary())
        assert t.state_unknown is not None
    after = transport.paths[transport.paths.index("/resume_memory_occupation") + 1 :]
    assert after == [], after
    last = report.rows[-1]
    assert last.check == "left as found" and last.result is Result.FAIL
    assert last.observed.startswith("UNKNOWN") and "Nothing more was sent" in last.observed
    assert rows_by_check(report)["tag kv_cache"].result is Result.FAIL
    assert "tag cuda_graph" not in rows_by_check(report) and report.exit_code == 1


# -- in process --------------------------------------------------------------------------------


def test_in_process_engine_skips_the_http_rows_and_runs_the_rest(tiny_dir) -> None:
    engine = EngineStandIn(TorchTeacher.from_pretrained(tiny_dir))
    teacher = SGLangEngineTeacher(engine)
    report = run_conformance(teacher, canary(), cycles=1)
    rows = rows_by_check(report)
    assert (
        rows["routes"].result is Result.SKIPPED and rows["routes"].observed == "in process: no HTTP"
    )
    assert rows["auth"].result is Result.SKIPPED and rows["auth"].observed == "in process: no HTTP"
    assert rows["checksum"].result is Result.SKIPPED
    for name in ("tag kv_cache", "tag cuda_graph", "temperature on input logprobs"):
        assert rows[name].result is Result.PASS, rows[name]
    assert rows["tag weights"].observed.startswith("lost, repaired"), rows["tag weights"]
    assert rows["left as found"].result is Result.PASS and not teacher.asleep
    assert (
        not engine.offload_tags
        and [name for name, _ in engine.calls].count("update_weights_from_disk") == 2
    )  # weights, full cycle
    assert report.url == "in process" and report.model == tiny_dir.name
    assert not report.failed


# -- output and the CLI -------------------------------------------------------------------------


def test_the_header_redacts_userinfo_and_the_model_path() -> None:
    assert redact_url("http://bob:pa55@10.0.0.1:30000/x?token=t0k") == (
        "http://<redacted>@10.0.0.1:30000/x?<redacted>"
    )
    assert redact_url("http://127.0.0.1:30000") == "http://127.0.0.1:30000"
    assert model_name("/home/alice/ckpt/Qwen3-8B/") == "Qwen3-8B"
    secrets = url_secrets("http://bob:pa55@h:1")
    assert scrub("cannot reach http://bob:pa55@h:1/generate", secrets) == (
        "cannot reach http://<redacted>@h:1/generate"
    )
    assert scrub("a table, Bearer a", ["a"]) == "<redacted> table, Bearer <redacted>"
    assert scrub(f"x{API_KEY}y", [API_KEY]) == "x<redacted>y"
    report = ConformanceReport("http://<redacted>@h:1", "0.5.23", "Qwen3-8B")
    report.rows = [ConformanceRow("a|b", "x", "y", Result.FAIL)]
    text = format_conformance(report).splitlines()
    assert text[0].startswith("conformance probe: the teacher must be awake")
    assert "SGLang 0.5.23" in text[1] and "model Qwen3-8B" in text[1]
    assert r"| a\|b | x | y | FAIL |" in text and text[-1].startswith("verdict: FAIL")


def test_cli_prints_the_table_exits_0_and_never_a_key(tiny_dir, monkeypatch, capsys) -> None:
    with keyed_server(tiny_dir, monkeypatch) as url:
        assert main(["probe", "--conformance", "--url", url, "--cycles", "1"]) == 0
        out, err = capsys.readouterr()
        assert main(["probe", "--conformance", "--url", url, "--cycles", "1", "--json"]) == 0
        js, err2 = capsys.readouterr()
    assert "| check | the guard assumes | observed | result |" in out
    assert out.splitlines()[0].startswith("conformance probe: the teacher must be awake")
    assert "| FAIL |" not in out and "verdict: the server behaves as the guard assumes" in out
    parsed = json.loads(js)
    assert parsed["ok"] is True and {r["result"] for r in parsed["rows"]} == {"pass"}
    for text in (out, err, js, err2):
        assert API_KEY not in text and ADMIN_KEY not in text


def test_cli_exits_1_on_a_refused_admin_key_and_shows_no_key(tiny_dir, monkeypatch, capsys) -> None:
    with keyed_server(tiny_dir, monkeypatch) as url:
        monkeypatch.setenv("SGLANG_ADMIN_API_KEY", "wr0ng-adm1n-key")
        assert main(["probe", "--conformance", "--url", url, "--cycles", "1"]) == 1
        out, err = capsys.readouterr()
        monkeypatch.setenv("SGLANG_ADMIN_API_KEY", ADMIN_KEY)
        with SGLangHTTPTeacher(url) as t:  # left serving
            assert len(t.score(SEQ).token_logprobs[0]) == len(SEQ[0]) - 1
    assert "| auth: admin |" in out and "refused (401)" in out
    assert "verdict: FAIL" in out
    for text in (out, err):
        assert "wr0ng-adm1n-key" not in text and API_KEY not in text and ADMIN_KEY not in text


def test_cli_exits_2_in_one_line_when_the_probe_cannot_start(tiny_dir, monkeypatch, capsys) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dead = f"http://bob:pa55w0rd@127.0.0.1:{port}"
    assert main(["probe", "--conformance", "--url", dead, "--timeout", "1"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "pa55w0rd" not in err and "cannot reach" in err
    with keyed_server(tiny_dir, monkeypatch) as url:
        monkeypatch.setenv("SGLANG_API_KEY", "wr0ng-api-key")
        assert main(["probe", "--conformance", "--url", url]) == 2
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if line.startswith("distill-guard")]
    assert len(said) == 1 and "Traceback" not in err, err
    assert "HTTP 401" in said[0] and "/get_server_info" in said[0]
    assert "wr0ng-api-key" not in err and API_KEY not in err


def test_cli_redacts_the_urls_userinfo_in_the_table(tiny_dir, capsys) -> None:
    with reference_teacher(tiny_dir, enable_cpu_backup=True) as (url, _):
        with_userinfo = url.replace("http://", "http://bob:pa55w0rd@")
        assert main(["probe", "--conformance", "--url", with_userinfo, "--cycles", "1"]) == 0
    out = capsys.readouterr().out
    assert "pa55w0rd" not in out and "bob" not in out
    assert f"teacher {url.replace('http://', 'http://<redacted>@')} ·" in out


def test_cli_refuses_what_conformance_would_ignore(capsys) -> None:
    for extra in (["--tags", "weights"], ["--no-repair"], ["--teacher-temperature", "1"]):
        assert main(["probe", "--conformance", "--url", "http://127.0.0.1:9", *extra]) == 2
    assert main(["probe", "--url", "http://127.0.0.1:9", "--teacher-temperature", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("distill-guard probe: error:") == 4
    assert "drop --tags" in err and "drop --no-repair" in err and "differ from 1" in err
    assert "only with --conformance" in err
