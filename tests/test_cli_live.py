"""The live CLI commands: probe, preflight, serve-reference; exit codes and output."""

from __future__ import annotations

import io
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from distill_guard.cli import build_parser, main
from distill_guard.teachers import SGLangHTTPTeacher, TorchTeacher
from distill_guard.testing.servers import child_env, reference_subprocess, reference_teacher
from distill_guard.testing.tiny import build_tiny_qwen3


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_qwen3(tmp_path_factory.mktemp("cli_tiny"), vocab_size=512)


def test_live_commands_share_the_one_parser() -> None:
    parser = build_parser()
    for argv in (["probe", "--url", "http://x"], ["preflight", "--args", "x"],
                 ["serve-reference", "--model", "m", "--port", "1"]):  # fmt: skip
        args = parser.parse_args(argv)
        assert callable(args.func)
    assert parser.parse_args(["probe", "--url", "u", "--tags", "weights", "kv_cache"]).tags == [
        "weights",
        "kv_cache",
    ]


def test_probe_without_backup_exits_1_names_the_flag_and_repairs(tiny_dir, capsys) -> None:
    with reference_teacher(tiny_dir) as (url, _):
        assert main(["probe", "--url", url, "--cycles", "2"]) == 1
        out = capsys.readouterr().out
        assert "--enable-weights-cpu-backup" in out and "teacher.fingerprint_mismatch" in out
        assert "weights checksum" in out  # found before the held traffic ran, no canary on it
        assert "was repaired" in out and "UNHEALTHY (exit 1)" in out


def test_probe_with_backup_exits_0(tiny_dir, capsys) -> None:
    with reference_teacher(tiny_dir, enable_cpu_backup=True) as (url, _):
        assert main(["probe", "--url", url, "--cycles", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is True and out["repaired"] is False and len(out["cycles"]) == 2


def test_probe_of_an_unreachable_url_exits_2_quickly(capsys) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    assert main(["probe", "--url", f"http://127.0.0.1:{port}", "--timeout", "2"]) == 2
    assert time.monotonic() - t0 < 2.5
    assert "cannot reach" in capsys.readouterr().err


def test_probe_of_a_silent_server_exits_2_within_the_timeout(capsys) -> None:
    with socket.socket() as s:  # accepts, never answers
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        t0 = time.monotonic()
        assert (
            main(["probe", "--url", f"http://127.0.0.1:{s.getsockname()[1]}", "--timeout", "1"])
            == 2
        )
        assert time.monotonic() - t0 < 1.8
    assert "no answer within 1 s" in capsys.readouterr().err


def test_preflight_from_args_and_url(tiny_dir, capsys) -> None:
    relax = ("python train.py --use-opd --opd-type sglang --teacher-hf-checkpoint /t --colocate "
             "--resource '{\"actor\":[1,4],\"rollout\":[1,3],\"teacher\":[1,1]}'")  # fmt: skip
    assert main(["preflight", "--args", relax]) == 1
    assert "--teacher-sglang-enable-weights-cpu-backup" in capsys.readouterr().out
    assert (
        main(
            ["preflight", "--args", relax + " --teacher-sglang-enable-weights-cpu-backup", "--json"]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["ok"] is True
    with reference_teacher(tiny_dir, version="0.5.2") as (url, _):
        assert main(["preflight", "--url", url]) == 1  # before the backup flag existed
    assert main(["preflight"]) == 2
    assert "exactly one of" in capsys.readouterr().err


@pytest.mark.slow  # the README live-server snippet runs both commands (serve-reference as a process)
def test_serve_reference_and_probe_as_processes(tiny_dir) -> None:
    """The real commands end to end: after a probe that found the weights lost, the teacher scores
    correctly again."""
    expected = TorchTeacher.from_pretrained(tiny_dir).score([list(range(9, 70))], top_k=4)
    with reference_subprocess(tiny_dir, "--torch-threads", "1") as url:
        probe = subprocess.run(
            [sys.executable, "-m", "distill_guard.cli", "probe", "--url", url, "--cycles", "3"],
            env=child_env(), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert probe.returncode == 1, probe.stdout + probe.stderr
        assert "--enable-weights-cpu-backup" in probe.stdout and "was repaired" in probe.stdout
        with SGLangHTTPTeacher(url) as t:
            info = t.server_info()
            assert (
                "NOT SGLang" in info["emulated_by"] and "serve-reference" in info["launch_command"]
            )
            assert info["version"] == "0.5.23" and t.capabilities.checksum
            got = t.score([list(range(9, 70))], top_k=4)
    assert torch.equal(got.topk_logprobs[0], expected.topk_logprobs[0])


def test_serve_reference_requires_a_model(tmp_path, capsys) -> None:
    assert main(["serve-reference", "--model", str(tmp_path / "none"), "--port", "1"]) == 2
    assert "no config.json" in capsys.readouterr().err


def test_probe_refused_the_pause_exits_2_in_one_line_and_leaves_the_teacher_serving(
    tiny_dir, capsys, monkeypatch
) -> None:
    """A 401 on ``/pause_generation`` (a wrong admin key): nothing can be released, so the probe
    cycles nothing, says why in one line and exits 2; it used to end in ``KeyError: 'release'``.
    The teacher still scores."""
    from distill_guard.testing.reference_server import ReferenceServer, serve_in_thread

    server = ReferenceServer(TorchTeacher.from_pretrained(tiny_dir), admin_api_key="adm1n")
    with serve_in_thread(server) as url:
        monkeypatch.setenv("SGLANG_ADMIN_API_KEY", "wrong")
        assert main(["probe", "--url", url, "--cycles", "2"]) == 2
        err = capsys.readouterr().err
        said = [line for line in err.splitlines() if line.startswith("distill-guard probe")]
        assert len(said) == 1 and "Traceback" not in err, err
        assert "could not be put to sleep (" in said[0] and "HTTP 401" in said[0], said
        assert "left serving as it was" in said[0] and "wrong" not in err  # no key shown
        monkeypatch.delenv("SGLANG_ADMIN_API_KEY")
        with SGLangHTTPTeacher(url) as t:
            assert not t.asleep and len(t.score([list(range(9, 30))]).token_logprobs[0]) == 20


@pytest.mark.parametrize("status", [404, 500])
def test_probe_whose_release_is_refused_exits_2_and_reloads_nothing(
    tiny_dir, capsys, status
) -> None:
    """The pause goes through but the release answers an error: nothing was released, so the
    probe neither claims lost weights nor reloads a teacher that is as it was (it used to report
    "lost its weights and was repaired" after an unneeded reload); one line, exit 2, the
    traffic let go, the teacher serving."""
    import importlib

    from starlette.responses import JSONResponse

    from distill_guard.testing.reference_server import ReferenceServer
    from distill_guard.testing.reference_server.app import create_app

    serve = importlib.import_module("distill_guard.testing.reference_server.serve")
    server = ReferenceServer(TorchTeacher.from_pretrained(tiny_dir, enable_cpu_backup=True))
    app = create_app(server)
    seen: list[str] = []

    @app.middleware("http")
    async def refuse_release(request, call_next):
        seen.append(request.url.path)
        if request.url.path == "/release_memory_occupation":
            return JSONResponse({"detail": "refused"}, status_code=status)
        return await call_next(request)

    with serve.ServerThread(app) as thread:
        assert main(["probe", "--url", thread.url, "--cycles", "2"]) == 2
        err = capsys.readouterr().err
        said = [line for line in err.splitlines() if line.startswith("distill-guard probe")]
        assert len(said) == 1 and "Traceback" not in err, err
        assert f"HTTP {status}" in said[0] and "left serving as it was" in said[0], said
        assert "/update_weights_from_disk" not in seen and "/continue_generation" in seen
        with SGLangHTTPTeacher(thread.url) as t:
            assert len(t.score([list(range(9, 30))]).token_logprobs[0]) == 20


def test_probe_of_a_version_without_a_pause_route_exits_2_in_one_line(tiny_dir, capsys) -> None:
    """SGLang 0.4.8 has no /pause_generation: the guard's sleep cannot be made safe there, so
    the probe releases nothing, says so in one line and exits 2; the teacher still scores."""
    with reference_teacher(tiny_dir, version="0.4.8") as (url, teacher):
        assert main(["probe", "--url", url, "--cycles", "2"]) == 2
        err = capsys.readouterr().err
        said = [line for line in err.splitlines() if line.startswith("distill-guard probe")]
        assert len(said) == 1 and "Traceback" not in err, err
        assert "0.4.8 has no /pause_generation" in said[0] and "left serving" in said[0], said
        assert not teacher.asleep
        with SGLangHTTPTeacher(url) as t:
            assert len(t.score([list(range(9, 30))]).token_logprobs[0]) == 20


def test_the_admin_key_is_read_from_the_variable_named_on_the_command_line(
    tiny_dir, capsys, monkeypatch
) -> None:
    from distill_guard.testing.reference_server import ReferenceServer, serve_in_thread

    server = ReferenceServer(
        TorchTeacher.from_pretrained(tiny_dir, enable_cpu_backup=True), admin_api_key="adm1n"
    )
    with serve_in_thread(server) as url:
        monkeypatch.setenv("MY_ADMIN_KEY", "adm1n")
        assert (
            main(["probe", "--url", url, "--cycles", "1", "--admin-api-key-env", "MY_ADMIN_KEY"])
            == 0
        )
        assert "adm1n" not in capsys.readouterr().out


@pytest.mark.parametrize("version", [0.5, "0.5.23rc1"])
def test_preflight_of_a_server_whose_version_names_no_release_says_so(
    tiny_dir, capsys, version
) -> None:
    """``/server_info`` answers ``"version": 0.5`` (a JSON number) or a pre-release: no
    traceback, and a warning naming the version and the conservative reading, never a clean
    bill of health by silence."""
    import importlib

    from starlette.responses import JSONResponse

    from distill_guard.testing.reference_server import ReferenceServer
    from distill_guard.testing.reference_server.app import create_app

    serve = importlib.import_module("distill_guard.testing.reference_server.serve")
    app = create_app(
        ReferenceServer(TorchTeacher.from_pretrained(tiny_dir, enable_cpu_backup=True))
    )

    @app.middleware("http")
    async def odd_version(request, call_next):
        response = await call_next(request)
        if request.url.path not in ("/server_info", "/get_server_info"):
            return response
        info = json.loads(b"".join([chunk async for chunk in response.body_iterator]))
        return JSONResponse(info | {"version": version})

    with serve.ServerThread(app) as thread:
        main(["preflight", "--url", thread.url])
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    assert "[WARN    ] config.unchecked" in out.out and repr(version) in out.out, out.out


def test_preflight_of_a_misspelt_memory_saver_flag_exits_1_naming_it(capsys) -> None:
    """Issue 28: a misspelt --enable-memory-saverr reported "no critical problem"."""
    cmd = "python -m sglang.launch_server --model-path m --enable-memory-saverr"
    assert main(["preflight", "--args", cmd]) == 1
    out = capsys.readouterr().out
    assert "problems found" in out and "did you mean --enable-memory-saver?" in out


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("json_output", [False, True])
def test_probe_progress_goes_to_a_terminal_only_and_never_under_json(
    tiny_dir, capsys, monkeypatch, json_output
) -> None:
    """Issue 28: probe printed nothing until it ended, and did not say that a failed cycle
    ended the loop; progress goes to stderr only when it is a terminal and --json is off."""
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    argv = ["--cycles", "3"] + (["--json"] if json_output else [])
    with reference_teacher(tiny_dir) as (url, _):
        assert main(["probe", "--url", url, *argv]) == 1
    out = capsys.readouterr().out
    stopped = "stopped after cycle 1 of 3: it lost its weights (repaired and verified)"
    # the in-process reference server's own weight loading writes there too: not ours
    lines = [line for line in terminal.getvalue().splitlines() if line.startswith("probe:")]
    if json_output:
        assert lines == [] and json.loads(out)["stopped"] == stopped
    else:
        assert lines[0].startswith(f"probe: preflight and canary of {url}, then 3 cycle(s)")
        assert lines[1].startswith("probe: cycle 1 of 3: teacher.fingerprint_mismatch")
        assert lines[2] == f"probe: {stopped}"
        assert "Stopped after cycle 1 of 3: it lost its weights (repaired and verified)." in out


def test_probe_to_a_pipe_writes_no_progress(tiny_dir, capsys) -> None:
    with reference_teacher(tiny_dir, enable_cpu_backup=True) as (url, _):
        assert main(["probe", "--url", url, "--cycles", "1"]) == 0
    assert "probe: cycle" not in capsys.readouterr().err
