"""The CLI as a command: --version, help for every option, global flags after the subcommand,
a closed pipe, and a preflight that refuses a launcher it does not know."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

import distill_guard
from distill_guard.cli import EXIT_PIPE, build_parser, main


def _actions(parser: argparse.ArgumentParser, path: str = "distill-guard"):
    for action in parser._actions:
        yield path, action
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _actions(sub, f"{path} {name}")


def test_every_option_of_every_subcommand_has_help() -> None:
    seen = list(_actions(build_parser()))
    assert {p for p, _ in seen} >= {
        "distill-guard replay",
        "distill-guard probe",
        "distill-guard preflight",
        "distill-guard serve-reference",
    }
    missing = [f"{p} {a.option_strings or a.dest}" for p, a in seen if not (a.help or "").strip()]
    assert missing == []


def test_version(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"distill-guard {distill_guard.__version__}"


_HEAVY_AFTER = r"""
import json, sys
from distill_guard.cli import main
for argv in ARGVS:
    try:
        main(argv)
    except SystemExit:
        pass
print(json.dumps([m for m in ("torch", "hydra", "omegaconf", "httpx") if m in sys.modules]))
"""


def test_version_and_help_import_neither_torch_nor_hydra() -> None:
    """Issue 28: ``distill-guard --version`` took 3.6 s, all of it importing torch and Hydra
    (``import distill_guard`` imported the guard). Now 0.13 s on the machine that took 3.2."""
    argvs = [["--version"], ["--help"], ["replay", "--help"], ["probe", "--help"]]
    code = f"ARGVS = {argvs!r}\n{_HEAVY_AFTER}"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1]) == []


@pytest.mark.parametrize(
    ("argv", "verbose"),
    [(["replay", "x.jsonl"], False), (["-v", "replay", "x.jsonl"], True),
     (["replay", "x.jsonl", "-v"], True), (["replay", "--verbose", "x.jsonl"], True),
     (["probe", "--url", "u", "-v"], True), (["serve-reference", "--model", "m", "--port", "1", "-v"], True)],
)  # fmt: skip
def test_verbose_before_or_after_the_subcommand(argv, verbose) -> None:
    assert build_parser().parse_args(argv).verbose is verbose


def test_verbose_after_the_subcommand_logs(tmp_path: Path) -> None:
    """In a process of its own: logging is configured once per process (pytest's is taken)."""
    history = tmp_path / "h.jsonl"
    history.write_text(
        "".join(json.dumps({"_step": s, "train/loss": 0.3}) + "\n" for s in range(8))
    )
    cli = [sys.executable, "-m", "distill_guard.cli", "replay", str(history), "-v"]
    loud = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert loud.returncode == 0
    assert "INFO distill_guard: distill_guard: attached" in loud.stderr


def test_a_closed_pipe_is_a_quiet_exit(tmp_path: Path) -> None:
    """`distill-guard replay big.jsonl | head -1`: the reader is gone before the table is
    written; no BrokenPipeError traceback, exit 141 as a shell reports a SIGPIPE."""
    history = tmp_path / "big.jsonl"
    history.write_text(
        "".join(json.dumps({"_step": s, "train/loss": 0.3 + 1e-4 * s}) + "\n" for s in range(400))
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "distill_guard.cli", "replay", str(history), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.close()  # the reader leaves before anything is written
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == EXIT_PIPE
    assert err == ""


@pytest.mark.parametrize(
    "command",
    ["hello world", "vllm serve Qwen/Qwen3-8B --port 8000 --enable-sleep-mode",
     "python3 -m verl.trainer.main_ppo actor_rollout_ref.rollout.name=sglang"],
)  # fmt: skip
def test_preflight_refuses_a_launcher_it_does_not_know(command, capsys) -> None:
    assert main(["preflight", "--args", command]) == 2
    err = capsys.readouterr().err
    assert "not a launch command preflight recognises" in err
    for looked_for in ("sglang.launch_server", "sglang serve", "Relax", "--use-opd"):
        assert looked_for in err
    assert command[:20] in err


@pytest.mark.parametrize(
    "command",
    ["python -m sglang.launch_server --model-path M --enable-memory-saver",
     "/opt/venv/bin/sglang serve --model-path M --enable-memory-saver",
     "python3 -m sglang_router.launch_server --model-path M --dp-size 2 --enable-memory-saver"],
)  # fmt: skip
def test_preflight_knows_both_sglang_launchers(command, capsys) -> None:
    assert main(["preflight", "--args", command]) == 1  # memory saver without weights backup
    assert "no_weights_backup" in capsys.readouterr().out


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.parametrize("name", sorted(_subcommands()))
def test_every_subcommand_shows_usage_examples_that_parse(name) -> None:
    """Issue 28: subcommands had no usage examples. Each example is a command line of this
    subcommand that the parser accepts as written."""
    import shlex

    help_text = _subcommands()[name].format_help()
    assert "\nexamples:\n" in help_text
    lines = help_text.split("\nexamples:\n", 1)[1].strip().splitlines()
    assert lines
    for line in lines:
        words = shlex.split(line.split(">")[0])
        assert words[:2] == ["distill-guard", name], line
        build_parser().parse_args(words[1:])  # raises SystemExit if it does not parse


@pytest.mark.parametrize("name", ["replay", "reference"])
def test_the_preset_option_shows_its_default(name) -> None:
    assert "(default: default)" in " ".join(_subcommands()[name].format_help().split())
