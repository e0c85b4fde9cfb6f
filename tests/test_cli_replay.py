"""`distill-guard replay` end to end: the issue's acceptance criteria, output formats, bad input."""

from __future__ import annotations

import io
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from distill_guard.findings import Code
from distill_guard.history import load_history
from distill_guard.metric_names import CONVENTIONS
from distill_guard.replay import replay
from distill_guard.report import replay_figure
from distill_guard.testing.histories import (
    collapsed_history,
    healthy_history,
    renamed,
    seed_history,
    uniform_teacher_history,
)
from tests.conftest import QWEN3_V, write_csv, write_jsonl

REPO = Path(__file__).resolve().parents[1]
SEVERITIES = {"info", "warn", "critical"}
ACTING = {"skip_batch", "rewake", "halt"}


def as_json(out: str) -> dict:
    return json.loads(out)


def check_schema(result: dict) -> None:
    """Exactly {"findings": [{step, code, severity, message}], "first": {code: step},
    "first_action": {step, action} | null, "halt_step": int | null, "notices": [str]}."""
    assert set(result) == {"findings", "first", "first_action", "halt_step", "notices"}
    assert isinstance(result["findings"], list)
    for f in result["findings"]:
        assert set(f) == {"step", "code", "severity", "message"}
        assert isinstance(f["step"], int) and isinstance(f["code"], str)
        assert f["severity"] in SEVERITIES and f["message"]
    assert isinstance(result["first"], dict)
    # first is derived from findings: the earliest step of each code, nothing else
    expected_first: dict[str, int] = {}
    for f in result["findings"]:
        expected_first.setdefault(f["code"], f["step"])
    assert result["first"] == expected_first
    assert result["halt_step"] is None or isinstance(result["halt_step"], int)
    first_action = result["first_action"]
    if first_action is not None:
        assert set(first_action) == {"step", "action"} and isinstance(first_action["step"], int)
        assert first_action["action"] in ACTING
    if result["halt_step"] is not None:  # a halt is an action, never before the first one
        assert first_action is not None and first_action["step"] <= result["halt_step"]
    assert isinstance(result["notices"], list)
    assert all(isinstance(n, str) and n for n in result["notices"])


@pytest.fixture
def collapsed(tmp_path) -> Path:
    return write_jsonl(collapsed_history(), tmp_path / "collapsed.jsonl")


# ---------------------------------------------------------------- acceptance criteria


@pytest.mark.parametrize("vocab", [[], ["--vocab-size", QWEN3_V]], ids=["no-vocab", "vocab"])
def test_a_failed_run_is_flagged_at_step_0_and_acted_on_by_step_5(run_cli, collapsed, vocab):
    rows = list(collapsed_history())
    assert rows[0]["train/loss"] == pytest.approx(0.688, abs=1e-3)  # the run we think we replay
    code, out, err = run_cli("replay", collapsed, "--json", "--beta", "0.5", *vocab)
    assert code == 1, err
    result = as_json(out)
    check_schema(result)
    assert result["first"][Code.LOSS_JSD_CEILING] == 0
    assert min(result["first"].values()) == 0
    assert result["first_action"] == {"step": 0, "action": "rewake"}
    # one critical step (the loss leaves the ceiling at step 1) that nothing can act on in a
    # replay stays open, and the student's entropy then climbing from its step-0 level confirms it
    assert result["halt_step"] == 3
    halting = {f["code"] for f in result["findings"] if f["step"] == 3}
    assert Code.STUDENT_FOLLOWS_DEAD_TEACHER in halting
    step0 = [f for f in result["findings"] if f["step"] == 0]
    assert any(f["severity"] == "critical" for f in step0)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("vocab", [[], ["--vocab-size", QWEN3_V]], ids=["no-vocab", "vocab"])
def test_a_healthy_run_is_left_alone(run_cli, tmp_path, seed, vocab):
    rows = list(healthy_history(400, seed=seed, spike_step=200))
    losses = [r["train/loss"] for r in rows]
    assert max(losses) == 0.3 and sorted(losses)[-2] < 0.05  # one isolated spike
    path = write_jsonl(rows, tmp_path / f"healthy{seed}.jsonl")
    code, out, err = run_cli("replay", path, "--json", *vocab)
    result = as_json(out)
    check_schema(result)
    loud = [f for f in result["findings"] if f["severity"] != "info"]
    assert loud == [], loud[:3]
    assert result["first_action"] is None and result["halt_step"] is None
    assert code == 0, err


def test_info_findings_alone_exit_0(run_cli, tmp_path):
    """A student sharpening on a confident teacher is recorded (info), not reported as a fault."""
    rows = [
        {
            "train/step": t,
            "train/loss": 0.02,
            "train/entropy_loss": (1.0 if t < 80 else 0.2) + 0.05 * ((t * 7) % 5 - 2),
        }
        for t in range(150)
    ]
    path = write_jsonl(rows, tmp_path / "sharpening.jsonl")
    code, out, err = run_cli("replay", path, "--json")
    result = as_json(out)
    assert set(result["first"]) == {Code.STUDENT_ENTROPY_DROP}
    assert {f["severity"] for f in result["findings"]} == {"info"}
    assert result["first_action"] is None and result["halt_step"] is None
    assert code == 0, err


def test_a_uniform_teacher_metric_is_flagged_from_step_1(run_cli, tmp_path):
    rows = list(uniform_teacher_history(50))
    assert rows[0]["rollout/teacher_log_probs"] != pytest.approx(-math.log(QWEN3_V))
    assert rows[1]["rollout/teacher_log_probs"] == pytest.approx(-math.log(QWEN3_V))
    path = write_jsonl(rows, tmp_path / "uniform.jsonl")
    code, out, _ = run_cli("replay", path, "--json", "--vocab-size", QWEN3_V)
    result = as_json(out)
    check_schema(result)
    assert result["first"][Code.TEACHER_UNIFORM] == 1
    assert result["notices"] == []
    assert code == 1
    # without V the exact −ln V test cannot be made, and the replay says so, loudly
    code, out, _ = run_cli("replay", path, "--json")
    result = as_json(out)
    check_schema(result)
    [notice] = result["notices"]
    assert "'rollout/teacher_log_probs'" in notice and "--vocab-size" in notice
    if Code.TEACHER_UNIFORM in result["first"]:  # the check inferred V from the flat column
        assert f"inferred V = {QWEN3_V}" in notice


@pytest.mark.slow  # test_cli_main.py runs `python -m distill_guard.cli replay` as a process too
def test_subprocess_entry_point(collapsed):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "distill_guard.cli", "replay", str(collapsed), "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    result = json.loads(proc.stdout)
    check_schema(result)
    assert result["first"][Code.LOSS_JSD_CEILING] == 0


# ---------------------------------------------------------------- first action, halt, notices


def ceiling_from_step_40(tmp_path: Path) -> Path:
    """80 healthy steps whose loss sits at the JSD ceiling (0.69 at β 0.5) from step 40 on: a
    teacher-attributed critical finding, so the default preset rewakes at 40 and, the loss
    staying there, halts at 42 (3 consecutive critical steps)."""
    rows = list(healthy_history(80, seed=0, spike_step=None))
    for r in rows[40:]:
        r["train/loss"] = 0.69
    return write_jsonl(rows, tmp_path / "ceiling40.jsonl")


def vertical_lines(ax) -> dict[str, list[float]]:
    """linestyle → x of the full-height vertical lines (``axvline``) on a panel."""
    out: dict[str, list[float]] = {}
    for line in ax.get_lines():
        x, y = list(line.get_xdata()), list(line.get_ydata())
        if len(x) == 2 and x[0] == x[1] and y == [0, 1]:
            out.setdefault(line.get_linestyle(), []).append(float(x[0]))
    return out


@pytest.mark.parametrize("preset", ["default", "monitor_only"])
def test_first_action_and_halt_are_told_apart_and_agree_everywhere(run_cli, tmp_path, preset):
    """The issue: JSON said halt_step 40 (the rewake) while the text said halt at 42."""
    path = ceiling_from_step_40(tmp_path)
    args = ["replay", path, "--preset", preset, "--vocab-size", QWEN3_V]
    code, out, err = run_cli(*args, "--json")
    assert code == 1, err
    result = as_json(out)
    check_schema(result)
    assert result["first"] == {Code.LOSS_JSD_CEILING: 40}
    assert result["first_action"] == {"step": 40, "action": "rewake"}
    assert result["halt_step"] == 42

    png = tmp_path / "p.png"
    code, text, err = run_cli(*args, "--plot", png)
    assert code == 1, err
    assert "First action: rewake at step 40 (reason: " in text
    assert "Halt: step 42 (reason: " in text and "3 consecutive steps" in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    fig = replay_figure(replay(load_history(path), preset, [f"run.vocab_size={QWEN3_V}"]))
    legend = [t.get_text() for lg in fig.legends for t in lg.get_texts()]
    assert "first action: rewake at step 40" in legend and "halt at step 42" in legend
    for ax in fig.axes:  # every panel, in two styles: dashed first action, dotted halt
        lines = vertical_lines(ax)
        assert lines["--"] == [40.0] and lines[":"] == [42.0]


@pytest.mark.parametrize("pinned", [False, True], ids=["healthy", "pinned-at-minus-ln-V"])
def test_a_teacher_column_without_vocab_size_gets_a_loud_notice(run_cli, tmp_path, pinned):
    """The issue: a teacher logprob column pinned at −ln 151936 for 80 steps, no --vocab-size,
    and not a word that the uniform-teacher test could not run as asked."""
    rows = list(healthy_history(80, seed=0, spike_step=None))
    if pinned:
        for r in rows:
            r["rollout/teacher_log_probs"] = -math.log(QWEN3_V)
    path = write_jsonl(rows, tmp_path / "teacher.jsonl")
    _, text, _ = run_cli("replay", path)
    notice = next(ln for ln in text.splitlines() if ln.startswith("NOTICE: "))
    assert (
        "the teacher logprob column 'rollout/teacher_log_probs' is present but the vocabulary "
        "size is unknown" in notice
    )
    assert "pass --vocab-size V to make it exact" in notice
    _, out, _ = run_cli("replay", path, "--json")
    result = as_json(out)
    check_schema(result)
    assert result["notices"] == [notice.removeprefix("NOTICE: ")]
    if pinned and Code.TEACHER_UNIFORM in result["first"]:  # the check inferred V
        assert f"inferred V = {QWEN3_V}" in notice
    # with V the test is exact: no notice
    code, text, _ = run_cli("replay", path, "--vocab-size", QWEN3_V)
    assert "NOTICE" not in text
    _, out, _ = run_cli("replay", path, "--json", "--vocab-size", QWEN3_V)
    assert as_json(out)["notices"] == []
    if pinned:
        assert code == 1 and as_json(out)["first"][Code.TEACHER_UNIFORM] == 0
    else:
        assert code == 0


# ---------------------------------------------------------------- formats and options


def test_json_equals_the_library_result(run_cli, collapsed):
    _, out, _ = run_cli("replay", collapsed, "--json", "--vocab-size", QWEN3_V)
    lib = replay(load_history(collapsed), "default", [f"run.vocab_size={QWEN3_V}"])
    assert as_json(out) == json.loads(json.dumps(lib.to_json()))


def test_table_output_names_findings_and_decision(run_cli, collapsed):
    code, out, _ = run_cli("replay", collapsed)
    assert code == 1
    assert f"{collapsed}" in out and "189 steps" in out
    line = next(ln for ln in out.splitlines() if ln.startswith(Code.LOSS_JSD_CEILING))
    assert line.split()[1:3] == ["critical", "0"]
    assert "First action: rewake at step 0 (reason: rewake: " in out
    assert "\nHalt: step 3 (reason: halt: an open teacher-attributed critical, confirmed" in out
    assert "NOTICE" not in out  # no teacher logprob column: nothing skipped to own up to


def test_wandb_csv_export_replays_like_the_jsonl(run_cli, tmp_path):
    rows = list(collapsed_history())
    for r in rows:
        r["_step"] = r.pop("train/step")
    columns = [
        "_step",
        "train/loss",
        "train/entropy_loss",
        "rollout/truncated_ratio",
        "eval/sciknoweval-biology",
    ]
    csv_path = write_csv(rows, tmp_path / "export.csv", columns)
    assert ",," in csv_path.read_text() or csv_path.read_text().count(",\n") > 0  # empty cells
    jsonl_path = write_jsonl(rows, tmp_path / "same.jsonl")
    code_csv, out_csv, err = run_cli("replay", csv_path, "--json")
    code_jsonl, out_jsonl, _ = run_cli("replay", jsonl_path, "--json")
    assert code_csv == code_jsonl == 1, err
    a, b = as_json(out_csv), as_json(out_jsonl)
    assert [(f["step"], f["code"]) for f in a["findings"]] == [
        (f["step"], f["code"]) for f in b["findings"]
    ]
    assert a["first"] == b["first"] and a["halt_step"] == b["halt_step"]
    assert a["first_action"] == b["first_action"]


def test_key_remaps_a_role(run_cli, tmp_path):
    rows = [{"it": r["train/step"], "distill/jsd": r["train/loss"]} for r in collapsed_history(30)]
    path = write_jsonl(rows, tmp_path / "renamed.jsonl")
    code, _, err = run_cli("replay", path, "--json")
    assert code == 2 and "train/loss" in err and "--key loss=NAME" in err
    code, out, err = run_cli("replay", path, "--json", "--key", "loss=distill/jsd")
    assert code == 1, err
    assert as_json(out)["first"][Code.LOSS_JSD_CEILING] == 0


@pytest.mark.parametrize("convention", sorted(set(CONVENTIONS) - {"relax"}))
def test_the_seed_failure_replays_alike_under_every_convention(run_cli, tmp_path, convention):
    """Issue 23: a TRL (or demo, Lightning, slime) history replayed with "not in the file:
    student_entropy, ..." and nothing judged. Under any convention the same values reach the
    same roles, so the replay is the same as under Relax's names."""
    relax = write_jsonl(seed_history(), tmp_path / "relax.jsonl")
    other = write_jsonl(renamed(seed_history(), convention), tmp_path / f"{convention}.jsonl")
    code_relax, out_relax, _ = run_cli("replay", relax, "--json")
    code, out, err = run_cli("replay", other, "--json")
    assert (code, as_json(out)) == (code_relax, as_json(out_relax)), err
    _, text, _ = run_cli("replay", other)
    assert "not in the file (their checks were skipped): teacher_logprob (tried " in text
    for role in ("loss", "student_entropy", "truncated_ratio", "eval_accuracy"):
        assert f"{role}=" in text.splitlines()[1]  # "metrics: role=key, ..."


def test_a_column_that_looks_like_a_missing_role_is_a_notice_until_mapped(run_cli, tmp_path):
    rows = [
        {"_step": t, "train/loss": 0.02, "train/pg_loss": 0.01, "actor/entropy_mean": 0.4}
        for t in range(5)
    ]
    path = write_jsonl(rows, tmp_path / "custom.jsonl")
    notice = (
        "column 'actor/entropy_mean' looks like student_entropy but was not read; "
        "map it with --key student_entropy=actor/entropy_mean"
    )
    code, text, _ = run_cli("replay", path)
    assert f"NOTICE: {notice}" in text and code == 0
    assert "pg_loss" not in text  # the loss was read: its look-alikes are not news
    _, out, _ = run_cli("replay", path, "--json")
    result = as_json(out)
    check_schema(result)
    assert result["notices"] == [notice]
    # --key is the exception: the role is read under that name, and the notice goes
    _, text, _ = run_cli("replay", path, "--key", "student_entropy=actor/entropy_mean")
    assert "NOTICE" not in text and "student_entropy=actor/entropy_mean" in text
    _, out, _ = run_cli("replay", path, "--json", "--key", "student_entropy=actor/entropy_mean")
    assert as_json(out)["notices"] == []


def test_key_wins_over_a_known_name_for_its_role(run_cli, tmp_path):
    rows = [
        {"_step": t, "train/loss": 0.02, "train/entropy_loss": 0.4, "train/entropy": 9.0}
        for t in range(3)
    ]
    path = write_jsonl(rows, tmp_path / "both.jsonl")
    _, text, _ = run_cli("replay", path)
    assert "student_entropy=train/entropy_loss" in text  # the order: Relax's name first
    _, text, _ = run_cli("replay", path, "--key", "student_entropy=train/entropy")
    assert "student_entropy=train/entropy" in text.splitlines()[1].split(", ")
    h = load_history(path, {"student_entropy": "train/entropy"})
    assert h.steps[0][1]["student_entropy"] == 9.0


def test_loss_scale_and_beta_reach_the_checks(run_cli, tmp_path):
    rows = [{"train/step": t, "train/loss": 0.688 * 4} for t in range(3)]
    path = write_jsonl(rows, tmp_path / "scaled.jsonl")
    _, out, _ = run_cli("replay", path, "--json")
    assert set(as_json(out)["first"]) == {Code.LOSS_ABOVE_CEILING}
    _, out, _ = run_cli("replay", path, "--json", "--loss-scale", "4")
    assert set(as_json(out)["first"]) == {Code.LOSS_JSD_CEILING}
    _, out, _ = run_cli("replay", path, "--json", "--loss", "reverse_kl")
    assert as_json(out)["first"] == {}


def test_monitor_only_preset_reports_what_it_would_have_done(run_cli, collapsed):
    code, out, _ = run_cli("replay", collapsed, "--json", "--preset", "monitor_only")
    result = as_json(out)
    assert code == 1 and result["first_action"] == {"step": 0, "action": "rewake"}  # intended
    assert result["halt_step"] == 3  # intended too: the default preset's halt (test above)


def test_set_overrides_the_guard_config(run_cli, tmp_path):
    rows = [{"train/step": t, "train/loss": 0.6} for t in range(3)]  # 87 % of ln 2
    path = write_jsonl(rows, tmp_path / "h.jsonl")
    code, out, _ = run_cli("replay", path, "--json")
    assert code == 0 and as_json(out)["findings"] == []
    code, out, _ = run_cli(
        "replay", path, "--json", "--set", "checks.jsd_ceiling.fraction_of_ceiling=0.8"
    )
    assert code == 1 and as_json(out)["first"] == {Code.LOSS_JSD_CEILING: 0}


def test_plot_writes_a_png(run_cli, collapsed, tmp_path):
    png = tmp_path / "timeline.png"
    code, out, _ = run_cli("replay", collapsed, "--plot", png)
    assert code == 1
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"plot written to {png}" in out


def test_nan_loss_is_a_finding_not_a_crash(run_cli, tmp_path):
    rows = list(healthy_history(40, seed=0, spike_step=None))
    rows[12]["train/loss"] = float("nan")
    path = write_jsonl(rows, tmp_path / "nan.jsonl")
    assert "NaN" in path.read_text()
    code, out, err = run_cli("replay", path, "--json")
    assert code == 1, err
    result = as_json(out)
    assert result["first"] == {Code.METRIC_NONFINITE: 12}
    assert result["findings"][0]["severity"] == "critical"


# ---------------------------------------------------------------- bad input: exit 2, one line


def _bad_inputs(tmp: Path) -> list[tuple[list, str]]:
    def file(name: str, text: str) -> Path:
        p = tmp / name
        p.write_text(text)
        return p

    good = write_jsonl(collapsed_history(10), tmp / "good.jsonl")
    return [
        (
            [file("malformed.jsonl", '{"train/loss": 0.1}\n{"train/loss": \n')],
            "malformed.jsonl:2: not valid JSON",
        ),
        (
            [file("noloss.jsonl", '{"x": 1}\n')],
            "noloss.jsonl: metric 'train/loss' or 'loss' (role loss) is in none",
        ),
        (
            [file("text.jsonl", '{"train/loss": "high"}\n')],
            "text.jsonl:1: value of 'train/loss' is 'high'",
        ),
        ([good, "--preset", "paranoid"], "unknown preset 'paranoid'"),
        ([file("empty.jsonl", "")], "empty.jsonl: file is empty"),
        ([file("header.csv", "_step,train/loss\n")], "header.csv: file has a header but no rows"),
        ([tmp / "missing.jsonl"], "missing.jsonl: file not found"),
        ([good, "--key", "loss"], "expected ROLE=NAME, got 'loss'"),
        ([good, "--key", "=train/loss"], "expected ROLE=NAME"),
        ([good, "--key", "lost=train/loss"], "unknown role 'lost'"),
        ([good, "--beta", "1.5"], "beta"),
        ([good, "--vocab-size", "1"], "vocab_size"),
        ([good, "--set", "checks.nope.x=1"], "bad guard setting"),
    ]


@pytest.mark.parametrize("case", range(13))
def test_bad_input_exits_2_with_a_message_naming_the_problem(run_cli, tmp_path, case):
    cases = _bad_inputs(tmp_path)
    assert len(cases) == 13
    args, expected = cases[case]
    code, out, err = run_cli("replay", *args)
    assert code == 2
    assert expected in err
    assert out == ""
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "override, expected",
    [
        (
            "checks.entropy_drift.hh=3",
            "checks.entropy_drift has no key 'hh' (valid: critical_fraction_of_log_vocab, enabled,",
        ),
        ("guard.checks.entropy_drift.hh=3", "drop the 'guard.' prefix"),
        ("checks.entropy_drif.window=3", "did you mean checks.entropy_drift?"),
        ("checks.entropy_drift.window=abc", "'abc' of type 'str' could not be converted"),
    ],
)
def test_a_bad_set_names_the_valid_keys_or_the_reason(run_cli, tmp_path, override, expected):
    """Issue 28: "Could not override ..." alone dropped the part that says what to type."""
    good = write_jsonl(healthy_history(10), tmp_path / "good.jsonl")
    code, out, err = run_cli("replay", good, "--set", override)
    assert code == 2 and out == ""
    assert expected in err


def test_a_wrong_vocab_size_is_a_finding_naming_the_level_and_the_bound(run_cli, tmp_path):
    """Issue 28: --vocab-size 1000 for a teacher of 151936 tokens gave no finding, no notice."""
    path = write_jsonl(uniform_teacher_history(20), tmp_path / "u.jsonl")
    code, out, err = run_cli("replay", path, "--vocab-size", "1000", "--json")
    assert code == 1, err
    result = as_json(out)
    check_schema(result)
    assert (
        result["first"][Code.CONFIG_VOCAB_SIZE] == 1 and result["first"][Code.TEACHER_UNIFORM] == 3
    )
    (vocab,) = [f for f in result["findings"] if f["code"] == Code.CONFIG_VOCAB_SIZE]
    assert "-11.93121 is below −ln V = -6.90776" in vocab["message"]
    healthy = write_jsonl(healthy_history(60), tmp_path / "h.jsonl")
    assert run_cli("replay", healthy, "--vocab-size", "1000")[0] == 0  # nothing contradicts it


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("json_output", [False, True])
def test_a_long_replay_shows_its_progress_on_a_terminal_only(
    run_cli, tmp_path, monkeypatch, json_output
):
    """Issue 28: long replays showed no progress. Here every replay is "long" (no delay)."""
    from distill_guard.cli import progress

    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(progress.Progress, "__init__", _no_delay(progress.Progress.__init__))
    path = write_jsonl(healthy_history(50), tmp_path / "h.jsonl")
    code, out, _ = run_cli("replay", path, *(["--json"] if json_output else []))
    assert code == 0
    if json_output:
        assert terminal.getvalue() == "" and as_json(out)["findings"] == []
    else:
        assert terminal.getvalue().endswith("\rreplay: steps: 50 of 50\n")
        assert "replay: steps" not in out


def _no_delay(init):
    def wrapped(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.delay_s = 0.0

    return wrapped
