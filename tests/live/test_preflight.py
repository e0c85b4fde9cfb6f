"""Preflight: server args, SGLang and Relax command lines, and a live teacher."""

from __future__ import annotations

import pytest

from distill_guard.findings import Code, Severity
from distill_guard.live.preflight import parse_launch_command, preflight_server_args


def codes(findings) -> dict[str, Severity]:
    return {f.code: f.severity for f in findings}


def test_memory_saver_without_backup_is_critical_and_names_the_flag() -> None:
    got = preflight_server_args({"enable_memory_saver": True, "enable_weights_cpu_backup": False})
    f = next(f for f in got if f.code == Code.CONFIG_NO_WEIGHTS_BACKUP)
    assert f.severity is Severity.CRITICAL and "Add --enable-weights-cpu-backup" in f.message
    assert f.values["flag"] == "--enable-weights-cpu-backup"


def test_healthy_and_deterministic_server_has_no_findings() -> None:
    args = {"enable_memory_saver": True, "enable_weights_cpu_backup": True,
            "enable_deterministic_inference": True, "weight_cache_mode": "off"}  # fmt: skip
    assert preflight_server_args(args) == []
    assert (
        preflight_server_args(
            {"enable_memory_saver": False, "enable_deterministic_inference": True}
        )
        == []
    )


def test_weight_cache_mode_that_disables_the_backup_warns() -> None:
    args = {
        "enable_memory_saver": True,
        "enable_weights_cpu_backup": True,
        "weight_cache_mode": "ipc",
    }
    got = codes(preflight_server_args(args))
    assert got[Code.CONFIG_BACKUP_DISABLED_BY_CACHE_MODE] is Severity.WARN
    assert got[Code.CONFIG_NONDETERMINISTIC] is Severity.INFO
    assert Code.CONFIG_NO_WEIGHTS_BACKUP not in got


def test_a_server_that_predates_the_backup_flag_is_critical() -> None:
    got = preflight_server_args({"enable_memory_saver": True})
    f = next(f for f in got if f.code == Code.CONFIG_NO_WEIGHTS_BACKUP)
    assert "before 0.5.3" in f.message


def test_sglang_launch_command_with_continuations() -> None:
    cmd = """python -m sglang.launch_server --model-path /ckpt/Qwen3-8B \\
        --port 30000 --enable-memory-saver --mem-fraction-static=0.5 \\
        --enable-deterministic-inference"""
    args = parse_launch_command(cmd)
    assert args["launcher"] == "sglang" and args["model_path"] == "/ckpt/Qwen3-8B"
    assert args["enable_memory_saver"] and not args["enable_weights_cpu_backup"]
    assert args["flags"]["mem_fraction_static"] == "0.5" and args["flags"]["port"] == "30000"
    assert codes(preflight_server_args(args)) == {Code.CONFIG_NO_WEIGHTS_BACKUP: Severity.CRITICAL}
    fixed = parse_launch_command(cmd + " --enable-weights-cpu-backup")
    assert preflight_server_args(fixed) == []


RELAX = (
    "python train.py --use-opd --opd-type sglang --teacher-hf-checkpoint /ckpt/teacher "
    '--colocate --resource \'{"actor":[1,4],"rollout":[1,3],"teacher":[1,1]}\' '
    "--teacher-num-gpus-per-engine 1 --sglang-mem-fraction-static 0.45"
)


def test_relax_colocated_teacher_without_backup_is_critical_with_relax_flag() -> None:
    args = parse_launch_command(RELAX)
    assert args["launcher"] == "relax" and args["teacher_managed"] and args["colocate"]
    assert args["enable_memory_saver"] and args["offload_rollout"]  # colocate defaults it on
    f = next(f for f in preflight_server_args(args) if f.code == Code.CONFIG_NO_WEIGHTS_BACKUP)
    assert f.severity is Severity.CRITICAL
    assert "--teacher-sglang-enable-weights-cpu-backup" in f.message
    assert "inherits the student's --sglang-*" in f.message


@pytest.mark.parametrize(
    ("extra", "source"),
    [(" --teacher-sglang-enable-weights-cpu-backup", "--teacher-sglang-enable-weights-cpu-backup"),
     (" --sglang-enable-weights-cpu-backup", "--sglang-enable-weights-cpu-backup")],
)  # fmt: skip
def test_relax_backup_from_the_teacher_flag_or_inherited_from_the_student(extra, source) -> None:
    args = parse_launch_command(RELAX + extra)
    assert args["enable_weights_cpu_backup"] and args["backup_source"] == source
    assert Code.CONFIG_NO_WEIGHTS_BACKUP not in codes(preflight_server_args(args))


@pytest.mark.parametrize(
    "cmd",
    [RELAX.replace("--colocate ", ""), RELAX + " --hybrid",
     RELAX.replace(',\\"teacher\\":[1,1]', "").replace(',"teacher":[1,1]', "")],
)  # fmt: skip
def test_relax_teacher_that_does_not_sleep_has_no_backup_problem(cmd) -> None:
    args = parse_launch_command(cmd)
    assert not args["enable_memory_saver"]
    assert Code.CONFIG_NO_WEIGHTS_BACKUP not in codes(preflight_server_args(args))


def test_relax_external_teacher_is_unchecked_info() -> None:
    cmd = "python train.py --use-opd --opd-type sglang --opd-teacher-url http://t:30000/generate --colocate"
    got = preflight_server_args(parse_launch_command(cmd))
    assert [(f.code, f.severity) for f in got] == [(Code.CONFIG_UNCHECKED, Severity.INFO)]
    assert "--url" in got[0].message


def test_relax_deterministic_flag_and_fsdp_target() -> None:
    on = parse_launch_command(RELAX + " --teacher-sglang-enable-deterministic-inference")
    assert on["enable_deterministic_inference"]
    assert parse_launch_command(RELAX + " --sglang-rl-on-policy-target fsdp")[
        "enable_deterministic_inference"
    ]
    off = preflight_server_args(parse_launch_command(RELAX))
    f = next(f for f in off if f.code == Code.CONFIG_NONDETERMINISTIC)
    assert "--teacher-sglang-enable-deterministic-inference" in f.message


def test_preflight_of_a_live_teacher(tmp_path) -> None:

    from distill_guard.live.preflight import preflight_teacher
    from distill_guard.teachers import TorchTeacher
    from distill_guard.testing.tiny import build_tiny_qwen3

    d = build_tiny_qwen3(tmp_path, vocab_size=64)
    assert Code.CONFIG_NO_WEIGHTS_BACKUP in codes(
        preflight_teacher(TorchTeacher.from_pretrained(d))
    )
    ok = TorchTeacher.from_pretrained(
        d, enable_cpu_backup=True, enable_deterministic_inference=True
    )
    assert preflight_teacher(ok) == []


SGLANG = "python -m sglang.launch_server --model-path /ckpt/m --enable-weights-cpu-backup"


@pytest.mark.parametrize(
    ("flag", "meant", "severity"),
    [("--enable-memory-saverr", "--enable-memory-saver", Severity.CRITICAL),
     ("--enable-weights-cpu-bakcup", "--enable-weights-cpu-backup", Severity.CRITICAL),
     ("--mem-fraction-statc=0.5", "--mem-fraction-static", Severity.WARN)],
)  # fmt: skip
def test_a_misspelt_sglang_flag_is_reported_with_the_flag_it_looks_like(flag, meant, severity):
    """Issue 28: --enable-memory-saverr was read as no memory saver: "no critical problem"."""
    got = [f for f in preflight_server_args(parse_launch_command(f"{SGLANG} {flag}"))]
    (f,) = [f for f in got if f.code == Code.CONFIG_UNKNOWN_FLAG]
    assert f.severity is severity and f"did you mean {meant}?" in f.message
    assert f.values["flag"] == flag.partition("=")[0]


def test_a_misspelt_relax_teacher_flag_keeps_its_prefix():
    args = parse_launch_command(RELAX + " --teacher-sglang-enable-weights-cpu-bakup")
    (f,) = [f for f in preflight_server_args(args) if f.code == Code.CONFIG_UNKNOWN_FLAG]
    assert "did you mean --teacher-sglang-enable-weights-cpu-backup?" in f.message


def test_known_and_far_off_flags_are_not_misspellings():
    cmd = (
        f"{SGLANG} --enable-memory-saver --tp-size 2 --dp-size 1 --port 30000 "
        "--disable-cuda-graph --disable-cuda-graph-padding --some-new-flag-of-a-later-release 1"
    )
    assert Code.CONFIG_UNKNOWN_FLAG not in codes(preflight_server_args(parse_launch_command(cmd)))
    assert Code.CONFIG_UNKNOWN_FLAG not in codes(preflight_server_args(parse_launch_command(RELAX)))
