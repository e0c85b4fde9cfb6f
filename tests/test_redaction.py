"""One redaction for everything the package prints, logs or records: a key planted in every
place a user can put one, servers that echo everything they are sent, and every output
grepped for it."""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
import torch

from distill_guard import build_guard, redaction
from distill_guard.cli import main
from distill_guard.errors import GuardError
from distill_guard.findings import Code, Finding, Severity

API_KEY = "sk-APIkey-0001-secret"
ADMIN_KEY = "adm-ADMINkey-0002"
HOOK_PATH_KEY = "XyZ0003hookSecret"
HOOK_TOKEN = "tok0004QUERYsecret"
PASSWORD = "pw0005USERINFO"
USER = "admin0006user"
PLANTED = (API_KEY, ADMIN_KEY, HOOK_PATH_KEY, HOOK_TOKEN, PASSWORD, USER)


class Echo(BaseHTTPRequestHandler):
    """Answers every request with ``status`` and a body that echoes all it was sent: the request
    line (path and query), every header (the Authorization key) and the body."""

    status = 500

    def _echo(self) -> None:
        n = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(n).decode(errors="replace") if n else ""
        text = f"{self.command} {self.path}\n{self.headers}\n{body}"
        data = json.dumps({"error": {"message": text}}).encode()
        self.send_response(self.status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _echo

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def echo_server(status: int) -> Iterator[int]:
    handler = type("EchoStatus", (Echo,), {"status": status})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    # polled every 50 ms, not serve_forever's 0.5 s: shutdown() waits for one poll
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def leaks(text: str) -> list[str]:
    """The planted secrets in ``text``, in any form a server or serializer writes them."""
    return [s for s in PLANTED for form in {s, quote(s, safe="")} if form in text]


@pytest.fixture
def planted(monkeypatch, tmp_path):
    """Keys in the environment, a webhook URL whose path and query hold keys, a teacher URL
    with userinfo; both servers echo everything back in their errors."""
    with echo_server(500) as teacher_port, echo_server(404) as hook_port:
        monkeypatch.setenv("SGLANG_API_KEY", API_KEY + "\n")  # a mounted secret's newline
        monkeypatch.setenv("SGLANG_ADMIN_API_KEY", ADMIN_KEY)
        hook = f"http://127.0.0.1:{hook_port}/services/T0/{HOOK_PATH_KEY}?token={HOOK_TOKEN}"
        monkeypatch.setenv("DISTILL_GUARD_WEBHOOK_URL", hook)
        monkeypatch.setenv("WANDB_MODE", "offline")
        yield f"http://{USER}:{PASSWORD}@127.0.0.1:{teacher_port}", tmp_path


def test_no_planted_key_reaches_any_output(planted, capsys, caplog) -> None:
    teacher_url, tmp = planted
    from distill_guard.teachers import SGLangHTTPTeacher

    caplog.set_level(logging.DEBUG)
    events = tmp / "events.jsonl"
    wandb = pytest.importorskip("wandb")

    run = wandb.init(mode="offline", dir=str(tmp), project="redaction")
    guard = build_guard(
        "default",
        [
            f"events_path={events}",
            "run.vocab_size=64",
            "alerts.webhook_url_env=DISTILL_GUARD_WEBHOOK_URL",
            "alerts.use_wandb=true",
            "alerts.min_interval_s=0",
            "repair.backoff_s=0",  # the repair's three attempts, without 1 s + 2 s between them
        ],
    )
    teacher = SGLangHTTPTeacher(teacher_url, timeout_s=2, max_retries=0, vocab_size=64)
    guard.attach_teacher(teacher)
    raised: list[str] = []
    for step in range(3):
        guard.sleep(step)
        guard.wake(step)
        uniform = torch.full((8,), -torch.log(torch.tensor(64.0)).item())
        guard.on_teacher_scores(step, uniform, uniform[:, None].expand(8, 4).contiguous())
        guard.on_step_metrics(step, {"loss": 0.69, "student_entropy": 4.0})
    try:
        teacher.score([[1, 2, 3]])
    except GuardError as e:
        raised.append(str(e))
        raised.append(repr(e.args))
    guard.close()
    run.finish()
    for argv in (
        ["probe", "--url", teacher_url, "--timeout", "2"],
        ["preflight", "--url", teacher_url],
    ):
        main(argv)
    out = capsys.readouterr()
    outputs = {
        "stdout": out.out,
        "stderr": out.err,
        "log": "\n".join(r.getMessage() for r in caplog.records),
        "events": events.read_text(),
        "exceptions": "\n".join(raised),
    }
    for path in Path(tmp).rglob("*"):
        if path.is_file() and path != events:
            outputs[str(path)] = path.read_bytes().decode(errors="replace")
    found = {name: leaks(text) for name, text in outputs.items() if leaks(text)}
    assert not found, found
    # the servers did echo them: the test would have seen a leak
    assert "HTTP 500" in outputs["events"] and redaction.MASK in outputs["events"]
    assert "alert" in outputs["events"] and redaction.MASK in outputs["log"]


def test_a_webhook_receiver_echoing_its_path_or_query_reveals_neither(planted, caplog) -> None:
    from distill_guard.alerts.webhook import webhook_from_env

    sink = webhook_from_env("DISTILL_GUARD_WEBHOOK_URL", timeout_s=2)
    errors: list[str] = []
    sink.send("t", "x", "WARN", errors.append)
    sink.close(5)
    assert errors and "404" in errors[0] and not leaks(errors[0]), errors
    assert not leaks(caplog.text)


def test_the_forms_a_server_may_echo_are_all_redacted() -> None:
    redaction.register("a/b+c d=e&f")
    text = "raw a/b+c d=e&f, quoted a%2Fb%2Bc%20d%3De%26f, json " + json.dumps("a/b+c d=e&f")
    assert "a/b" not in redaction.redact(text) and "a%2F" not in redaction.redact(text)


def test_a_short_secret_is_only_redacted_as_a_token() -> None:
    redaction.register("ab12")
    assert redaction.redact("ab12 inside tab123 and ab12.") == (
        f"{redaction.MASK} inside tab123 and {redaction.MASK}."
    )


def test_a_finding_and_an_error_carry_no_registered_secret() -> None:
    redaction.register(API_KEY)
    f = Finding(Code.TEACHER_UNREACHABLE, Severity.WARN, f"said {API_KEY}", 1, {"e": [API_KEY]})
    assert API_KEY not in f.message and API_KEY not in json.dumps(f.to_dict())
    assert API_KEY not in str(GuardError(f"echo {API_KEY}"))


def test_a_url_is_shown_without_userinfo_query_or_key_like_segments() -> None:
    url = f"http://{USER}:{PASSWORD}@h:1/services/T0/{HOOK_PATH_KEY}?token={HOOK_TOKEN}"
    redaction.register_url(url, whole=True)
    shown = redaction.redact_url(url)
    assert not leaks(shown) and shown.startswith("http://<redacted>@h:1")
    assert "services" in redaction.redact("services stays a word")


@pytest.mark.slow  # a serve-reference process; the choice itself is tested below
def test_the_reference_server_process_requires_the_key_in_its_environment(
    tmp_path, monkeypatch
) -> None:
    """Started without ``--api-key-env`` while ``SGLANG_API_KEY`` is set, it requires that key
    (it used to serve open)."""
    from distill_guard.testing.servers import reference_subprocess
    from distill_guard.testing.tiny import build_tiny_qwen3

    model = build_tiny_qwen3(tmp_path / "m", vocab_size=64)
    monkeypatch.setenv("SGLANG_API_KEY", API_KEY)
    body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 0}}
    with reference_subprocess(model) as url:
        assert httpx.post(url + "/generate", json=body).status_code == 401
        auth = {"Authorization": f"Bearer {API_KEY}"}
        assert httpx.post(url + "/generate", json=body, headers=auth).status_code == 200


def test_the_reference_server_takes_the_key_in_its_environment(monkeypatch) -> None:
    """``serve-reference`` without ``--api-key-env`` requires ``$SGLANG_API_KEY`` when it is
    set, registered for redaction; ``--no-api-key`` serves open on purpose."""
    from argparse import Namespace

    from distill_guard.cli.base import UsageError
    from distill_guard.cli.serve_reference import _api_key

    monkeypatch.setenv("SGLANG_API_KEY", API_KEY)
    assert _api_key(Namespace(no_api_key=False, api_key_env=None)) == API_KEY
    assert API_KEY not in redaction.redact(f"key {API_KEY}")
    assert _api_key(Namespace(no_api_key=True, api_key_env=None)) is None  # open on purpose
    with pytest.raises(UsageError, match="contradict"):
        _api_key(Namespace(no_api_key=True, api_key_env="SGLANG_API_KEY"))
    monkeypatch.delenv("SGLANG_API_KEY")
    assert _api_key(Namespace(no_api_key=False, api_key_env=None)) is None
    with pytest.raises(UsageError, match="not set"):
        _api_key(Namespace(no_api_key=False, api_key_env="SGLANG_API_KEY"))
