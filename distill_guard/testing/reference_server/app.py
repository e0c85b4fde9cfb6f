"""The reference server's HTTP app: SGLang's native routes over :class:`.engine.ReferenceServer`.

Which routes exist, and which bodies they read, follow the version (``docs/sglang-contract.md``
§7.2): ``/pause_generation`` and ``/continue_generation`` from 0.4.9 (a body required from
0.5.6), ``/server_info`` and ``/model_info`` from 0.5.6, ``/weights_checker`` from 0.5.6 (GET and
an optional body from 0.5.13), ``/flush_cache?timeout=`` read from 0.5.10.
"""

import json
import math
import threading
from typing import TYPE_CHECKING, Any

from distill_guard.extras import needed
from distill_guard.teachers._sglang_wire import json_safe
from distill_guard.teachers.base import TeacherError
from distill_guard.teachers.sglang_versions import Checksum, Pause
from distill_guard.testing.reference_server.engine import (
    ADMIN_PATHS,
    FLUSHED,
    NO_AUTH_PATHS,
    ReferenceServer,
)
from distill_guard.testing.reference_server.errors import (
    BodyInvalid,
    Busy,
    ContractError,
    SchedulerDead,
    SchedulerKilled,
    Unhealthy,
)

if TYPE_CHECKING:
    from fastapi import FastAPI

PAUSED = {"message": "Generation paused successfully.", "status": "ok"}
CONTINUED = {"message": "Generation continued successfully.", "status": "ok"}
"""The pause and continue answers, every version (0.4.9 ``http_server.py:715-722``)."""


def create_app(server: "ReferenceServer") -> "FastAPI":
    # No `from __future__ import annotations` in this module: FastAPI must resolve the handlers'
    # annotations, and fastapi is imported here, lazily.
    """The FastAPI app serving ``server`` on SGLang's native routes."""
    with needed("the reference teacher server", "server"):
        import anyio
        from fastapi import FastAPI, Request
        from fastapi.responses import JSONResponse, PlainTextResponse, Response
        from starlette.concurrency import run_in_threadpool

    caps = server.caps
    app = FastAPI(
        title="distill_guard reference teacher server (not SGLang)",
        description="A TorchTeacher behind SGLang's native endpoints, for offline runs and tests.",
    )
    admin_lock = threading.Lock()  # one admin action at a time; /generate runs alongside
    # admin calls get threads of their own (a limiter made on first use, inside the event
    # loop), so /generate calls held by a pause cannot take every thread from /continue
    admin_threads: list[Any] = []

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": {"message": message}}, status_code=status)

    async def body_of(request: Request, invalid: type[Exception] = ContractError) -> Any:
        """The JSON body, None when there is none."""
        raw = await request.body()
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError as e:
            raise invalid(f"body is not JSON: {e}") from e

    async def required_body(request: Request) -> Any:
        """A body FastAPI requires (a model parameter with no default): none is a 400."""
        body = await body_of(request, BodyInvalid)
        if body is None:
            raise BodyInvalid("body: Field required")
        return body

    async def call(fn: Any, *args: Any) -> Any:
        return await run_in_threadpool(fn, *args)

    async def admin(fn: Any, *args: Any) -> Any:
        def locked() -> Any:
            with admin_lock:
                return fn(*args)

        if not admin_threads:
            admin_threads.append(anyio.CapacityLimiter(8))
        return await anyio.to_thread.run_sync(locked, limiter=admin_threads[0])

    @app.middleware("http")
    async def auth(request: Request, call_next: Any) -> Response:
        """SGLang's keys: admin endpoints take only the admin key when one is set; the others
        take only ``--api-key``; health and readiness are open."""
        path = request.url.path
        want = (
            server.admin_api_key if path in ADMIN_PATHS and server.admin_api_key else server.api_key
        )
        if (
            want
            and path not in NO_AUTH_PATHS
            and request.headers.get("authorization") != f"Bearer {want}"
        ):
            return JSONResponse({"error": "Unauthorized"}, status_code=401)
        return await call_next(request)

    @app.exception_handler(ContractError)
    async def contract_error(request: Request, e: ContractError) -> Response:
        return JSONResponse({"error": str(e)}, status_code=400)

    @app.exception_handler(BodyInvalid)
    async def body_invalid(request: Request, e: BodyInvalid) -> Response:
        content = {"object": "error", "message": str(e), "type": "Bad Request", "param": None}
        return JSONResponse({**content, "code": 400}, status_code=400)

    @app.exception_handler(SchedulerDead)
    async def dead(request: Request, e: SchedulerDead) -> Response:
        return error(500 if isinstance(e, SchedulerKilled) else 503, str(e))

    @app.exception_handler(TeacherError)
    async def teacher_error(request: Request, e: TeacherError) -> Response:
        return error(400, str(e))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, e: Exception) -> Response:
        """Anything else is the reference server's own bug: still an SGLang-shaped JSON error."""
        return error(500, f"{type(e).__name__}: {e}")

    @app.exception_handler(Busy)
    async def busy(request: Request, e: Busy) -> Response:
        return PlainTextResponse(str(e), status_code=400)

    @app.exception_handler(Unhealthy)
    async def unhealthy(request: Request, e: Unhealthy) -> Response:
        return Response(status_code=503)

    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(request: Request) -> Response:
        return JSONResponse(await call(server.generate, await body_of(request)))

    @app.api_route("/release_memory_occupation", methods=["GET", "POST"])
    async def release(request: Request) -> Response:
        await admin(server.release, await body_of(request))
        return JSONResponse(None)

    @app.api_route("/resume_memory_occupation", methods=["GET", "POST"])
    async def resume(request: Request) -> Response:
        await admin(server.resume, await body_of(request))
        return JSONResponse(None)

    if caps.pause is not Pause.NONE:
        reads_body = caps.pause is Pause.MODES  # 0.4.9–0.5.5's handler takes only the Request

        @app.post("/pause_generation")
        async def pause_generation(request: Request) -> Response:
            body = await required_body(request) if reads_body else None
            await admin(server.pause_generation, body)
            return JSONResponse(PAUSED)

        @app.post("/continue_generation")
        async def continue_generation(request: Request) -> Response:
            body = await required_body(request) if reads_body else None
            await admin(server.continue_generation, body)
            return JSONResponse(CONTINUED)

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(request: Request) -> Response:
        status, body = await admin(server.update_weights_from_disk, await body_of(request))
        return JSONResponse(body, status_code=status)

    if caps.server_info:  # /weights_checker came in 0.5.6, with /server_info
        methods = ["GET", "POST"] if caps.checksum_shape is Checksum.PER_ENGINE_STRING else ["POST"]

        @app.api_route("/weights_checker", methods=methods)
        async def weights_checker(request: Request) -> Response:
            body = await body_of(request, BodyInvalid)
            status, answer = await admin(server.weights_checker, body)
            return JSONResponse(answer, status_code=status)

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache(request: Request) -> Response:
        await admin(server.flush_cache, flush_timeout(request.query_params.get("timeout")))
        return PlainTextResponse(FLUSHED)

    def flush_timeout(raw: str | None) -> float:
        """``?timeout=S`` (``Query(0.0, ge=0.0)``) where the version reads it, else 0."""
        if not caps.flush_timeout or raw is None:
            return 0.0
        try:
            value = float(raw)
        except ValueError as e:
            raise BodyInvalid(f"timeout: Input should be a valid number, got {raw!r}") from e
        if not (math.isfinite(value) and value >= 0):
            raise BodyInvalid(f"timeout: Input should be greater than or equal to 0, got {raw!r}")
        return value

    if caps.server_info:

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
        await call(server.health)  # like SGLang: never looks at the output, so zeroed weights pass
        return Response(status_code=200)

    @app.api_route("/health_generate", methods=["GET"])
    async def health_generate() -> Response:
        await call(server.health)
        return Response(status_code=200)

    @app.get("/ready")
    async def ready() -> Response:
        return Response(status_code=200 if server.dead_reason is None else 503)

    return app
