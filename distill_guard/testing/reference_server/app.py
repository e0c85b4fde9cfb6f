"""The reference server's HTTP app: SGLang's native routes over :class:`.engine.ReferenceServer`."""

import json
import threading
from typing import TYPE_CHECKING, Any

from distill_guard.extras import needed
from distill_guard.teachers._sglang_wire import json_safe
from distill_guard.teachers.base import TeacherError
from distill_guard.testing.reference_server.engine import (
    ADMIN_PATHS,
    NO_AUTH_PATHS,
    Busy,
    ContractError,
    ReferenceServer,
    SchedulerDead,
    SchedulerKilled,
)

if TYPE_CHECKING:
    from fastapi import FastAPI


def create_app(server: "ReferenceServer") -> "FastAPI":
    # No `from __future__ import annotations` in this module: FastAPI must resolve the handlers'
    # annotations, and fastapi is imported here, lazily.
    """The FastAPI app serving ``server`` on SGLang's native routes."""
    with needed("the reference teacher server", "server"):
        from fastapi import FastAPI, Request
        from fastapi.responses import JSONResponse, PlainTextResponse, Response
        from starlette.concurrency import run_in_threadpool

    app = FastAPI(
        title="distill_guard reference teacher server (not SGLang)",
        description="A TorchTeacher behind SGLang's native endpoints, for offline runs and tests.",
    )
    admin_lock = threading.Lock()  # one admin action at a time; /generate runs alongside

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": {"message": message}}, status_code=status)

    async def body_of(request: Request) -> Any:
        raw = await request.body()
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError as e:
            raise ContractError(f"body is not JSON: {e}") from e

    async def call(fn: Any, *args: Any) -> Any:
        return await run_in_threadpool(fn, *args)

    async def admin(fn: Any, *args: Any) -> Any:
        def locked() -> Any:
            with admin_lock:
                return fn(*args)

        return await run_in_threadpool(locked)

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

    @app.api_route("/pause_generation", methods=["POST"])
    async def pause_generation(request: Request) -> Response:
        await admin(server.pause_generation, await body_of(request))
        return JSONResponse({"success": True})

    @app.api_route("/continue_generation", methods=["POST"])
    async def continue_generation(request: Request) -> Response:
        await admin(server.continue_generation, await body_of(request))
        return JSONResponse({"success": True})

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(request: Request) -> Response:
        status, body = await admin(server.update_weights_from_disk, await body_of(request))
        return JSONResponse(body, status_code=status)

    if server.caps.checksum:

        @app.post("/weights_checker")
        async def weights_checker(request: Request) -> Response:
            return JSONResponse(await admin(server.weights_checker, await body_of(request)))

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache(request: Request) -> Response:
        raw = request.query_params.get("timeout")
        try:
            timeout_s = float(raw) if raw is not None else None
        except ValueError as e:
            raise ContractError(f"timeout must be a number of seconds, got {raw!r}") from e
        await admin(server.flush_cache, timeout_s)
        return PlainTextResponse(
            "Cache flushed.\nPlease check backend logs for more details. (When there are running "
            "or waiting requests, the operation will not be performed.)\n"
        )

    if server.caps.server_info:

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
