"""The guarded Relax launchers pass only flags their Relax line really defines.

Relax parses its command line with ``parse_known_args`` everywhere, so a flag it does not define is
dropped without a word. Here each launcher's command (``DRY_RUN=1``) is parsed with ``parse_args``
against the argument definitions recorded from named commits in ``examples/relax/flags/``: Relax's
own flags for the line, Megatron-LM's, and SGLang's server flags mirrored as ``--sglang-*`` and
``--teacher-sglang-*``. Every flag must be known and every value must parse.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "relax"
FLAGS = EXAMPLES / "flags"
MEGATRON = "megatron-lm-85bced0a.txt"
RECIPE = FLAGS / "recipe-sdpo-biology-6bc26c5.flags"
ENTRY = ["python", "-m", "relax.entrypoints.train"]
HOOKS = "distill_guard.integrations.relax"
GUARD_FLAGS = {
    "--dynamic-sampling-filter-path": f"{HOOKS}.dynamic_sampling_filter",
    "--custom-convert-samples-to-train-data-path": f"{HOOKS}.convert_samples_to_train_data",
    "--custom-megatron-before-train-step-hook-path": f"{HOOKS}.before_train_step_hook",
    "--custom-rollout-log-function-path": f"{HOOKS}.rollout_log_function",
    "--custom-eval-rollout-log-function-path": f"{HOOKS}.eval_rollout_log_function",
}
REWRITE_HOOKS = {"dynamic_sampling_filter", "before_train_step_hook"}
BACKUP = "--teacher-sglang-enable-weights-cpu-backup"


@dataclass(frozen=True)
class Line:
    """One Relax line: its launcher, its flag table, the SGLang tables it may run with."""

    script: str
    relax: str
    sglang: tuple[str, ...]
    gates: str


SDPO = Line(
    "run-sciknoweval-biology-4xgpu-colocate-guarded.sh",
    "redai-infra-Relax-6bc26c5.txt",
    ("sglang-0.5.9.txt", "sglang-0.5.17.txt"),
    "filter,convert,train_step,log,feedback",
)
CURRENT = Line(
    "run-opd-guarded-redai-studio.sh",
    "redai-studio-Relax-02bf712a.txt",
    ("sglang-0.5.17.txt",),
    "filter,convert,train_step,log",
)
LINES = {"sdpo": SDPO, "current": CURRENT}
TABLES = [(name, sglang) for name, line in LINES.items() for sglang in line.sglang]


# ------------------------------------------------------------------------------- flag tables


@dataclass(frozen=True)
class Flag:
    name: str
    kind: str
    tags: tuple[str, ...] = ()

    def tag(self, key: str) -> str | None:
        return next((t[len(key) :] for t in self.tags if t.startswith(key)), None)

    @property
    def dest(self) -> str:
        return self.tag("dest=") or self.name.lstrip("-").replace("-", "_")


def read_table(name: str) -> tuple[list[Flag], list[tuple[str, frozenset[str]]]]:
    """A recorded table: its flags, and its ``@mirror`` lines (prefix, skipped dests)."""
    flags, mirrors = [], []
    for row in (FLAGS / name).read_text().splitlines():
        if not row or row.startswith("#"):
            continue
        first, second, *tags = row.split("\t")
        if first == "@mirror":
            skip = tags[0].removeprefix("skip-dest:")
            mirrors.append((second, frozenset(skip.split(","))))
        else:
            flags.append(Flag(first, second, tuple(tags)))
    return flags, mirrors


def mirror(sglang: list[Flag], prefix: str, skip: frozenset[str]) -> list[Flag]:
    """What Relax's wrapper makes of SGLang's flags: ``--X`` becomes ``<prefix>X`` unless its dest
    is skipped, and BooleanOptionalAction generates ``--no-<prefix>X`` from the prefixed name."""
    by_name = {f.name: f for f in sglang}
    out = []
    for f in sglang:
        negated = f.tag("negation-of:")
        source = by_name[negated] if negated else f
        if source.dest in skip:
            continue
        stem = prefix[2:] + source.name[2:]
        out.append(Flag(f"--no-{stem}" if negated else f"--{stem}", f.kind, f.tags))
    return out


def flag_table(line: Line, sglang_file: str) -> dict[str, Flag]:
    """Every flag ``python -m relax.entrypoints.train`` accepts on ``line``."""
    table = {f.name: f for f in read_table(MEGATRON)[0]}
    relax, mirrors = read_table(line.relax)
    for f in relax:
        if f.name in table:  # reset_arg: Megatron's definition stands
            assert "reset_arg" in f.tags, f"{f.name} is defined by both Megatron and Relax"
            continue
        table[f.name] = f
    sglang = read_table(sglang_file)[0]
    for prefix, skip in mirrors:
        for f in mirror(sglang, prefix, skip):
            assert f.name not in table, f"{f.name}: Relax defines it and mirrors it"
            table[f.name] = f
    return table


class Rejected(Exception):
    """The parser refused the command line."""


class StrictParser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would print and exit
        raise Rejected(message)


NARGS = {"value": None, "value?": "?", "values": "+", "values*": "*"}
TYPES = {"int": int, "float": float, "json": json.loads}


def build_parser(table: dict[str, Flag]) -> StrictParser:
    parser = StrictParser(prog="relax.entrypoints.train", allow_abbrev=False, add_help=False)
    for f in table.values():
        if f.kind == "switch":
            parser.add_argument(f.name, dest=f.name, action="store_true")
            continue
        kw: dict = {"dest": f.name}
        kw["nargs"] = int(f.kind[7:]) if f.kind.startswith("values:") else NARGS[f.kind]
        choices = f.tag("choices:")
        if choices is not None:
            kw["choices"] = choices.split(",")
        for t in f.tags:
            if t in TYPES:
                kw["type"] = TYPES[t]
        parser.add_argument(f.name, **kw)
    return parser


# ---------------------------------------------------------------------------------- launchers


def dry_run(line: Line, tmp_path: Path, **env: str) -> tuple[dict[str, str], list[str]]:
    """The launcher's exported environment and command, with DRY_RUN=1 outside any checkout."""
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    relax_dir = tmp_path / "relax"
    relax_dir.mkdir(exist_ok=True)
    base = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "DRY_RUN": "1",
        "STUDENT_MODEL_PATH": "/models/Qwen3-8B",
        "RELAX_DIR": str(relax_dir),
        "SAVE_DIR": str(tmp_path / "save"),
        "EXPERIMENT_NAME": "guarded-test",
    }
    out = subprocess.run(
        ["bash", str(EXAMPLES / line.script)],
        env={**base, **env},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    *env_lines, command = out.strip().splitlines()
    return dict(row.split("=", 1) for row in env_lines), shlex.split(command)


def train_args(argv: list[str]) -> list[str]:
    assert argv[: len(ENTRY)] == ENTRY
    return argv[len(ENTRY) :]


def value(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def listed_changes(script: Path) -> dict[str, str]:
    """The recipe flags a launcher's comment block lists as changed or dropped, with the reason."""
    pattern = re.compile(r"^#\s+(?:changed|dropped) (--[\w-]+): (\S.*)$")
    return {m[1]: m[2] for m in map(pattern.match, script.read_text().splitlines()) if m}


def recipe_flags() -> list[tuple[str, list[str]]]:
    """Each ``--flag`` line of the recorded recipe, with its literal values (shell words)."""
    rows = []
    for row in RECIPE.read_text().splitlines():
        if row.strip().startswith("--"):
            name, *values = shlex.split(row)
            rows.append((name, values))
    return rows


@pytest.mark.parametrize("backup", ["1", "0"])
@pytest.mark.parametrize(("line_name", "sglang"), TABLES)
def test_every_flag_is_defined_on_its_line(tmp_path, line_name, sglang, backup):
    line = LINES[line_name]
    _, argv = dry_run(line, tmp_path, TEACHER_CPU_BACKUP=backup)
    args = build_parser(flag_table(line, sglang)).parse_args(train_args(argv))
    assert vars(args)["--resource"] == {"actor": [1, 4], "rollout": [1, 3], "teacher": [1, 1]}
    assert vars(args)["--opd-log-prob-top-k"] == 16


def test_the_check_is_not_vacuous():
    current = build_parser(flag_table(CURRENT, "sglang-0.5.17.txt"))
    sdpo = build_parser(flag_table(SDPO, "sglang-0.5.9.txt"))
    feedback = ["--opd-feedback-class", f"{HOOKS}.GuardedGoldenAnswerSDPOFeedback"]
    assert vars(sdpo.parse_args(feedback))["--opd-feedback-class"] == feedback[1]
    for bad in (
        feedback,  # SDPO branch only
        ["--opd-feedback-cl", "x"],  # an abbreviation
        ["--opd-kl-type", "jsdd"],  # not a choice
        ["--opd-log-prob-top-k", "16.5"],  # not an int
        ["--resource", "{actor: 4}"],  # not JSON
        ["--teacher-sglang-enable-memory-saver"],  # skipped by the teacher mirror
        ["--sglang-no-dcp-replicate-q-proj"],  # argparse names it --no-sglang-...
    ):
        with pytest.raises(Rejected):
            current.parse_args(bad)
    assert vars(current.parse_args(["--no-sglang-dcp-replicate-q-proj"]))[
        "--no-sglang-dcp-replicate-q-proj"
    ]


@pytest.mark.parametrize("line_name", LINES)
def test_no_flag_is_an_abbreviation_in_the_sglang_parsers(tmp_path, line_name):
    """Relax's two SGLang parsers keep allow_abbrev=True: a flag that is the start of one of their
    flags (and not one of them) would be taken for it there."""
    line = LINES[line_name]
    _, argv = dry_run(line, tmp_path, TEACHER_CPU_BACKUP="0")
    mirrors = read_table(line.relax)[1]
    mirrored = {
        f.name
        for sglang in line.sglang
        for prefix, skip in mirrors
        for f in mirror(read_table(sglang)[0], prefix, skip)
    }
    for flag in (a for a in train_args(argv) if a.startswith("--")):
        taken = sorted(m for m in mirrored if m.startswith(flag) and m != flag)
        assert flag in mirrored or not taken, f"{flag} abbreviates {taken}"


@pytest.mark.parametrize("line_name", LINES)
def test_entry_point_hooks_and_gates(tmp_path, line_name):
    line = LINES[line_name]
    env, argv = dry_run(line, tmp_path)
    assert argv[: len(ENTRY)] == ENTRY
    assert env["DISTILL_GUARD_GATES"] == line.gates
    for flag, path in GUARD_FLAGS.items():
        assert value(argv, flag) == path
    if line is SDPO:
        assert value(argv, "--opd-feedback-class") == f"{HOOKS}.GuardedGoldenAnswerSDPOFeedback"
        assert json.loads(value(argv, "--opd-feedback-kwargs")) == {"guard_on_collapse": "mask"}
    else:
        assert "--opd-feedback-class" not in argv and "--opd-feedback-kwargs" not in argv
    assert env["DISTILL_GUARD_PRESET"] == "default"
    assert env["DISTILL_GUARD_OVERRIDES"] == "run.vocab_size=151936"
    assert env["DISTILL_GUARD_ON_DEAD_TEACHER"] == "halt"
    assert env["DISTILL_GUARD_EVENTS"] == str(tmp_path / "save/distill_guard/events.jsonl")
    assert value(argv, "--save") == str(tmp_path / "save")


@pytest.mark.parametrize("line_name", LINES)
def test_every_hook_path_resolves(tmp_path, line_name):
    _, argv = dry_run(LINES[line_name], tmp_path)
    paths = [value(argv, flag) for flag in (*GUARD_FLAGS, "--opd-feedback-class") if flag in argv]
    missing = []
    for path in paths:
        module_name, _, attr = path.rpartition(".")
        module = importlib.import_module(module_name)
        if attr in REWRITE_HOOKS and not hasattr(module, attr):
            missing.append(path)
            continue
        assert callable(getattr(module, attr)), path
    if missing:
        pytest.xfail(f"provided by the Relax gate rewrite: {', '.join(missing)}")


@pytest.mark.parametrize("line_name", LINES)
def test_settings_reach_the_ray_actors(tmp_path, line_name):
    env, _ = dry_run(
        LINES[line_name],
        tmp_path,
        RELAX_PROPAGATE_ENV_VARS="MY_VAR,OTHER",
        DISTILL_GUARD_ON_DEAD_TEACHER="repair",
        DISTILL_GUARD_TEACHER_URL="http://teacher:30000/generate",
    )
    listed = env["RELAX_PROPAGATE_ENV_VARS"].split(",")
    assert listed[:2] == ["MY_VAR", "OTHER"]
    guard_vars = {name for name in env if name.startswith("DISTILL_GUARD_")}
    assert {"DISTILL_GUARD_TEACHER_URL", "DISTILL_GUARD_GATES"} <= guard_vars
    assert guard_vars <= set(listed)
    assert "RELAX_OPD_PER_POS_TOKEN_IDS" in listed
    assert len(listed) == len(set(listed))
    assert env["DISTILL_GUARD_ON_DEAD_TEACHER"] == "repair"


@pytest.mark.parametrize("line_name", LINES)
def test_a_bad_setting_stops_the_launcher(tmp_path, line_name):
    for bad in ({"DISTILL_GUARD_ON_DEAD_TEACHER": "ignore"}, {"TEACHER_CPU_BACKUP": "off"}):
        with pytest.raises(subprocess.CalledProcessError):
            dry_run(LINES[line_name], tmp_path, **bad)


def test_sdpo_teacher_cpu_backup(tmp_path):
    _, with_backup = dry_run(SDPO, tmp_path, TEACHER_CPU_BACKUP="1")
    _, without = dry_run(SDPO, tmp_path, TEACHER_CPU_BACKUP="0")
    assert BACKUP in with_backup and BACKUP not in without
    assert "--custom-config-path" not in with_backup + without


def test_current_teacher_cpu_backup(tmp_path):
    yaml = pytest.importorskip("yaml")
    _, with_backup = dry_run(CURRENT, tmp_path, TEACHER_CPU_BACKUP="1")
    assert BACKUP in with_backup and "--custom-config-path" not in with_backup
    _, without = dry_run(CURRENT, tmp_path, TEACHER_CPU_BACKUP="0")
    assert BACKUP not in without
    config = Path(value(without, "--custom-config-path"))
    assert yaml.safe_load(config.read_text()) == {"teacher_sglang_enable_weights_cpu_backup": False}


@pytest.mark.parametrize("line_name", LINES)
def test_load_dir_resumes_the_trainer_from_a_checkpoint(tmp_path, line_name):
    """``LOAD_DIR`` adds Megatron's ``--load`` (defined on both lines): the relaunch after a halt
    (docs/after-a-halt.md); unset, a fresh run loads nothing."""
    line = LINES[line_name]
    _, fresh = dry_run(line, tmp_path)
    _, resumed = dry_run(line, tmp_path, LOAD_DIR=str(tmp_path / "save"))
    assert "--load" not in fresh and value(resumed, "--load") == str(tmp_path / "save")
    build_parser(flag_table(line, line.sglang[-1])).parse_args(train_args(resumed))


@pytest.mark.parametrize("line_name", LINES)
def test_the_recipe_is_kept(tmp_path, line_name):
    """Every flag of Relax's recipe is in the command, with the recipe's literal values, unless the
    launcher's comment block lists it as changed or dropped with a reason; a dropped flag is one
    the line does not define."""
    line = LINES[line_name]
    _, argv = dry_run(line, tmp_path)
    changes = listed_changes(EXAMPLES / line.script)
    recipe = recipe_flags()
    assert len(recipe) > 70 and set(changes) <= {name for name, _ in recipe}
    table = flag_table(line, line.sglang[-1])
    for name, reason in changes.items():
        assert reason
        if f"dropped {name}:" in (EXAMPLES / line.script).read_text():
            assert name not in argv and name not in table
    for name, values in recipe:
        if name in changes:
            continue
        assert name in argv, f"{name} of the recipe is missing"
        at = argv.index(name)
        for i, v in enumerate(values):
            if "$" not in v:
                assert argv[at + 1 + i] == v, f"{name}: {argv[at + 1 + i]!r} != recipe's {v!r}"
    if line is SDPO:
        assert set(changes) == {"--opd-feedback-class", BACKUP}
