"""The HTTP client and the guard's wake against servers that misbehave, one way each: every fault
is a ``TeacherError`` within the deadline, and at the guard a finding, never an exception.

The servers are ``http.server`` on 127.0.0.1, answering ``/generate`` wrongly and everything
else as an SGLang 0.5.23 would.
"""

from __future__ import annotations

import http.server
import json
import threading
import time

import pytest

from distill_guard import DistillGuard
from distill_guard.findings import Code
from distill_guard.observations import RunSpec
from distill_guard.policy import Action
from distill_guard.teachers import SGLangHTTPTeacher, TeacherError

TIMEOUT_S = 0.5
RELEASE = threading.Event()


def _item(entries, top=None):
    meta = {"input_token_logprobs": entries}
    if top is not None:
        meta["input_top_logprobs"] = top
    return {"text": "", "meta_info": meta}


GOOD_ENTRY = [-1.0, 3, None]

# name: (status, content type, body) for /generate, or a callable handling the request itself
ANSWERS = {
    "http_401": (401, "application/json", {"error": "Unauthorized"}),
    "http_500_json": (500, "application/json", {"error": {"message": "scheduler crashed"}}),
    "http_500_plain": (500, "text/plain", "Internal Server Error"),
    "http_503": (503, "application/json", {"error": {"message": "starting"}}),
    "html_200": (200, "text/html", "<html><body>proxy login</body></html>"),
    "not_json_200": (200, "application/json", "{'input_token_logprobs': oops"),
    "empty_200": (200, "application/json", ""),
    "json_null": (200, "application/json", None),
    "wrong_item_count": (200, "application/json", [_item([None, GOOD_ENTRY])] * 2),
    "no_meta_info": (200, "application/json", {"text": ""}),
    "too_few_logprobs": (200, "application/json", _item([None])),
    "entries_null": (200, "application/json", _item(None)),
    "entries_a_number": (200, "application/json", _item(7)),
    "entry_a_string": (200, "application/json", _item([None, "abc"])),
    "value_a_string": (200, "application/json", _item([None, ["abc", 3, None]])),
    "value_an_object": (200, "application/json", _item([None, [{"v": 1}, 3, None]])),
    "top_rows_missing": (200, "application/json", _item([None, GOOD_ENTRY], None)),
    "top_row_wrong_width": (
        200,
        "application/json",
        _item([None, GOOD_ENTRY], [None, [GOOD_ENTRY]]),
    ),
    "top_id_null": (
        200,
        "application/json",
        _item([None, GOOD_ENTRY], [None, [[-1.0, None, None], GOOD_ENTRY]]),
    ),
    "top_row_a_number": (200, "application/json", _item([None, GOOD_ENTRY], [None, 5])),
}
TRANSPORT = ("hang", "drip", "cut", "reset")


class Handler(http.server.BaseHTTPRequestHandler):
    mode = "http_401"

    def log_message(self, *args):
        pass

    def _send(self, status, ctype, body):
        raw = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self):
        if self.path in ("/server_info", "/get_server_info"):
            return self._send(200, "application/json", {"version": "0.5.23"})
        return self._send(200, "application/json", {})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path != "/generate":
            return self._send(200, "application/json", None)
        mode = self.mode
        if mode == "hang":
            RELEASE.wait(10)
        elif mode == "drip":
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            for _ in range(50):
                if RELEASE.is_set():
                    break
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.1)
        elif mode == "cut":
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            self.wfile.write(b'{"meta_info": {')
        elif mode == "reset":
            self.close_connection = True
        else:
            self._send(*ANSWERS[mode])


@pytest.fixture(scope="module")
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    # polled every 50 ms, not serve_forever's 0.5 s: shutdown() waits for one poll
    thread = threading.Thread(
        target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    RELEASE.set()
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.parametrize("mode", [*TRANSPORT, *ANSWERS])
def test_a_misbehaving_teacher_is_a_teacher_error_within_the_deadline(server, mode):
    Handler.mode = mode
    teacher = SGLangHTTPTeacher(server, timeout_s=TIMEOUT_S, max_retries=1, retry_backoff_s=0.05)
    t0 = time.monotonic()
    with pytest.raises(TeacherError) as err:
        teacher.score([[1, 2]], top_k=2 if mode.startswith("top_") else 0)
    assert time.monotonic() - t0 < TIMEOUT_S + 1.5  # one overall deadline, retries included
    assert "/generate" in str(err.value)
    teacher.close()


@pytest.mark.parametrize("mode", ["hang", "cut", "http_500_plain", "value_a_string", "top_id_null"])
def test_at_the_guards_wake_a_misbehaving_teacher_is_a_finding(server, mode):
    Handler.mode = mode
    teacher = SGLangHTTPTeacher(server, timeout_s=TIMEOUT_S, max_retries=0)
    guard = DistillGuard(teacher=teacher, run=RunSpec(vocab_size=64))
    decision = guard.wake(0)  # no fingerprint yet: the canary's first measurement
    guard.sleep(0, release=lambda: None)  # the fingerprint: a call that fails, a finding
    assert decision.action in (Action.CONTINUE, Action.ALERT)
    assert guard.summary.count.get(Code.TEACHER_UNREACHABLE, 0) >= 1
    teacher.close()
