"""A reference server: a :class:`TorchTeacher` behind SGLang's native HTTP endpoints. It is not SGLang.

For offline runs and tests of everything that talks to a teacher over HTTP. Request, response
and error shapes follow ``reference/sglang-contract.md`` to the field, quirks included (entry 0 of
``input_token_logprobs`` is ``[null, id, null]``, ``input_top_logprobs[0]`` is ``null``,
``/flush_cache`` answers plain text, ``/health`` stays green with zeroed weights). It only scores
(``max_new_tokens`` must be 0), has no tokenizer, and serves one request at a time.

Emulated SGLang behaviour, and where it is a choice:

- A second release of a released tag kills SGLang's scheduler (torch_memory_saver ``exit(1)``).
  Here the release answers 500 and the server stays dead: every later request gets 503.
- Resume of a tag that is not released raises ``KeyError`` in SGLang: here 400 with that message.
- ``/generate`` while released is unconfirmed in SGLang; here it answers 400 and scores nothing.
- ``old_api=True`` serves ``/get_server_info`` only (no ``/server_info``) and ignores tags.
"""

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from distill_guard.teachers._sglang_wire import build_score_item, json_safe
from distill_guard.teachers.base import ALL_TAGS, TeacherError, TeacherStateError, normalize_tags
from distill_guard.teachers.torch_teacher import TorchTeacher, package_version

if TYPE_CHECKING:
    from fastapi import FastAPI

NO_AUTH_PATHS = frozenset({"/health", "/health_generate", "/ready"})


class _Contract(Exception):
    """A request that breaks the API contract: 400 ``{"error": "<msg>"}`` as SGLang sends it."""


class _Dead(Exception):
    """The emulated scheduler is dead: 503 to everything."""


class _Killed(_Dead):
    """This request killed the scheduler (a second release): 500, then dead."""


class ReferenceServer:
    """The state behind the app: the teacher, whether the scheduler is dead, the server's settings."""

    def __init__(
        self,
        teacher: TorchTeacher,
        *,
        old_api: bool = False,
        api_key: str | None = None,
        launch_command: str = "",
    ) -> None:
        self.teacher = teacher
        self.old_api = old_api
        self.api_key = api_key
        self.launch_command = launch_command
        self.dead_reason: str | None = None
        self.started = time.time()

    def check_alive(self) -> None:
        if self.dead_reason is not None:
            raise _Dead(self.dead_reason)

    # -- /generate ---------------------------------------------------------------------------

    def generate(self, body: Any) -> Any:
        self.check_alive()
        if not isinstance(body, dict):
            raise _Contract("request body must be a JSON object")
        ids = body.get("input_ids")
        if ids is None:
            if body.get("text") is not None:
                raise TeacherError("the reference server has no tokenizer: send input_ids")
            raise _Contract("one of text or input_ids is required")
        single = isinstance(ids, list) and (len(ids) == 0 or isinstance(ids[0], int))
        batch = [ids] if single else ids
        if (
            not isinstance(batch, list)
            or not batch
            or not all(
                isinstance(s, list) and s and all(isinstance(t, int) for t in s) for s in batch
            )
        ):
            raise _Contract("input_ids must be a non-empty list of ints or of int lists")
        n = len(batch)
        sampling = _per_item(body.get("sampling_params") or {}, n, "sampling_params")
        for sp in sampling:
            if (sp or {}).get("max_new_tokens", 128) != 0:
                raise TeacherError(
                    "the reference server only scores: set sampling_params.max_new_tokens to 0"
                )
        want_lp = _per_item(body.get("return_logprob", False), n, "return_logprob")
        starts = _per_item(body.get("logprob_start_len", -1), n, "logprob_start_len")
        topks = _per_item(body.get("top_logprobs_num", 0) or 0, n, "top_logprobs_num")
        t0 = time.perf_counter()
        items: list[dict[str, Any] | None] = [None] * n
        groups: dict[tuple[int, int], list[int]] = {}
        for i, seq in enumerate(batch):
            start = len(seq) if (starts[i] is None or starts[i] == -1) else int(starts[i])
            if start > len(seq):
                raise TeacherError(
                    f"logprob_start_len ({start}) is greater than the input length ({len(seq)})"
                )
            if not want_lp[i]:
                items[i] = _strip_logprobs(build_score_item(seq, _empty(), None, None, len(seq)))
            elif start == len(seq):
                items[i] = build_score_item(seq, _empty(), None, None, start)
            else:
                groups.setdefault((start, int(topks[i])), []).append(i)
        for (start, k), idx in groups.items():
            res = self.teacher.score([batch[i] for i in idx], top_k=k, logprob_start_len=start)
            for j, i in enumerate(idx):
                items[i] = build_score_item(
                    batch[i],
                    res.token_logprobs[j],
                    res.topk_logprobs[j] if res.topk_logprobs else None,
                    res.topk_ids[j] if res.topk_ids else None,
                    start,
                    latency_s=time.perf_counter() - t0,
                )
        out = json_safe(items)
        return out[0] if single else out

    # -- memory ------------------------------------------------------------------------------

    def _tags(self, body: Any) -> tuple[str, ...]:
        if self.old_api or not isinstance(body, dict):
            return ALL_TAGS
        try:
            return normalize_tags(body.get("tags"))
        except (TypeError, ValueError) as e:
            raise TeacherError(str(e)) from e

    def release(self, body: Any) -> None:
        self.check_alive()
        tags = self._tags(body)
        try:
            self.teacher.release(tags)
        except TeacherStateError as e:
            self.dead_reason = (
                f"scheduler died: release of {sorted(set(tags) & self.teacher.sleep_state.released)} "
                "that was already released (in SGLang torch_memory_saver exit(1)s here); "
                "restart the server"
            )
            raise _Killed(self.dead_reason) from e

    def resume(self, body: Any) -> None:
        self.check_alive()
        tags = self._tags(body)
        missing = [t for t in tags if t not in self.teacher.sleep_state.released]
        if missing:
            raise TeacherError(f"KeyError: {missing[0]!r} (resume of a tag that is not released)")
        self.teacher.resume(tags)

    def update_weights_from_disk(self, body: Any) -> tuple[int, dict[str, Any]]:
        self.check_alive()
        path = body.get("model_path") if isinstance(body, dict) else None
        if not path:
            return 400, {
                "success": False,
                "message": "model_path is required",
                "num_paused_requests": 0,
            }
        try:
            self.teacher.reload_weights(str(path))
        except TeacherError as e:
            return 400, {
                "success": False,
                "message": f"Failed to update weights: {e}",
                "num_paused_requests": 0,
            }
        self.teacher.model_path = str(path)
        return 200, {
            "success": True,
            "message": "Succeeded to update model weights.",
            "num_paused_requests": 0,
        }

    def server_info(self) -> dict[str, Any]:
        self.check_alive()
        info = dict(self.teacher.server_info())
        info.update(
            {
                "launch_command": self.launch_command,
                "status": "ready",
                "max_total_num_tokens": 4096,
                "max_req_input_len": 4096,
                "internal_states": [{"released_tags": sorted(self.teacher.sleep_state.released)}],
                "version": f"distill_guard-reference-server {package_version()} (not SGLang)",
                "startup_time": self.started,
            }
        )
        return info

    def model_info(self) -> dict[str, Any]:
        self.check_alive()
        config = getattr(self.teacher.model, "config", None)
        return {
            "model_path": self.teacher.model_path,
            "served_model_name": self.teacher.model_path,
            "tokenizer_path": None,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "load_format": "safetensors",
            "model_type": getattr(config, "model_type", None),
            "architectures": getattr(config, "architectures", None),
            "has_image_understanding": False,
            "has_audio_understanding": False,
        }


def _empty() -> Any:
    import torch

    return torch.empty(0)


def _strip_logprobs(item: dict[str, Any]) -> dict[str, Any]:
    meta = item["meta_info"]
    for key in [k for k in meta if "logprobs" in k]:
        del meta[key]
    return item


def _per_item(value: Any, n: int, name: str) -> list[Any]:
    if isinstance(value, list):
        if len(value) != n:
            raise _Contract(f"{name} has {len(value)} entries for {n} inputs")
        return value
    return [value] * n


def create_app(server: "ReferenceServer") -> "FastAPI":
    # No `from __future__ import annotations` in this module: FastAPI must resolve the handlers'
    # annotations, and fastapi is imported here, lazily.
    """The FastAPI app serving ``server`` on SGLang's native routes."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, PlainTextResponse, Response
    from starlette.concurrency import run_in_threadpool

    app = FastAPI(
        title="distill_guard reference teacher server (not SGLang)",
        description="A TorchTeacher behind SGLang's native endpoints, for offline runs and tests.",
    )
    lock = threading.Lock()  # SGLang's release asserts an idle server; here one call at a time

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": {"message": message}}, status_code=status)

    async def body_of(request: Request) -> Any:
        raw = await request.body()
        if not raw:
            return None
        import json

        try:
            return json.loads(raw)
        except ValueError as e:
            raise _Contract(f"body is not JSON: {e}") from e

    async def call(fn: Any, *args: Any) -> Any:
        def locked() -> Any:
            with lock:
                return fn(*args)

        return await run_in_threadpool(locked)

    @app.middleware("http")
    async def auth(request: Request, call_next: Any) -> Response:
        if (
            server.api_key
            and request.url.path not in NO_AUTH_PATHS
            and request.headers.get("authorization") != f"Bearer {server.api_key}"
        ):
            return JSONResponse({"error": "Unauthorized"}, status_code=401)
        return await call_next(request)

    @app.exception_handler(_Contract)
    async def contract_error(request: Request, e: _Contract) -> Response:
        return JSONResponse({"error": str(e)}, status_code=400)

    @app.exception_handler(_Dead)
    async def dead(request: Request, e: _Dead) -> Response:
        return error(500 if isinstance(e, _Killed) else 503, str(e))

    @app.exception_handler(TeacherError)
    async def teacher_error(request: Request, e: TeacherError) -> Response:
        return error(400, str(e))

    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(request: Request) -> Response:
        return JSONResponse(await call(server.generate, await body_of(request)))

    @app.api_route("/release_memory_occupation", methods=["GET", "POST"])
    async def release(request: Request) -> Response:
        await call(server.release, await body_of(request))
        return JSONResponse(None)

    @app.api_route("/resume_memory_occupation", methods=["GET", "POST"])
    async def resume(request: Request) -> Response:
        await call(server.resume, await body_of(request))
        return JSONResponse(None)

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(request: Request) -> Response:
        status, body = await call(server.update_weights_from_disk, await body_of(request))
        return JSONResponse(body, status_code=status)

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        server.check_alive()
        await call(server.teacher.flush_cache)
        return PlainTextResponse(
            "Cache flushed.\nPlease check backend logs for more details. (When there are running "
            "or waiting requests, the operation will not be performed.)\n"
        )

    if not server.old_api:

        @app.get("/server_info")
        async def server_info() -> Response:
            return JSONResponse(json_safe(server.server_info()))

        @app.get("/model_info")
        async def model_info() -> Response:
            return JSONResponse(server.model_info())

    @app.get("/get_server_info")
    async def get_server_info() -> Response:
        return JSONResponse(json_safe(server.server_info()))

    @app.get("/get_model_info")
    async def get_model_info() -> Response:
        return JSONResponse(server.model_info())

    @app.api_route("/health", methods=["GET"])
    async def health() -> Response:
        server.check_alive()  # like SGLang: never looks at the output, so zeroed weights pass
        return Response(status_code=200)

    @app.api_route("/health_generate", methods=["GET"])
    async def health_generate() -> Response:
        server.check_alive()
        return Response(status_code=200)

    @app.get("/ready")
    async def ready() -> Response:
        return Response(status_code=200 if server.dead_reason is None else 503)

    return app


class ServerThread:
    """A uvicorn server on 127.0.0.1 in a background thread, for tests and benchmarks."""

    def __init__(
        self, app: "FastAPI", *, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"
    ) -> None:
        import uvicorn

        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # accepted sockets inherit TCP_NODELAY: without it every small answer waits ~40 ms for
        # a delayed ACK (Nagle), which would swamp every latency this server is used to measure
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock.bind((host, port))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        config = uvicorn.Config(app, log_level=log_level, lifespan="off", access_log=False)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    def start(self, timeout_s: float = 10.0) -> "ServerThread":
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"reference server did not start on {self.url}")
            time.sleep(0.01)
        return self

    def run_forever(self) -> None:
        """Serve in the calling thread until interrupted."""
        self._server.run(sockets=[self._sock])

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        with contextlib.suppress(OSError):
            self._sock.close()

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def serve_in_thread(server: ReferenceServer) -> Iterator[str]:
    """Serve ``server`` on a free 127.0.0.1 port for the duration of the block; yields its URL."""
    with ServerThread(create_app(server)) as thread:
        yield thread.url


def serve(server: ReferenceServer, *, host: str = "127.0.0.1", port: int = 30000) -> None:
    """Serve in the foreground until interrupted (``distill-guard serve-reference``)."""
    thread = ServerThread(create_app(server), host=host, port=port, log_level="info")
    thread.run_forever()
