"""The optional dependencies: which extra brings which module, and the error a missing one gives.

The core install is torch, Hydra and httpx; every other import sits behind :func:`needed`, so a
user who calls a feature without its extra reads which feature, which module and the exact
``pip install`` line, instead of a bare ``No module named ...``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from importlib import import_module

from distill_guard.errors import GuardError, GuardValueError

EXTRAS = {
    "hf": ("transformers", "accelerate", "safetensors"),
    "trl": ("trl",),
    "lightning": ("lightning",),
    "server": ("fastapi", "uvicorn"),
    "plot": ("matplotlib",),
    "sglang": ("sglang",),
    "gpu": ("triton", "torch_memory_saver"),
    "wandb": ("wandb",),
    "ray": ("ray",),
    "router": ("sglang_router",),
}
"""Extra → the top-level modules it installs (pyproject's ``[project.optional-dependencies]``)."""


class MissingExtra(GuardError, ImportError):
    """A feature's optional dependency is not installed; the message says how to install it."""

    def __init__(self, feature: str, install: str, module: str | None) -> None:
        what = f"{module}, which is not installed" if module else "a module that is not installed"
        super().__init__(f"{feature} needs {what}: pip install {install}", name=module)
        self.feature, self.install = feature, install


def install_line(extra: str) -> str:
    """The shell argument that installs ``extra`` (``"server,hf"`` for several)."""
    unknown = [e for e in extra.split(",") if e not in EXTRAS]
    if unknown:
        raise GuardValueError(f"unknown extra(s) {unknown}; extras are {', '.join(EXTRAS)}")
    return f"'distill_guard[{extra}]'"


@contextmanager
def needed(feature: str, extra: str | None = None, *, package: str | None = None) -> Iterator[None]:
    """Imports in this block belong to ``feature``: a missing module becomes :class:`MissingExtra`
    naming ``pip install 'distill_guard[extra]'`` (or ``pip install package`` for a dependency no
    extra brings). A missing ``distill_guard`` module is a bug, not an extra: it is re-raised."""
    install = install_line(extra) if extra else package
    if not install:
        raise GuardValueError("needed() takes an extra or a package")
    try:
        yield
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] == "distill_guard":
            raise
        raise MissingExtra(feature, install, (exc.name or "").split(".")[0] or None) from exc


def require(feature: str, extra: str, *modules: str) -> None:
    """Import ``modules`` now (default: every module of ``extra``), so a command fails before it
    starts rather than halfway."""
    with needed(feature, extra):
        for name in modules or [m for e in extra.split(",") for m in EXTRAS[e]]:
            import_module(name)
