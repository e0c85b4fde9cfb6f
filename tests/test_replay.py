"""ReplayResult: the first action and the halt told apart, the run facts kept, the notices."""

from __future__ import annotations

import pytest

from distill_guard.findings import Code, Finding, Severity
from distill_guard.history import History, load_history
from distill_guard.observations import LossKind, Metric, RunSpec
from distill_guard.policy import Action, Decision
from distill_guard.replay import FirstAction, ReplayResult, acting, format_table, replay
from distill_guard.testing.histories import healthy_history
from tests.conftest import QWEN3_V, write_jsonl


def history(teacher: bool = True) -> History:
    keys = {Metric.LOSS: "train/loss"}
    if teacher:
        keys[Metric.TEACHER_LOGPROB] = "rollout/teacher_log_probs"
    return History("run.jsonl", [(0, {Metric.LOSS: 0.02})], keys, [])


def result_with(*decisions: Decision) -> ReplayResult:
    return ReplayResult(history(), "default", decisions=list(decisions))


@pytest.mark.parametrize(
    "decision, expected",
    [
        (Decision(1, Action.ALERT), None),
        (Decision(1, Action.SKIP_BATCH), Action.SKIP_BATCH),
        (Decision(1, Action.REWAKE), Action.REWAKE),
        (Decision(1, Action.ALERT, intended=Action.HALT), Action.HALT),  # monitor-only
        (Decision(1, Action.ALERT, intended=Action.REWAKE), Action.REWAKE),
    ],
)
def test_acting_is_the_course_change_done_or_intended(decision, expected):
    assert acting(decision) is expected


def test_first_action_is_the_first_course_change_and_halt_only_a_halt():
    result = result_with(
        Decision(3, Action.ALERT),
        Decision(5, Action.SKIP_BATCH),
        Decision(7, Action.REWAKE),
        Decision(9, Action.HALT, message="halt: critical findings on 3 consecutive steps"),
        Decision(10, Action.HALT),
    )
    assert result.first_action == FirstAction(5, "skip_batch") == (5, "skip_batch")
    assert result.halt_step == 9
    assert result.to_json()["first_action"] == {"step": 5, "action": "skip_batch"}
    assert result.to_json()["halt_step"] == 9


def test_an_alert_only_run_has_neither():
    result = result_with(Decision(3, Action.ALERT), Decision(4, Action.ALERT))
    assert result.first_action is None and result.halt_step is None
    assert result.to_json()["first_action"] is None and result.to_json()["halt_step"] is None


def test_a_monitor_only_halt_counts_as_the_halt():
    result = result_with(
        Decision(2, Action.ALERT, intended=Action.REWAKE),
        Decision(4, Action.ALERT, intended=Action.HALT),
    )
    assert result.first_action == (2, "rewake") and result.halt_step == 4


def test_replay_keeps_the_run_facts_it_judged_with(tmp_path):
    path = write_jsonl(healthy_history(10, spike_step=None), tmp_path / "h.jsonl")
    result = replay(
        load_history(path),
        "default",
        [f"run.vocab_size={QWEN3_V}", "run.beta=0.3", "run.loss_scale=2.0"],
    )
    assert result.run.vocab_size == QWEN3_V and result.run.loss is LossKind.JSD
    assert result.run.beta == 0.3 and result.run.loss_scale == 2.0
    assert replay(load_history(path)).run.vocab_size is None


def test_notice_only_for_a_teacher_column_without_vocab_size():
    assert ReplayResult(history(teacher=False), "default").notices == []
    result = ReplayResult(history(), "default")
    [notice] = result.notices
    assert notice.startswith(
        "the teacher logprob column 'rollout/teacher_log_probs' is present but the vocabulary "
        "size is unknown: the uniform-teacher test (−ln V) ran only by inference from a flat "
        "column"
    )
    assert notice.endswith("; pass --vocab-size V to make it exact.")
    assert result.to_json()["notices"] == [notice]
    assert f"NOTICE: {notice}" in format_table(result)
    result.run = RunSpec(vocab_size=QWEN3_V)
    assert result.notices == [] and "NOTICE" not in format_table(result)


def test_notice_names_the_inferred_vocab_size():
    result = ReplayResult(history(), "default")
    result.findings.append(
        Finding(
            Code.TEACHER_UNIFORM,
            Severity.CRITICAL,
            "flat at −ln V",
            1,
            {"inferred_vocab_size": QWEN3_V},
        )
    )
    assert result.inferred_vocab_size == QWEN3_V
    assert f"(it inferred V = {QWEN3_V})" in result.notices[0]


def test_the_seed_runs_healthy_history_with_one_entropy_blip_replays_clean(tmp_path):
    """Issue 14's report: a healthy 400-step history with one step of entropy at 0.9 (from
    ~0.41) raised 15 entropy_drift warnings, exited 1, and noted entropy_drop 206 times."""
    rows = list(healthy_history(400, seed=0))
    rows[231]["train/entropy_loss"] = 0.9
    path = write_jsonl(rows, tmp_path / "run.jsonl")
    result = replay(load_history(path), "default", [f"run.vocab_size={QWEN3_V}"])
    assert [f for f in result.findings if f.severity >= Severity.WARN] == []
    assert result.exit_code() == 0
    assert sum(f.code == Code.STUDENT_ENTROPY_DROP for f in result.findings) <= 1


def test_a_lookalike_column_is_a_notice_in_the_table_and_the_json():
    h = History(
        "run.jsonl",
        [(0, {Metric.LOSS: 0.02})],
        {Metric.LOSS: "train/loss"},
        [Metric.STUDENT_ENTROPY],
        tried={Metric.STUDENT_ENTROPY: ("train/entropy_loss", "train/entropy", "entropy")},
        lookalikes={"actor/entropy_mean": Metric.STUDENT_ENTROPY},
    )
    result = ReplayResult(h, "default", run=RunSpec(vocab_size=QWEN3_V))
    notice = (
        "column 'actor/entropy_mean' looks like student_entropy but was not read; "
        "map it with --key student_entropy=actor/entropy_mean"
    )
    assert result.notices == [notice] and result.to_json()["notices"] == [notice]
    table = format_table(result)
    assert f"NOTICE: {notice}" in table
    assert (
        "not in the file (their checks were skipped): student_entropy (tried "
        "train/entropy_loss, train/entropy, entropy)" in table
    )


def test_the_not_in_the_file_line_names_the_names_tried(tmp_path):
    path = write_jsonl(
        [{"train/step": t, "train/loss": 0.02} for t in range(3)], tmp_path / "h.jsonl"
    )
    table = format_table(replay(load_history(path)))
    line = next(ln for ln in table.splitlines() if ln.startswith("not in the file"))
    assert "truncated_ratio (tried rollout/truncated_ratio, train/truncated_ratio, " in line
    assert "completions/truncated_fraction)" in line
    assert "eval_accuracy (tried eval/accuracy, eval_accuracy, val/acc, " in line
    assert "NOTICE" not in table  # nothing looks like a missing role


@pytest.mark.parametrize("shape", ["saturating", "linear"])
@pytest.mark.parametrize("convention", ["relax", "trl", "demo"])
def test_the_seed_run_replayed_from_its_metrics_alone_halts_by_step_5(tmp_path, convention, shape):
    """Issue 23's acceptance: the seed's own trajectory (the JSD at its ceiling at step 0 only,
    then the loss "converging" while the entropy climbs and accuracy falls; no teacher column),
    under Relax's, TRL's and the demo's names, the default preset, no --vocab-size. The step-0
    critical is left open (nothing can act on it in a replay), and the student's own signals,
    judged against the student before its first update, confirm it."""
    from distill_guard.testing.histories import renamed, seed_history, write_jsonl

    path = write_jsonl(renamed(seed_history(shape=shape), convention), tmp_path / "seed.jsonl")
    result = replay(load_history(path))
    assert result.halt_step is not None and result.halt_step <= 5, format_table(result)
    halt = result.halt_decision
    assert {f.code for f in halt.reasons} >= {"student.follows_dead_teacher"}, halt
    assert result.first["loss.jsd_ceiling"] == 0


def test_monitor_only_shows_the_halt_an_acting_guard_would_make_on_the_seed(tmp_path):
    """Monitor-only acts on nothing, so the step-0 critical is open there too, and its replay
    shows the halt the default preset would make, as an intended one."""
    from distill_guard.testing.histories import seed_history, write_jsonl

    result = replay(load_history(write_jsonl(seed_history(), tmp_path / "s.jsonl")), "monitor_only")
    halt = result.halt_decision
    assert halt is not None and halt.step <= 5 and halt.action is Action.ALERT, halt
    assert halt.intended is Action.HALT
    assert all(d.action in (Action.ALERT, Action.CONTINUE) for d in result.decisions)


def test_a_quiet_run_says_no_action_without_claiming_the_guard_alerted(tmp_path):
    """Issue 28: a run with no findings has nothing the guard "would only have alerted" on."""
    path = write_jsonl(healthy_history(60, spike_step=None), tmp_path / "q.jsonl")
    table = format_table(replay(load_history(path)))
    assert "First action: none." in table
    assert "alerted" not in table


def test_an_alert_only_run_says_the_guard_would_only_have_alerted():
    f = Finding(Code.STUDENT_TRUNCATION, Severity.WARN, "truncated", 3)
    result = ReplayResult(history(), "default", findings=[f], decisions=[Decision(3, Action.ALERT)])
    assert "First action: none: the guard would only have alerted." in format_table(result)
