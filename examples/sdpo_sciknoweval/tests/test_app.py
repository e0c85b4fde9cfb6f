"""The demo app, composed by Hydra from conf/ exactly as `make demo` composes it: run once as
`make demo` runs it (what it prints is the README's table), then shortened for the variants."""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from distill_guard import DistillGuard
from distill_guard.events import read_events
from distill_guard.extras import MissingExtra
from distill_guard.summary import GUARD_METRICS, VERDICT_SKIP
from examples.sdpo_sciknoweval import app
from examples.sdpo_sciknoweval.pretrain import pretrain

ROOT = Path(__file__).resolve().parents[3]
CONF = ROOT / "conf"
README_OUTPUT = "<!-- output: make demo -->"
"""The line before the README's block of what ``make demo`` prints."""


def compose_demo(overrides: list[str]):
    """The demo's config with ``overrides`` (``make demo``'s with none: one torch thread)."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="sdpo_sciknoweval", overrides=overrides)


def readme_demo_output() -> str:
    """The block the README shows as what ``make demo`` prints."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert text.count(README_OUTPUT) == 1, f"README.md: one {README_OUTPUT} before the block"
    block = re.match(r"\s*```\n(.*?)^```", text.split(README_OUTPUT, 1)[1], re.S | re.M)
    assert block is not None, f"README.md: no fenced block after {README_OUTPUT}"
    return block.group(1).rstrip("\n")


def pretrain_ahead(folder: str | Path) -> None:
    """Train the demo config's teacher and student into ``folder``, as ``app.run`` would (the
    ``demo_pretrain`` fixture runs this in a background process, see conftest.py)."""
    cfg = compose_demo([])
    pretrain(folder, app.pretrain_config(cfg), threads=cfg.threads)


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory, demo_pretrain) -> tuple[dict, Path, str]:
    """``make demo``, once per module: its config as composed with no override (only the output
    folder differs), its warm-up found in the cache (``app.run`` trains the same models when the
    cache is missing: the hash says so). Its result, folder and what it printed."""
    pytest.importorskip("wandb")  # the demo logs to wandb offline
    out = tmp_path_factory.mktemp("demo")
    (out / "pretrain").symlink_to(demo_pretrain, target_is_directory=True)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        result = app.run(compose_demo([f"out_dir={out}"]))
    return result, out, printed.getvalue()


def test_without_wandb_the_demo_stops_before_training_and_names_the_install_line(
    tmp_path, monkeypatch
):
    monkeypatch.setitem(sys.modules, "wandb", None)  # an import of wandb fails, as uninstalled
    with pytest.raises(MissingExtra) as info:
        app.run(compose_demo([f"out_dir={tmp_path}"]))
    assert "pip install 'distill_guard[wandb]'" in str(info.value)
    assert "wandb.mode=disabled" in str(info.value)
    assert list(tmp_path.iterdir()) == []  # nothing trained, nothing written


@pytest.fixture(scope="module")
def demo(demo_run) -> tuple[dict, Path]:
    return demo_run[0], demo_run[1]


@pytest.fixture(scope="module")
def steps() -> int:
    """The demo's steps per arm."""
    return int(compose_demo([]).arm.steps)


DECIMAL = re.compile(r"(\d+\.\d+)")
LAST_DIGITS = 3
"""How far a printed decimal may move in its last digit: the demo is seeded and runs on one
thread, but another CPU's float kernels round differently (seen: the healthy arm's 0.093, 0.0644,
0.45 printed as 0.094, 0.0642, 0.46 on a 2-core AMD EPYC)."""


def assert_same_table(want: str, got: str) -> None:
    """``got`` is ``want`` to the character, except that a decimal may differ by up to
    ``LAST_DIGITS`` units of its last printed digit (same number of digits)."""
    want_lines, got_lines = want.splitlines(), got.splitlines()
    assert len(want_lines) == len(got_lines), (want, got)
    for w, g in zip(want_lines, got_lines):
        w_parts, g_parts = DECIMAL.split(w), DECIMAL.split(g)
        assert len(w_parts) == len(g_parts), (w, g)
        for i, (a, b) in enumerate(zip(w_parts, g_parts)):
            if i % 2 == 0:  # the text between the decimals, spacing included
                assert a == b, (w, g)
                continue
            places = len(a.split(".")[1])
            assert places == len(b.split(".")[1]), (w, g)
            assert abs(float(a) - float(b)) <= LAST_DIGITS * 10**-places + 1e-12, (a, b, w, g)


def test_the_readme_shows_what_make_demo_prints(demo_run):
    """The README's table is this run's, to the character but for a last digit of a decimal
    (``assert_same_table``): a change to what the demo prints must come with the README's new
    table."""
    printed = demo_run[2]
    table, sep, _ = printed.rstrip("\n").rpartition("\n\nwritten: ")
    assert sep, printed
    assert_same_table(readme_demo_output(), table)


def test_the_table_comparison_allows_a_last_digit_and_nothing_else():
    row = "healthy    yes    monitor_only       0.093     0.25 → 0.34    0.0644       0%"
    assert_same_table(row, row.replace("0.093", "0.094").replace("0.0644", "0.0642"))
    for changed in (
        row.replace("0.093", "0.097"),  # 4 units of the last digit
        row.replace("0.093", "0.0930"),  # another precision
        row.replace("0%", "1%"),  # an integer
        row.replace("yes", "no "),  # text
        row.replace("0.25 → 0.34", "0.25 → 0.34 "),  # spacing
    ):
        with pytest.raises(AssertionError):
            assert_same_table(row, changed)


def test_the_last_line_names_every_file_written(demo_run):
    result, out, printed = demo_run
    last = printed.rstrip("\n").splitlines()[-1]
    named = re.fullmatch(r"written: (.*) \((\d+) s\)", last)
    assert named is not None, last
    paths = [Path(p) for p in named.group(1).split(", ")]
    events = [out / f"events_{arm}.jsonl" for arm in ("healthy", "unguarded", "guarded")]
    assert paths == [out / "summary.json", out / "timeline.png", *events, out / "wandb"]
    assert all(p.exists() for p in paths), [p for p in paths if not p.exists()]
    assert int(named.group(2)) == round(result["seconds"])


def test_summary_has_the_issue_schema(demo):
    result, out = demo
    assert json.loads((out / "summary.json").read_text()) == json.loads(json.dumps(result))
    keys = {
        "step0_loss",
        "final_loss",
        "entropy_start",
        "entropy_end",
        "eval_accuracy",
        "teacher_uniform_fraction",
        "first_finding",
        "repairs",
        "halted",
        "poisoned_updates",
    }
    assert set(result["arms"]) == {"healthy", "unguarded", "guarded"}
    for arm in result["arms"].values():
        assert keys <= set(arm)
        assert all(len(p) == 2 for p in arm["eval_accuracy"])
    assert (out / "timeline.png").stat().st_size > 10_000


def test_unguarded_trains_on_a_uniform_teacher_at_the_jsd_ceiling(demo, steps):
    u = demo[0]["arms"]["unguarded"]
    assert u["step0_loss"] >= 0.9 * math.log(2)
    assert u["teacher_uniform_fraction"] == 1.0
    assert u["poisoned_updates"] == steps and u["repairs"] == 0 and not u["halted"]
    assert u["first_finding"] == {"step": 0, "code": "teacher.uniform"}  # it watched, never acted
    assert u["entropy_end"] > u["entropy_start"]


def test_guarded_repairs_at_every_wake_and_never_trains_on_the_dead_teacher(demo, steps):
    result, out = demo
    g, h = result["arms"]["guarded"], result["arms"]["healthy"]
    assert g["poisoned_updates"] == 0 and g["teacher_uniform_fraction"] == 0.0
    assert g["repairs"] == steps and not g["halted"]
    assert g["first_finding"] == {"step": 0, "code": "teacher.uniform"}
    # repaired before scoring, the guarded arm trains on what the healthy teacher says
    assert g["step0_loss"] == pytest.approx(h["step0_loss"], rel=1e-4)
    events = read_events(out / "events_guarded.jsonl")
    assert [e["kind"] for e in events].count("repair.ok") == steps
    alerts = [e for e in events if e["kind"] == "alert"]
    assert len(alerts) == 1 and "teacher.uniform" in alerts[0]["title"]  # one incident, one alert


def test_the_run_tells_the_readmes_story(demo):
    """OPD teaches the healthy student; the unguarded one collapses to the uniform teacher (its
    entropy to ln V, its accuracy to 0); the guarded run, repaired at every wake, is the healthy
    run to the last digit."""
    arms = demo[0]["arms"]
    h, u, g = arms["healthy"], arms["unguarded"], arms["guarded"]
    assert h["eval_accuracy"][-1][1] >= h["eval_accuracy"][0][1] + 0.05
    assert u["eval_accuracy"][-1][1] == 0.0 and u["entropy_end"] > 0.95 * math.log(4096)
    for key in ("step0_loss", "final_loss", "entropy_start", "entropy_end", "eval_accuracy"):
        assert g[key] == h[key], key


def test_healthy_arm_is_left_alone(demo):
    result, out = demo
    h = result["arms"]["healthy"]
    assert h["first_finding"] is None and h["repairs"] == 0 and h["poisoned_updates"] == 0
    # its event file says only that the guard attached and closed: no finding, alert or repair
    kinds = [e["kind"] for e in read_events(out / "events_healthy.jsonl")]
    assert kinds == ["attached", "closed"]


def test_wandb_rows_are_namespaced_and_carry_the_guards_metrics():
    guard = DistillGuard()
    record = {"step": 3, "loss": 0.1, "student_entropy": 0.2, "eval_accuracy": 0.5}
    row = app.wandb_row({**record, "trained": False, "guard_action": "skip_batch"}, guard)
    assert set(row) == {"train/loss", "train/entropy", "eval/accuracy", "train/update_applied"} | (
        set(GUARD_METRICS)
    )
    assert row["train/entropy"] == 0.2 and row["guard/verdict"] == VERDICT_SKIP
    assert app.wandb_row({"step": 4, "eval_accuracy": 0.5}, guard)["guard/verdict"] == 0


def test_an_unknown_arm_is_refused():
    with pytest.raises(ValueError, match="unknown arm"):
        app.main.__wrapped__(compose_demo(["arms=[healthy,sideways]"]))


def test_an_unknown_fault_is_refused():
    with pytest.raises(ValueError, match="unknown fault"):
        app.main.__wrapped__(compose_demo(["fault=sideways"]))
