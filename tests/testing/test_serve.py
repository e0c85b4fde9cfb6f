"""The reference server's thread: its prompt stop, and uvicorn's own where the hooks it relies
on are not there."""

from __future__ import annotations

import pytest

uvicorn = pytest.importorskip("uvicorn")

import importlib  # noqa: E402

# the module, not the package's ``serve`` function of the same name
serve = importlib.import_module("distill_guard.testing.reference_server.serve")


def test_a_uvicorn_without_the_hooks_gets_its_own_server(monkeypatch):
    serve._prompt_server.cache_clear()
    monkeypatch.delattr(uvicorn.Server, "on_tick")
    try:
        assert serve._prompt_server() is uvicorn.Server
    finally:
        serve._prompt_server.cache_clear()


def test_this_uvicorn_gets_the_prompt_stop():
    serve._prompt_server.cache_clear()
    server = serve._prompt_server()
    assert server is not uvicorn.Server and issubclass(server, uvicorn.Server)
