"""The Relax launcher: Relax's recipe flags, the guard's hooks, and every hook path resolves."""

from __future__ import annotations

import importlib
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = (
    Path(__file__).resolve().parents[2]
    / "examples"
    / "relax"
    / "run-sciknoweval-biology-4xgpu-colocate-guarded.sh"
)


def dry_run(**env):
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    out = subprocess.run(
        ["bash", str(SCRIPT)],
        env={**os.environ, "DRY_RUN": "1", "STUDENT_MODEL_PATH": "/models/Qwen3-8B", **env},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    lines = out.strip().splitlines()
    envs = dict(line.split("=", 1) for line in lines[:-1])
    return envs, shlex.split(lines[-1])


def flag(argv, name):
    return argv[argv.index(name) + 1]


def test_recipe_flags_and_guard_hooks():
    envs, argv = dry_run()
    assert flag(argv, "--resource") == '{"actor":[1,4],"rollout":[1,3],"teacher":[1,1]}'
    for name, value in [
        ("--opd-token-selection", "student_topk"),
        ("--opd-log-prob-top-k", "16"),
        ("--opd-kl-type", "jsd"),
        ("--opd-jsd-alpha", "0.5"),
        ("--opd-norm-mode", "tail"),
        ("--global-batch-size", "256"),
        ("--n-samples-per-prompt", "8"),
        ("--rollout-max-response-len", "8192"),
        ("--lr", "1e-6"),
    ]:
        assert flag(argv, name) == value
    assert "--teacher-sglang-enable-weights-cpu-backup" in argv and "--colocate" in argv
    assert envs["RELAX_OPD_PER_POS_TOKEN_IDS"] == "1"
    assert "run.vocab_size=151936" in envs["DISTILL_GUARD_OVERRIDES"]
    relax = importlib.import_module("distill_guard.integrations.relax")
    for name in (
        "--custom-rollout-log-function-path",
        "--custom-eval-rollout-log-function-path",
        "--opd-feedback-class",
    ):
        module, _, attr = flag(argv, name).rpartition(".")
        assert module == relax.__name__ and callable(getattr(relax, attr))
    assert "--custom-megatron-before-train-step-hook-path" not in argv


def test_reproduce_mode_and_mark_mode():
    envs, argv = dry_run(TEACHER_CPU_BACKUP="0", DISTILL_GUARD_HALT="mark")
    assert "--teacher-sglang-enable-weights-cpu-backup" not in argv
    hook = flag(argv, "--custom-megatron-before-train-step-hook-path")
    assert hook == "distill_guard.integrations.relax.before_train_step_hook"
    assert envs["DISTILL_GUARD_HALT"] == "mark"
