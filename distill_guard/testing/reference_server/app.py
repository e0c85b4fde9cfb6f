"""The reference server's HTTP app: SGLang's native routes over :class:`.engine.ReferenceServer`."""

import json
import threading
from typing import TYPE_CHECKING, Any

from distill_guard.teachers._sglang_wire import json_safe
from distill_guard.teachers.base import TeacherError
from distill_guard.testing.reference_server.engine import (
    NO_AUTH_PATHS,
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
        try:
            return json.loads(raw)
        except ValueError as e:
            raise ContractError(f"body is not JSON: {e}") from e

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

    @app.exception_handler(ContractError)
    async def contract_error(request: Request, e: ContractError) -> Response:
        return JSONResponse({"error": str(e)}, status_code=400)

    @app.exception_handler(SchedulerDead)
    async def dead(request: Request, e: SchedulerDead) -> Response:
        return error(500 if isinstance(e, SchedulerKilled) else 503, str(e))

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
