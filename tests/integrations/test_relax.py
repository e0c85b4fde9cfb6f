"""Relax: the gates, each alone, and the whole run in Relax's own step order (relax_harness).

The harness runs what the trainer really consumes: a queued copy of each step's data, read by two
gloo trainer ranks, with the teacher slept and woken by Relax's own handle over loopback HTTP.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import math
import os
import time
from argparse import Namespace
from dataclasses import dataclass

import pytest
import torch

from distill_guard.events import EventLog
from distill_guard.integrations import relax
from distill_guard.integrations.relax import samples as fields
from distill_guard.integrations.relax.file_board import HOST, FileBoard, board_for
from distill_guard.integrations.relax.trainer import TrainerGate, skip_next_update
from distill_guard.integrations.relax.verdicts import Announcement, StepVerdict, Verdict
from distill_guard.observations import LossKind
from distill_guard.testing.tiny import build_tiny_qwen3

from . import relax_harness as harness

UNIFORM = -math.log(harness.VOCAB)


@pytest.fixture(autouse=True)
def _fresh():
    relax.reset()
    yield
    relax.reset()


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    return build_tiny_qwen3(
        tmp_path_factory.mktemp("relax_teacher"),
        vocab_size=harness.VOCAB,
        embed_std=0.3,
        max_positions=128,  # above the 64-token canary: SGLang refuses an input at its context length
    )


@pytest.fixture()
def relax_run(tmp_path, teacher_dir, forkserver):
    """``harness.run`` under ``tmp_path`` on the module's teacher, its trainer ranks forked from
    the session's fork server (new processes, without re-importing torch in each)."""
    return functools.partial(harness.run, tmp_path, teacher_dir, context=forkserver)


@dataclass
class Sample:
    tokens: list[int]
    response_length: int
    teacher_log_probs: list[float] | None = None
    loss_mask: list[int] | None = None
    remove_sample: bool = False
    opd_sample_mask: bool | None = None
    teacher_tokens: list[int] | None = None


def args_for(**extra):
    base = {
        "opd_kl_type": "jsd",
        "opd_jsd_alpha": 0.5,
        "opd_token_selection": "student_sampled",
        "opd_log_prob_top_k": 0,
        "dynamic_sampling_filter_path": f"{harness.HOOKS}.dynamic_sampling_filter",
        "custom_rollout_log_function_path": f"{harness.HOOKS}.rollout_log_function",
        "custom_megatron_before_train_step_hook_path": f"{harness.HOOKS}.before_train_step_hook",
    }
    return Namespace(**(base | extra))


def announcement(run="", attempt="a1", **kw):
    fields_ = dict(
        run=run,
        attempt=attempt,
        gates=["filter", "log", "train_step"],
        on_dead_teacher="halt",
        teacher=True,
        time=time.time(),
        host=HOST,
        pid=os.getpid(),
    )
    return Announcement(**(fields_ | kw))


def configure(tmp_path, args=None, **kw):
    overrides = [
        f"run.vocab_size={harness.VOCAB}",
        f"events_path={tmp_path / 'events.jsonl'}",
        "alerts.use_wandb=false",
    ]
    return relax.use(relax.configure("default", overrides=overrides, args=args or args_for(), **kw))


# ---------------------------------------------------------------------------------- contracts


def test_hooks_have_relax_exact_signatures_and_load_by_path():
    def names(fn):
        return list(inspect.signature(fn).parameters)

    assert names(relax.dynamic_sampling_filter) == ["args", "group"]
    assert names(relax.rollout_log_function) == [
        "rollout_id",
        "args",
        "samples",
        "rollout_extra_metrics",
        "rollout_time",
    ]
    assert names(relax.eval_rollout_log_function) == ["rollout_id", "args", "data", "extra_metrics"]
    assert names(relax.before_train_step_hook) == [
        "args",
        "rollout_id",
        "step_id",
        "model",
        "optimizer",
        "opt_param_scheduler",
    ]
    cls = relax.GuardedGoldenAnswerSDPOFeedback
    assert names(cls.check_transfer_channels) == ["self", "sample", "channels", "top_k"]
    for path in (
        "distill_guard.integrations.relax.dynamic_sampling_filter",
        "distill_guard.integrations.relax.before_train_step_hook",
        "distill_guard.integrations.relax.GuardedGoldenAnswerSDPOFeedback",
    ):
        mod, _, attr = path.rpartition(".")
        assert getattr(importlib.import_module(mod), attr) is not None


def test_teacher_inputs_follow_relax_for_plain_opd_and_for_opsd_sdpo():
    plain = Sample(list(range(1, 17)), 10)
    assert fields.teacher_inputs(plain) == (list(range(1, 17)), 5)
    sdpo = Sample(list(range(1, 17)), 10, teacher_tokens=[7] * 9 + list(range(7, 17)))
    ids, start = fields.teacher_inputs(sdpo)
    assert ids == sdpo.teacher_tokens and start == 19 - 10 - 1  # len(teacher_tokens) - R - 1


def test_mask_out_keeps_a_sample_out_of_every_loss_and_unmask_restores_it():
    s = Sample([1] * 16, 10, loss_mask=[1] * 10, opd_sample_mask=True)
    assert fields.mask_out([s]) == 1
    assert s.remove_sample and s.loss_mask == [0] * 10 and s.opd_sample_mask is False
    # the values are still judged at the positions the loss used before the mask
    s.teacher_log_probs = [UNIFORM] * 10
    assert fields.teacher_values(s).token.numel() == 10
    assert fields.unmask(s) and s.loss_mask == [1] * 10 and s.opd_sample_mask is True
    assert not s.remove_sample and not fields.unmask(s)


# ---------------------------------------------------------------------------------- setup


def test_a_gate_the_launcher_wired_but_relax_ignored_is_refused(tmp_path):
    with pytest.raises(relax.GuardSetupError, match="--opd-feedback-class") as err:
        configure(tmp_path, gates=["filter", "train_step", "feedback"])
    assert "this Relax has no such argument" in str(err.value)
    args = args_for(dynamic_sampling_filter_path="relax.engine.filters.x.check_reward_nonzero_std")
    with pytest.raises(relax.GuardSetupError, match="--dynamic-sampling-filter-path"):
        configure(tmp_path, args=args, gates=["filter"])


def test_setup_announces_the_active_gates_for_the_trainer(tmp_path):
    gate = configure(tmp_path, gates=["filter", "train_step", "log"])
    assert gate.gates == ("filter", "log", "train_step")
    announced = board_for(tmp_path / "events.jsonl").announcement().value
    assert announced.gates == ["filter", "log", "train_step"]
    assert announced.on_dead_teacher == "halt" and announced.attempt == gate.board.attempt
    assert gate.guard.policy.critical_action.value == "halt"
    assert gate.guard.run.loss is LossKind.JSD


def test_configuration_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("DISTILL_GUARD_PRESET", "strict")
    monkeypatch.setenv(
        "DISTILL_GUARD_OVERRIDES", f"run.vocab_size={harness.VOCAB} alerts.use_wandb=false"
    )
    monkeypatch.setenv("DISTILL_GUARD_EVENTS", str(tmp_path / "ev.jsonl"))
    monkeypatch.setenv("DISTILL_GUARD_ON_DEAD_TEACHER", "repair")
    args = args_for()
    args.opd_kl_type, args.opd_jsd_alpha = "reverse_kl", 0.1
    gate = relax.state(args)
    assert gate.guard.policy.halt_after_critical_steps == 2  # strict
    assert gate.guard.policy.critical_action.value == "rewake"
    assert gate.guard.run.loss is LossKind.REVERSE_KL and gate.guard.run.beta == 0.1
    assert gate.teacher is None  # no teacher URL: no canary, no repair


# ---------------------------------------------------------------------------------- rollout gate


def test_the_filter_masks_dead_samples_keeps_every_group_and_posts_the_verdict(tmp_path):
    gate = configure(tmp_path)
    args = args_for()
    healthy = [Sample([1] * 16, 10, [-1.5] * 10, [1] * 10) for _ in range(2)]
    dead = [Sample([1] * 16, 10, [UNIFORM] * 10, [1] * 10) for _ in range(2)]
    assert relax.dynamic_sampling_filter(args, healthy) is True
    assert relax.dynamic_sampling_filter(args, dead) is True  # never dropped: masked
    assert all(s.remove_sample and s.loss_mask == [0] * 10 for s in dead)
    assert not any(s.remove_sample for s in healthy)
    metrics = {}
    relax.rollout_log_function(0, args, healthy + dead, metrics, 1.0)
    verdict = gate.board.read(0).value
    assert verdict.complete and verdict.dead == 2 and verdict.masked == 2
    assert verdict.verdict is Verdict.HALT  # the default policy here: halt at the first dead wake
    assert "--teacher-sglang-enable-weights-cpu-backup" in " ".join(verdict.reasons)
    assert metrics["guard/dead_samples"] == 2.0 and metrics["guard/halted"] == 1.0


def healthy_group(n=2):
    return [Sample([1] * 16, 10, [-1.5] * 10, [1] * 10) for _ in range(n)]


def dead_group(n=2):
    return [Sample([1] * 16, 10, [UNIFORM] * 10, [1] * 10) for _ in range(n)]


def test_the_verdict_counts_only_committed_samples_and_an_all_masked_step_is_skipped(tmp_path):
    """A group the filter passed but Relax never committed (over-sampling, a full batch) is not
    in the trainer's data: counting it posted ``train`` for a batch that was all masked, and
    AdamW's weight decay moved the weights on a zero loss."""
    gate = configure(tmp_path, on_dead_teacher="repair")  # no teacher to repair: mask
    args = args_for()
    uncommitted, committed = healthy_group(), dead_group()
    relax.dynamic_sampling_filter(args, uncommitted)
    relax.dynamic_sampling_filter(args, committed)
    relax.rollout_log_function(0, args, committed, {}, 1.0)
    v = gate.board.read(0).value
    assert (v.samples, v.dead, v.masked) == (2, 2, 2)
    assert v.verdict is Verdict.SKIP and "out of the loss" in v.reasons[-1]


@pytest.mark.parametrize("on_dead", ["repair", "halt"])
def test_samples_committed_without_passing_the_filter_are_judged_after_the_fact(tmp_path, on_dead):
    """Relax's abort path under partial rollout queues groups finished inside ``abort()``
    without calling the filter: their dead values reach the trainer unmasked."""
    gate = configure(tmp_path, on_dead_teacher=on_dead)
    args = args_for()
    filtered, aborted = healthy_group(), dead_group()
    relax.dynamic_sampling_filter(args, filtered)
    relax.rollout_log_function(0, args, filtered + aborted, {}, 1.0)
    v = gate.board.read(0).value
    assert (v.samples, v.dead, v.masked) == (4, 2, 0)
    assert v.verdict is (Verdict.SKIP if on_dead == "repair" else Verdict.HALT)
    assert "without passing the dynamic sampling filter" in v.reasons[-1]
    relax.dynamic_sampling_filter(args, healthy_group())  # the next step: healthy, trains
    relax.rollout_log_function(1, args, [], {}, 1.0)
    assert gate.board.read(1).value.verdict is Verdict.TRAIN


def test_a_run_that_skips_every_update_halts_after_the_bound(tmp_path):
    """The policy halts after 3 steps with unresolved criticals; a run whose repairs verify but
    whose samples still cannot be used (the old ``student_topk`` repair) would skip forever:
    the skip bound stops it (2 here, below the policy's 3)."""
    gate = configure(tmp_path, on_dead_teacher="repair", max_skipped_steps=2)
    args = args_for()
    verdicts = []
    for step in range(2):
        group = dead_group()
        relax.dynamic_sampling_filter(args, group)
        metrics = {}
        relax.rollout_log_function(step, args, group, metrics, 1.0)
        verdicts.append(gate.board.read(step).value.verdict)
    assert verdicts == [Verdict.SKIP, Verdict.HALT]
    assert "2 consecutive steps were skipped" in gate.board.read(1).value.reasons[-1]
    assert metrics["guard/skipped_in_a_row"] == 2.0
    with pytest.raises(relax.GuardSetupError, match="DISTILL_GUARD_MAX_SKIPPED_STEPS"):
        configure(tmp_path, max_skipped_steps=0)


def test_without_the_filter_the_log_hook_halts_the_trainer_before_queued_dead_data(tmp_path):
    args = args_for(dynamic_sampling_filter_path=None)
    gate = configure(tmp_path, args=args, gates=["log", "train_step"])
    dead = [Sample([1] * 16, 10, [UNIFORM] * 10, [1] * 10)]
    relax.rollout_log_function(0, args, dead, {}, 1.0)
    verdict = gate.board.read(0).value
    assert verdict.verdict is Verdict.HALT and "not loaded" in verdict.reasons[-1]


def test_a_guard_fault_on_a_group_never_stops_the_rollout(tmp_path):
    configure(tmp_path)
    bad = Sample([1, 2, 3], 2, teacher_log_probs=[[1.0, 2.0], [3.0]], loss_mask=[1, 1])
    assert relax.dynamic_sampling_filter(args_for(), [bad]) is True
    fb = relax.GuardedOPDFeedback()
    assert (
        fb.check_transfer_channels(bad, {"opd_topk_teacher_log_probs": [[1.0], [2.0, 3.0]]}, 2)
        is None
    )


def test_feedback_masks_a_dead_sample_by_default_and_can_fail_fast():
    fb = relax.GuardedGoldenAnswerSDPOFeedback(guard_vocab_size=harness.VOCAB)
    s = Sample([1] * 16, 10, loss_mask=[1] * 10, opd_sample_mask=True)
    healthy = torch.log_softmax(torch.randn(10, harness.VOCAB) * 3, -1).topk(4, -1).values
    fb.check_transfer_channels(s, {"opd_topk_teacher_log_probs": healthy}, 4)
    assert s.opd_sample_mask is True
    uniform = torch.full((10, 4), UNIFORM)
    fb.check_transfer_channels(s, {"opd_topk_teacher_log_probs": uniform.numpy()}, 4)
    assert s.opd_sample_mask is False and s.remove_sample and fb.guard_collapsed == 1
    strict = relax.GuardedGoldenAnswerSDPOFeedback(guard_on_collapse="raise")  # V inferred
    with pytest.raises(relax.TeacherCollapseError, match="uniform"):
        strict.check_transfer_channels(s, {"opd_topk_teacher_log_probs": uniform.tolist()}, 4)


def test_eval_hook_feeds_the_accuracy_replay_would_read(tmp_path):
    gate = configure(tmp_path)
    extra = {}
    data = {"zeta": {"rewards": [0, 0]}, "alpha": {"rewards": [1, 0, 1, 1]}}
    assert relax.eval_rollout_log_function(5, args_for(), data, extra) is False
    assert extra == {"guard/eval_action": 0.0}
    assert gate.guard.summary.count == {}


# ---------------------------------------------------------------------------------- trainer gate


class Optimizer:
    def __init__(self):
        self.zeroed = self.stepped = 0

    def zero_grad(self):
        self.zeroed += 1

    def step(self):
        self.stepped += 1
        return True, 1.0, 0


def test_skip_takes_no_update_and_restores_itself():
    opt, sched = Optimizer(), harness.Scheduler()
    skip_next_update(opt, sched)
    assert opt.step() == (True, 0.0, 0) and opt.stepped == 0 and opt.zeroed == 1
    sched.step()
    assert sched.steps == 0
    assert opt.step() == (True, 1.0, 0) and opt.stepped == 1  # the next step is real again
    sched.step()
    assert sched.steps == 1


def test_trainer_gate_reads_the_verdict_and_halts_after_a_checkpoint(tmp_path):
    board = FileBoard(tmp_path / "v")
    saved = []
    gate = TrainerGate(
        board, EventLog(tmp_path / "e.jsonl"), save=lambda *a: saved.append(a[1]), wait_s=0.2
    )
    # no rollout-side gate ever announced itself: an unguarded run is refused
    with pytest.raises(relax.GuardHalt, match="no rollout-side gate"):
        gate.before_step(None, 0, None, Optimizer(), None)
    assert saved == [0]
    board.announce(announcement())
    gate = TrainerGate(
        board, EventLog(tmp_path / "e2.jsonl"), save=lambda *a: saved.append(a[1]), wait_s=0.2
    )
    attempt = board.attempt
    board.post(StepVerdict(1, samples=4, complete=True, attempt=attempt))
    assert gate.before_step(None, 1, None, Optimizer(), None) is Verdict.TRAIN
    board.post(
        StepVerdict(2, Verdict.SKIP, samples=4, dead=4, masked=4, complete=True, attempt=attempt)
    )
    opt = Optimizer()
    assert gate.before_step(None, 2, None, opt, None) is Verdict.SKIP and opt.step() == (
        True,
        0.0,
        0,
    )
    with pytest.raises(relax.GuardHalt, match="no complete verdict for rollout 3"):
        gate.before_step(None, 3, None, Optimizer(), None)  # the rollout side never finished it
    assert saved == [0, 3]


def test_the_halt_checkpoint_goes_through_the_train_actors_save_model(tmp_path, monkeypatch):
    """The hook is handed no actor; the halt checkpoint is taken by the ``save_model`` of the
    actor whose ``train`` runs the step (rotation, async finalize, barrier, save_hf)."""
    from distill_guard.integrations.relax import trainer as trainer_mod

    calls = []

    class MegatronTrainRayActor:  # Relax's train actor, reduced to what the halt touches
        args = Namespace()

        def save_model(self, rollout_id, force_sync=False):
            calls.append((rollout_id, force_sync))

        def train(self, gate):  # -> model.train -> train_one_step -> the hook
            return gate.before_step(None, 4, None, Optimizer(), None)

    board = FileBoard(tmp_path / "v")
    gate = TrainerGate(
        board, EventLog(tmp_path / "e.jsonl"), save=trainer_mod.relax_save, wait_s=0.1
    )
    with pytest.raises(relax.GuardHalt):
        MegatronTrainRayActor().train(gate)
    assert calls == [(4, True)]
    rows = [json.loads(line) for line in (tmp_path / "e.jsonl").read_text().splitlines()]
    assert {"kind": "checkpoint", "via": "MegatronTrainRayActor.save_model"}.items() <= next(
        r for r in rows if r["kind"] == "checkpoint"
    ).items()
    # no actor in reach and no Relax installed: the halt still happens, the failure is said
    gate = TrainerGate(
        board, EventLog(tmp_path / "f.jsonl"), save=trainer_mod.relax_save, wait_s=0.1
    )
    with pytest.raises(relax.GuardHalt):
        gate.before_step(None, 5, None, Optimizer(), None)
    failed = [json.loads(line) for line in (tmp_path / "f.jsonl").read_text().splitlines()]
    assert any(r["kind"] == "checkpoint_failed" and "relax" in r["error"] for r in failed)


# ---------------------------------------------------------------------------------- Relax's step order


@pytest.mark.timeout(120)
@pytest.mark.parametrize("line", ["studio", pytest.param("sdpo", marks=pytest.mark.slow)])
def test_without_the_guard_every_update_trains_on_the_dead_teacher(relax_run, line):
    """The failure, reproduced in Relax's order: the harness can tell a poisoned update."""
    got = harness.totals(relax_run(line=line, backup=False, guarded=False))
    steps = harness.STEPS * harness.RANKS
    assert got == {
        "poisoned_consumed": harness.STEPS * harness.GROUPS * harness.PER_GROUP,
        "poisoned_updates": steps,
        "updates": steps,
        "queued_poisoned": harness.STEPS * harness.GROUPS * harness.PER_GROUP,
    }


@pytest.mark.timeout(120)
# the SDPO line's dead samples are found as in its repair case below; the halt is the trainer
# gate's, the same on both lines
@pytest.mark.parametrize("line", ["studio", pytest.param("sdpo", marks=pytest.mark.slow)])
def test_halt_mode_stops_every_rank_at_the_first_dead_wake_with_a_checkpoint(relax_run, line):
    result = relax_run(line=line, backup=False)
    got = harness.totals(result)
    assert got["poisoned_consumed"] == 0 and got["updates"] == 0  # no update at all
    for rank in result["ranks"]:
        assert rank["steps"] == [] and "before training rollout 0" in rank["halted"]
        assert "--teacher-sglang-enable-weights-cpu-backup" in rank["halted"]
    ckpts = sorted(p.name for p in (result["out"] / "ckpt").iterdir())
    assert ckpts == ["rank0_rollout0.pt", "rank1_rollout0.pt"]
    halts = [
        e for e in result["events"] if e["kind"] == "halt" and e.get("stage") == "before_train_step"
    ]
    assert sorted(e["rank"] for e in halts) == [0, 1]
    assert (
        result["metrics"][0]["guard/halted"] == 1.0 and result["metrics"][0]["guard/repairs"] == 0.0
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize("line", ["studio", "sdpo"])
def test_repair_mode_follows_every_resume_and_trains_only_on_verified_values(relax_run, line):
    result = relax_run(line=line, backup=False, on_dead="repair")
    got = harness.totals(result)
    assert got == {
        "poisoned_consumed": 0,
        "poisoned_updates": 0,
        "updates": harness.STEPS * harness.RANKS,
        "queued_poisoned": 0,  # every queued value is the never-slept teacher's
    }
    per_step = harness.GROUPS * harness.PER_GROUP
    for step, m in enumerate(result["metrics"]):
        # Relax's resume lost the weights again at every step; the repair was verified each time
        assert m["guard/repairs"] == step + 1 and m["guard/rescored_samples"] == per_step
        assert m["guard/masked_samples"] == 0 and m["guard/halted"] == 0.0
    alerts = [e for e in result["events"] if e["kind"] == "alert"]
    assert len(alerts) == 1  # one incident, one alert


@pytest.mark.timeout(120)
@pytest.mark.parametrize("line", ["studio", pytest.param("sdpo", marks=pytest.mark.slow)])
def test_healthy_run_is_silent_and_its_data_unchanged(relax_run, line):
    guarded = relax_run(line=line, backup=True)
    plain = relax_run(line=line, backup=True, guarded=False)
    assert harness.totals(guarded)["updates"] == harness.STEPS * harness.RANKS
    loud = [e for e in guarded["events"] if e.get("severity") in ("warn", "critical")]
    assert loud == [] and not [e for e in guarded["events"] if e["kind"] in ("alert", "halt")]
    assert guarded["queued"] == plain["queued"]  # the gate changed nothing the trainer reads
    assert [r["params_sha"] for r in guarded["ranks"]] == [r["params_sha"] for r in plain["ranks"]]


@pytest.mark.timeout(120)
# the conversion gate judges through the filter's own path (RelaxGate.convert -> filter_group),
# whose halt branch the studio line's halt case runs: the deferred line's halt is make test-all's
@pytest.mark.parametrize("on_dead", ["repair", pytest.param("halt", marks=pytest.mark.slow)])
def test_deferred_opd_is_gated_where_it_publishes(relax_run, on_dead):
    """The line whose teacher scores after the filter ran (``DeferredOpdSession.flush``): the
    filter sees no teacher value, and the conversion gate catches every one."""
    result = relax_run(line="studio", backup=False, on_dead=on_dead, deferred=True)
    got = harness.totals(result)
    assert got["poisoned_consumed"] == 0 and got["poisoned_updates"] == 0
    if on_dead == "repair":
        assert got["updates"] == harness.STEPS * harness.RANKS and got["queued_poisoned"] == 0
    else:
        assert got["updates"] == 0
        assert all("before training rollout 0" in r["halted"] for r in result["ranks"])


def test_deferred_opd_without_the_conversion_gate_is_refused_at_setup(relax_run):
    with pytest.raises(relax.GuardSetupError, match="deferred OPD is on") as err:
        relax_run(line="studio", backup=False, deferred=True, gates=("filter", "train_step", "log"))
    assert harness.HOOKS + ".convert_samples_to_train_data" in str(err.value)


def test_repair_that_cannot_re_score_the_selection_is_refused_at_setup(tmp_path):
    with pytest.raises(relax.GuardSetupError, match="cannot re-score --opd-token-selection union"):
        configure(tmp_path, args=args_for(opd_token_selection="union"), on_dead_teacher="repair")

    class OldTeacher:  # a Teacher from before score_token_ids
        def score(self, *a, **k):
            raise AssertionError("never called")

    args = args_for(opd_token_selection="student_topk")
    with pytest.raises(relax.GuardSetupError, match="OldTeacher does not have"):
        configure(tmp_path, args=args, teacher=OldTeacher(), on_dead_teacher="repair")
    configure(tmp_path, args=args, teacher=OldTeacher(), on_dead_teacher="halt")  # halts instead


def test_student_topk_rows_are_judged_entry_by_entry_not_by_a_top1_rule(tmp_path):
    """Under student_topk a row holds the teacher's logprobs of the student's ids: low values
    are normal there, and only a dead teacher puts every entry at −ln V."""
    gate = configure(tmp_path, args=args_for(opd_token_selection="student_topk"))
    low = torch.full((10, 4), -9.0) + torch.randn(10, 4)  # healthy, far from every top-1
    s = Sample([1] * 16, 10, loss_mask=[1] * 10)
    s.opd_topk_teacher_log_probs = low.tolist()
    assert gate._dead(0, [s]) == []
    s.opd_topk_teacher_log_probs = torch.full((10, 4), UNIFORM).tolist()
    assert gate._dead(0, [s]) == [s]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_slime_and_miles_order_the_log_hook_before_conversion_so_it_alone_protects_nothing(
    relax_run,
):
    """slime/miles: the log hook runs before the teacher's values reach the samples."""
    result = relax_run(line="slime", backup=False, gates=("log", "train_step"))
    got = harness.totals(result)
    assert got["poisoned_updates"] == harness.STEPS * harness.RANKS and got["poisoned_consumed"] > 0
    assert result["metrics"][0]["guard/dead_samples"] == 0.0  # nothing to judge at that point


@pytest.mark.timeout(120)
# the post-process gate judges through the filter's path too (RelaxGate.post_process ->
# filter_group), then completes the step as in the repair case: the halt case is make test-all's
@pytest.mark.parametrize("on_dead", [pytest.param("halt", marks=pytest.mark.slow), "repair"])
def test_slime_and_miles_are_protected_by_the_post_process_gate(relax_run, on_dead):
    result = relax_run(line="slime", backup=False, on_dead=on_dead)
    got = harness.totals(result)
    assert got["poisoned_consumed"] == 0 and got["poisoned_updates"] == 0
    if on_dead == "halt":
        assert got["updates"] == 0
        assert all("before training rollout 0" in r["halted"] for r in result["ranks"])
    else:
        assert got["updates"] == harness.STEPS * harness.RANKS and got["queued_poisoned"] == 0


def test_wrapped_teacher_manager_runs_its_own_sleep_and_wake_inside_the_guards(
    tmp_path, teacher_dir
):
    """A process that owns Relax's TeacherManager: its offload and onload become the guard's
    colocated step, over real HTTP, with the manager's own handle doing the release and resume."""
    from distill_guard.teachers import SGLangHTTPTeacher, TorchTeacher
    from distill_guard.testing.reference_server import ReferenceServer, serve_in_thread

    local = TorchTeacher.from_pretrained(teacher_dir, enable_cpu_backup=False)
    with serve_in_thread(ReferenceServer(local)) as url:
        guard_side, relax_side = SGLangHTTPTeacher(url), SGLangHTTPTeacher(url)
        gate = configure(tmp_path, teacher=guard_side, on_dead_teacher="repair")
        calls = []

        class Manager:  # TeacherManager, reduced to its sleep and wake
            def offload(self):
                calls.append(("offload", guard_side.asleep))
                relax_side.release()
                return "offloaded"

            def onload(self):
                calls.append(("onload", guard_side.asleep))
                relax_side.resume()

        m = relax.wrap_teacher_manager(Manager(), gate)
        assert relax.wrap_teacher_manager(m, gate) is m  # idempotent
        assert m.offload() == "offloaded" and guard_side.asleep  # the tracked state followed
        m.onload()
        assert calls == [("offload", False), ("onload", True)]
        assert not guard_side.asleep and gate.guard.repairs == 1  # lost, reloaded, verified
        assert gate.guard.canary.verify(guard_side) == []
        guard_side.close()
        relax_side.close()


def test_a_teacher_garbage_from_its_first_wake_is_repaired_against_its_checkpoint(
    tmp_path, teacher_dir, forkserver
):
    """Relax offloads the teacher at launch and resumes it before rollout 0, so the guard's
    first fingerprint is of whatever woke. Garbage at that first wake: without a reference it
    is the reference, and rollout 0 trains on it; with the checkpoint's (``teacher_reference=
    auto``: the server's model_path), the wake is caught, the reload from the checkpoint is
    verified against it, the step is re-scored, and nothing poisoned reaches an update."""
    from ._tiny import garble
    from .conformance.adapters import RelaxHarness

    driver = RelaxHarness(teacher_dir, context=forkserver)
    blind = driver.run(tmp_path / "blind", poison=garble, at=0, on_dead="repair")
    assert blind.poisoned == [0, 1] and blind.findings == [], blind.story()
    r = driver.run(tmp_path / "ref", poison=garble, at=0, reference=True, on_dead="repair")
    assert r.poisoned == [] and r.moved == {0: True, 1: True} and r.halt_step is None, r.story()
    first = {f["code"]: f for f in reversed(r.findings)}
    assert first["teacher.reference_mismatch"]["step"] == 0, r.story()
    assert first["teacher.repaired"]["step"] == 0, r.story()
    assert "checkpoint's reference" in first["teacher.repaired"]["message"]


@pytest.mark.parametrize(
    ("selection", "carries"),
    [("student_topk", True), ("union", True), ("teacher_topk", False), (None, False)],
)
def test_the_guards_teacher_follows_the_token_selection_of_relax_traffic(selection, carries):
    """``student_topk`` and ``union`` ask the teacher ``token_ids_logprob``: the guard's own
    requests then carry ids too on SGLang 0.5.10-0.5.15, where a mixed batch kills."""
    from distill_guard.integrations.relax.setup import _teacher_from

    teacher = _teacher_from(args_for(opd_token_selection=selection, opd_teacher_url="http://t:1"))
    assert teacher.traffic_token_ids is carries
