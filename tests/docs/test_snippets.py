"""Every code block of README.md and docs/*.md runs as written.

A Python snippet runs as a user copies it: its set-up blocks (the docs show them, marked
``<!-- snippet: NAME setup -->``) and then its own code, in a fresh namespace that holds nothing
but ``__name__``. Its setup in ``tests/docs/setups.py`` may start a server, write files, set
variables and put a stand-in module in place, and swaps placeholders that the code shows inside
string literals (a server URL, a model directory) for what stands for them here; it never gives
the code a name. Then it checks what the snippet did. Shell snippets run line by line, each by
its command:

- ``distill-guard ...`` runs the CLI for real, in this process (a server it names is a
  reference server on loopback; ``serve-reference`` runs as a child process, forked from the
  session's fork server, and must answer ``/health``); exit 0 or 1 (findings) pass, anything
  else or a traceback fails;
- ``make TARGET`` must be a target the Makefile can make (``make -n``: the targets build a venv
  and run for minutes, which is CI's own job);
- ``python -m examples.<app> OVERRIDES`` must compose with Hydra (the demo is a 100 s job);
- ``export NAME=VALUE`` sets the variable for the snippet's later lines;
- ``pip install ...`` must install this package (``.`` is the checkout) with extras it defines
  (the installed metadata's), or the torch the Makefile pins (``scripts/install_matrix.sh``
  installs them for real);

and any other command fails the test until it is given a runner here.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import tokenize
from pathlib import Path

import pytest

from .setups import SETUPS, Context, env_var
from .snippets import ROOT, Snippet, snippets

ALL = snippets()
UNIQUE = [
    s
    for i, s in enumerate(ALL)
    if (s.setup, s.prelude, s.code) not in {(t.setup, t.prelude, t.code) for t in ALL[:i]}
]
"""A snippet shown twice with the same setup and set-up (the README and its docs page) runs once."""
BIN = Path(sys.executable).parent
FRESH = {"__name__": "__snippet__"}
"""All a Python snippet's namespace holds before its code runs."""
BUILTINS = frozenset(vars(builtins))
"""The builtins' names before any setup ran: a setup must not add one (a name for every module)."""


def test_the_docs_have_snippets_and_every_python_snippet_names_its_setup():
    assert len(ALL) >= 15
    unnamed = [s.id for s in ALL if s.kind == "python" and s.setup is None]
    assert not unnamed, f"add <!-- snippet: NAME --> and a setup in tests/docs/setups.py: {unnamed}"
    unknown = [s.id for s in ALL if s.setup is not None and s.setup not in SETUPS]
    assert not unknown, f"no setup of that name in tests/docs/setups.py: {unknown}"


@pytest.mark.usefixtures("forkserver")  # started with the session: serve-reference forks from it
@pytest.mark.parametrize("snip", UNIQUE, ids=[s.id for s in UNIQUE])
def test_snippet_runs_as_written(snip: Snippet, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with contextlib.ExitStack() as stack:
        ctx = Context(cwd=tmp_path, stack=stack, snippet=snip)
        if snip.setup is not None:
            SETUPS[snip.setup](ctx)
        if snip.kind == "python":
            _run_python(snip, ctx)
        elif snip.kind == "yaml":
            from omegaconf import OmegaConf

            assert OmegaConf.create(snip.code) is not None
        else:
            for words in _commands(snip.code):
                _run_command([ctx.substitutions.get(w, w) for w in words], ctx)


def _bare(code: str, substitutions: dict[str, str] | None = None) -> tuple[Snippet, Context]:
    """A made-up Python snippet and an empty context for it (no setup ran)."""
    snip = Snippet("made-up.md", 1, "python", None, code)
    return snip, Context(Path.cwd(), contextlib.ExitStack(), snip, substitutions or {})


def test_a_snippet_runs_in_a_namespace_with_nothing_in_it():
    ns = _run_python(*_bare("seen = sorted(globals())\n"))
    assert ns["seen"] == ["__builtins__", "__name__"]


def test_a_name_the_docs_do_not_define_fails_the_snippet():
    """The loop's names come from its visible set-up or nowhere: without it, a NameError."""
    (loop,) = [s for s in UNIQUE if s.setup == "plain-loop"]
    assert "teacher, student, loader = " in loop.prelude
    with pytest.raises(NameError, match="'teacher' is not defined"):
        _run_python(*_bare(loop.code))


def test_a_name_sneaked_into_builtins_fails_the_run(monkeypatch):
    monkeypatch.setattr(builtins, "teacher", object(), raising=False)
    with pytest.raises(AssertionError, match="added builtins"):
        _run_python(*_bare("teacher\n"))


def test_a_placeholder_is_swapped_only_inside_a_string_literal():
    ns = _run_python(*_bare('url = "http://host:1"\n', {"http://host:1": "http://127.0.0.1:9"}))
    assert ns["url"] == "http://127.0.0.1:9"
    with pytest.raises(AssertionError, match="outside a string"):
        _run_python(*_bare("DIR = 1\n", {"DIR": "2"}))
    with pytest.raises(AssertionError, match="would end the literal"):
        _run_python(*_bare('d = "DIR"\n', {"DIR": 'x" + str(teacher) + "'}))


def _run_python(snip: Snippet, ctx: Context) -> dict:
    """The set-up blocks, then the snippet, in one fresh namespace; then the setup's check."""
    assert set(vars(builtins)) == BUILTINS, "a setup added builtins: a snippet gets no names"
    ns = dict(FRESH)
    assert ns.keys() == {"__name__"}, ns.keys()
    for part, name in ((snip.prelude, f"{snip.id} set-up"), (snip.code, snip.id)):
        code = _substituted(part, ctx.substitutions, name)
        exec(compile(code, name, "exec"), ns)  # noqa: S102 - the documented code, run as written
    ctx.check(ns)
    return ns


def _substituted(code: str, substitutions: dict[str, str], name: str) -> str:
    """``code`` with each placeholder it shows replaced by its value here. A placeholder stands
    for a value the user types (a URL, a path): it may stand only inside string literals, and its
    value must not end that literal."""
    strings = [
        t.string
        for t in tokenize.generate_tokens(io.StringIO(code).readline)
        if t.type == tokenize.STRING
    ]
    for placeholder, value in substitutions.items():
        if placeholder not in code:
            continue
        inside = sum(s.count(placeholder) for s in strings)
        assert inside == code.count(placeholder), f"{name}: {placeholder!r} outside a string"
        assert not set("\\'\"\n") & set(value), f"{name}: {value!r} would end the literal"
        code = code.replace(placeholder, value)
    return code


def _commands(code: str) -> list[list[str]]:
    """The shell lines of a snippet as words (continuations joined, comments and a ``$ ``
    prompt dropped)."""
    out = []
    for line in code.replace("\\\n", " ").splitlines():
        words = shlex.split(line.removeprefix("$ "), comments=True)
        if words:
            out.append(words)
    return out


def _run_command(words: list[str], ctx: Context) -> None:
    runner = {
        "distill-guard": _distill_guard,
        "make": _make,
        "python": _python_module,
        "pip": _pip_install,
        "export": _export,
    }.get(words[0])
    assert runner is not None, f"no runner for {shlex.join(words)!r}: add one to {__file__}"
    runner(words, ctx)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _distill_guard(words: list[str], ctx: Context) -> None:
    """The CLI's ``main`` with the snippet's words (the console script calls just that; a
    server it starts runs in a child process, as a user's would)."""
    from distill_guard.cli import main

    assert shutil.which("distill-guard", path=str(BIN)), "no distill-guard console script"
    if words[1] == "serve-reference":
        _serve_reference(words)
        return
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(words[1:])
        except SystemExit as exc:
            code = exc.code
    said = f"{shlex.join(words)} exited {code}:\n{out.getvalue()[-3000:]}\n{err.getvalue()[-3000:]}"
    assert code in (0, 1), said
    assert "Traceback" not in err.getvalue(), said


def _serve_reference(words: list[str]) -> None:
    """``serve-reference`` as the console script runs it (``distill_guard.cli:main`` with the
    words), in a child process: forked from the session's fork server, which has imported torch
    and transformers, so the child serves in about a second instead of importing them again
    (the console script's own start is ``tests/test_cli_live.py``'s slow end-to-end test). It
    must answer ``/health``; its output goes to a log the failure shows."""
    import httpx

    from ..conftest import _forkserver_context

    port = words[words.index("--port") + 1]
    log = Path(tempfile.mkstemp(prefix="serve-reference-", suffix=".log")[1])
    proc = _forkserver_context().Process(target=_run_cli, args=(words[1:], str(log)), daemon=True)
    proc.start()
    try:
        deadline = time.monotonic() + 60
        with httpx.Client(timeout=1.0) as client:
            while True:
                assert proc.is_alive(), log.read_text()[-3000:]
                with contextlib.suppress(httpx.TransportError):
                    if client.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                        break
                assert time.monotonic() < deadline, f"{shlex.join(words)}: no /health in 60 s"
                time.sleep(0.1)
    finally:
        proc.terminate()
        proc.join(timeout=15)
        log.unlink(missing_ok=True)


def _run_cli(argv: list[str], log: str) -> None:
    """The child's work: the CLI's ``main`` with its output in ``log``."""
    from distill_guard.cli import main

    with open(log, "w") as out:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
        sys.exit(main(argv))


def _make(words: list[str], ctx: Context) -> None:
    done = subprocess.run(["make", "-n", *words[1:]], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, f"{shlex.join(words)}: {done.stderr}"


APPS = {"examples.sdpo_sciknoweval.app": ("examples/sdpo_sciknoweval/app.py", "sdpo_sciknoweval")}
"""Hydra apps the docs run: module → (file, config name in conf/)."""


def _python_module(words: list[str], ctx: Context) -> None:
    """The app's config composed with the command's overrides, as ``python -m`` would."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    assert words[1] == "-m" and words[2] in APPS, f"no runner for {shlex.join(words)!r}"
    source, config_name = APPS[words[2]]
    assert f'config_name="{config_name}"' in (ROOT / source).read_text()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
            cfg = compose(config_name, overrides=words[3:])
    finally:
        GlobalHydra.instance().clear()
    assert cfg, shlex.join(words)


def _export(words: list[str], ctx: Context) -> None:
    """``export NAME=VALUE``: set for the rest of the snippet (a well-formed assignment)."""
    for word in words[1:]:
        name, eq, value = word.partition("=")
        assert eq and name.isidentifier(), f"export {word!r}: not NAME=VALUE"
        ctx.stack.enter_context(env_var(name, value))


def _pip_install(words: list[str], ctx: Context) -> None:
    from packaging.requirements import Requirement

    assert words[1] == "install", shlex.join(words)
    from importlib.metadata import metadata

    extras = set(metadata("distill_guard").get_all("Provides-Extra") or [])
    makefile = (ROOT / "Makefile").read_text()
    for word in words[2:]:
        if word.startswith("-") or word.startswith("http"):
            continue
        if word == "." or word.startswith(".["):  # this checkout
            assert (ROOT / "pyproject.toml").exists()
            word = "distill_guard" + word[1:]
        req = Requirement(word)
        if req.name.replace("-", "_") == "distill_guard":
            assert req.extras <= extras, f"{word}: no such extra (pyproject has {sorted(extras)})"
        elif req.name == "torch":
            assert f'"torch{req.specifier}"' in makefile, f"{word}: not the Makefile's torch pin"
        else:
            raise AssertionError(f"{shlex.join(words)}: installs {req.name}, not distill_guard")
