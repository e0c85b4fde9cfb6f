"""A real Lightning Trainer with the guard in its callbacks: a teacher made uniform mid-run."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")

from distill_guard.integrations.lightning import (  # noqa: E402
    DistillGuardCallback,
    find_guard_callback,
)
from distill_guard.losses import distill_loss  # noqa: E402

from ._tiny import (  # noqa: E402
    VOCAB,
    events,
    jsd,
    kill,
    loud,
    params,
    same,
    student_of,
    tiny_qwen3,
    token_rows,
)

MAX_STEPS = 12
COLLAPSE_AT = 4


class Distill(pl.LightningModule):
    def __init__(self, teacher, student):
        super().__init__()
        self.teacher = teacher.eval().requires_grad_(False)
        self.student = student

    def training_step(self, batch, batch_idx):
        ids, mask = batch["input_ids"], batch["attention_mask"]
        with torch.no_grad():
            t = self.teacher(input_ids=ids, attention_mask=mask).logits
        loss = jsd(self.student(input_ids=ids, attention_mask=mask).logits, t, mask)
        self.log("train/loss", loss, on_step=True, prog_bar=False)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.student.parameters(), lr=1e-3)

    def train_dataloader(self):
        rows = token_rows()
        data = [{k: torch.tensor(v) for k, v in r.items()} for r in rows]
        return torch.utils.data.DataLoader(data, batch_size=4)


class FusedDistill(Distill):
    """The fused-loss ``training_step`` of docs/integrations.md: ``distill_loss`` is the loss,
    its output goes to the guard's callback."""

    def training_step(self, batch, batch_idx):
        ids, mask = batch["input_ids"], batch["attention_mask"]
        with torch.no_grad():
            t = self.teacher(input_ids=ids, attention_mask=mask).logits
        out = distill_loss(self.student(input_ids=ids, attention_mask=mask).logits, t, mask=mask)
        find_guard_callback(self.trainer).observe_distill_loss(out)
        self.log("train/loss", out.loss, on_step=True, prog_bar=False)
        return out.loss


class Killer(pl.Callback):
    def __init__(self, at, poison=kill):
        self.at, self.before, self.poison = at, None, poison

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.at is not None and trainer.global_step == self.at and self.before is None:
            self.before = params(pl_module.student)
            self.poison(pl_module.teacher)


def fit(
    tmp_path,
    *,
    collapse_at=None,
    overrides=(),
    poison=kill,
    logger=False,
    fused=False,
    ckpt_path=None,
):
    teacher = tiny_qwen3(seed=0)
    module = (FusedDistill if fused else Distill)(teacher, student_of(teacher))
    start = params(module.student)
    ev = tmp_path / "events.jsonl"
    cb = DistillGuardCallback(
        "default",
        overrides=[
            f"events_path={ev}",
            f"run.vocab_size={VOCAB}",
            "alerts.use_wandb=false",
            *overrides,
        ],
        fused_loss=fused,
    )
    killer = Killer(collapse_at, poison)
    trainer = cpu_trainer(tmp_path, [killer, cb], logger=logger)
    trainer.fit(module, ckpt_path=ckpt_path)
    return trainer, module, cb, killer, start, ev


def cpu_trainer(root, callbacks, *, max_steps=MAX_STEPS, logger=False) -> pl.Trainer:
    """One CPU process, no checkpoints of its own (only the guard's halt checkpoint)."""
    return pl.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        devices=1,
        logger=logger,
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(root),
        callbacks=callbacks,
    )


def test_uniform_teacher_mid_run_is_caught_before_the_update_then_halts(tmp_path):
    trainer, module, cb, killer, _, ev = fit(tmp_path, collapse_at=COLLAPSE_AT)
    assert killer.before is not None and same(killer.before, params(module.student))
    halt_step = COLLAPSE_AT + 2  # default policy: skip, skip, halt
    assert cb.guard.halt.step == halt_step
    assert trainer.global_step == halt_step + 1 < MAX_STEPS
    ckpt = tmp_path / "checkpoints" / f"distill_guard-halt-step={halt_step}.ckpt"
    assert cb.halt_checkpoint == str(ckpt) and ckpt.exists()
    saved = torch.load(ckpt, weights_only=False)
    guard_state = next(v for k, v in saved["callbacks"].items() if "DistillGuardCallback" in k)
    assert guard_state["guard"]["summary"]["halt"]["step"] == halt_step
    log = events(ev)
    halt = [e for e in log if e["kind"] == "halt"]
    assert len(halt) == 1 and "teacher.uniform" in halt[0]["message"]
    assert any(e["kind"] == "checkpoint" and e["path"] == str(ckpt) for e in log)


def test_resume_from_the_halt_checkpoint_trains_to_the_end_on_the_healthy_teacher(tmp_path):
    """Issue 28: the documented layout keeps the teacher in ``module.teacher``, so a checkpoint
    of the whole module held the zeroed teacher (every teacher tensor 0) and the callback's state
    its halt; ``trainer.fit(module, ckpt_path=<halt checkpoint>)`` on a healthy teacher halted
    again at its first step. Now the halt checkpoint leaves the teacher out (and says so), the
    resume keeps the teacher the run built, lifts the halt, and trains to the end: every update
    taken, no new finding."""
    halted_trainer, _, halted, *_ = fit(tmp_path / "halted", collapse_at=COLLAPSE_AT)
    ckpt = Path(halted.halt_checkpoint)
    saved = torch.load(ckpt, weights_only=False)
    assert [k for k in saved["state_dict"] if k.startswith("teacher.")] == []
    assert any(k.startswith("student.") for k in saved["state_dict"])
    (state,) = [v for k, v in saved["callbacks"].items() if "DistillGuardCallback" in k]
    left_out = state["teacher_left_out"]
    assert left_out["in_checkpoint"] is False and left_out["modules"] == ["teacher"]
    assert left_out["tensors"] == len(tiny_qwen3(seed=0).state_dict()) and left_out["why"]
    (record,) = [
        e for e in events(tmp_path / "halted" / "events.jsonl") if e["kind"] == "checkpoint"
    ]
    assert record["teacher_left_out"] == left_out
    found = dict(halted.guard.summary.count)

    trainer, module, cb, _, start, ev = fit(tmp_path / "resumed", ckpt_path=ckpt)
    assert same(params(module.teacher), params(tiny_qwen3(seed=0)))  # the run's own teacher
    assert trainer.global_step == MAX_STEPS and not cb.guard.halted, cb.guard.halt
    assert cb.step_guard.skipped_updates == 3  # the halted run's, restored; none added
    assert dict(cb.guard.summary.count) == found
    log = events(ev)
    assert [e for e in log if e["kind"] in ("finding", "halt", "checkpoint")] == []
    assert [e["step"] for e in log if e["kind"] == "halt_lifted"] == [COLLAPSE_AT + 2]
    (kept,) = [e for e in log if e["kind"] == "teacher_kept"]
    assert kept["checkpoint_left_out"] == left_out
    assert not same(start, params(module.student))


def test_a_resume_keeps_the_halt_only_when_asked(tmp_path):
    """``resume_after_halt=False``: the checkpoint's halt is kept, as an automatic requeue may
    want (the resumed run stops at its first step); by default it is lifted and recorded."""
    overrides = ["alerts.use_wandb=false", f"run.vocab_size={VOCAB}"]
    halted = DistillGuardCallback("default", overrides=[*overrides, "policy.critical_action=HALT"])
    uniform = torch.full((8, 4), -math.log(VOCAB))
    halted.guard.on_teacher_scores(0, token_logprobs=uniform[:, 0], topk_logprobs=uniform)
    assert halted.guard.halted
    state = halted.state_dict()
    kept = DistillGuardCallback("default", overrides=overrides, resume_after_halt=False)
    kept.load_state_dict(state)
    lifted = DistillGuardCallback("default", overrides=[*overrides, f"events_path={tmp_path}/e"])
    lifted.load_state_dict(state)
    assert kept.guard.halted and not lifted.guard.halted
    assert [e["step"] for e in events(tmp_path / "e") if e["kind"] == "halt_lifted"] == [0]


def test_halt_policy_stops_at_the_first_poisoned_step(tmp_path):
    trainer, module, cb, killer, _, _ = fit(
        tmp_path, collapse_at=COLLAPSE_AT, overrides=["policy.critical_action=HALT"]
    )
    assert cb.guard.halt.step == COLLAPSE_AT
    assert trainer.global_step == COLLAPSE_AT + 1
    assert same(killer.before, params(module.student))


def test_state_dict_round_trip():
    a = DistillGuardCallback("default", overrides=["alerts.use_wandb=false"])
    a.guard.on_step_metrics(0, {"loss": 0.69})
    b = DistillGuardCallback("default", overrides=["alerts.use_wandb=false"])
    b.load_state_dict(a.state_dict())
    assert b.guard.summary.count == a.guard.summary.count == {"loss.jsd_ceiling": 1}


class KillOnRank1(pl.Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == COLLAPSE_AT and trainer.global_rank == 1:
            kill(pl_module.teacher)


class Report(pl.Callback):
    def __init__(self, cb, out):
        self.cb, self.out = cb, out

    def on_fit_end(self, trainer, pl_module):
        rec = {"step": trainer.global_step, "halt": self.cb.guard.halt.to_dict()}
        (self.out / f"rank{trainer.global_rank}.json").write_text(json.dumps(rec))


@pytest.mark.slow  # 15 s of two Lightning DDP processes; the ranks' agreement is test_consensus.py's
@pytest.mark.timeout(60)
def test_two_rank_ddp_only_rank_1_sees_the_collapse_and_both_stop(tmp_path):
    teacher = tiny_qwen3(seed=0)
    module = Distill(teacher, student_of(teacher))
    ev = tmp_path / "events.jsonl"
    cb = DistillGuardCallback(
        "default",
        overrides=[f"events_path={ev}", f"run.vocab_size={VOCAB}", "alerts.use_wandb=false"],
        consensus_timeout_s=20,
    )
    trainer = pl.Trainer(
        max_steps=MAX_STEPS,
        accelerator="cpu",
        devices=2,
        strategy="ddp_spawn",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
        callbacks=[KillOnRank1(), cb, Report(cb, tmp_path)],
    )
    trainer.fit(module)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    halt_step = COLLAPSE_AT + 2
    for r in (r0, r1):
        assert r["step"] == halt_step + 1 and r["halt"]["step"] == halt_step
    assert r0["halt"]["message"].startswith("rank 1: ")  # rank 0 stopped for rank 1's reason
    ckpt = tmp_path / "checkpoints" / f"distill_guard-halt-step={halt_step}.ckpt"
    saved = torch.load(ckpt, weights_only=False)["state_dict"]  # rank 0's, of both ranks' save
    assert saved and not [k for k in saved if k.startswith("teacher.")]  # left out under DDP too
    for path in (ev, tmp_path / "events.rank1.jsonl"):
        assert [e["step"] for e in events(path) if e["kind"] == "halt"] == [halt_step]


def test_the_old_guard_overrides_keyword_is_refused_with_its_new_name():
    with pytest.raises(TypeError, match="'guard_overrides': it is now 'overrides'"):
        DistillGuardCallback("default", guard_overrides=["alerts.use_wandb=false"])


def test_guard_metrics_reach_the_loggers(tmp_path):
    """Every step's guard/* metrics, in a real CSVLogger's file: clean steps, the dropped
    updates after the collapse, then the halt."""
    import csv

    from lightning.pytorch.loggers import CSVLogger

    logger = CSVLogger(str(tmp_path), name="csv", version=0)
    trainer, _, cb, *_ = fit(tmp_path, collapse_at=COLLAPSE_AT, logger=logger)
    assert trainer.callback_metrics["guard/halted"] == 1.0
    with open(Path(logger.log_dir) / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    rows = [r for r in rows if r.get("guard/verdict")]
    verdicts = [float(r["guard/verdict"]) for r in rows]
    halt_step = COLLAPSE_AT + 2
    assert verdicts == [0.0] * COLLAPSE_AT + [1.0, 1.0, 2.0], verdicts  # train, skip, skip, halt
    skipped = [float(r["guard/skipped_updates"]) for r in rows]
    assert skipped == [0.0] * COLLAPSE_AT + [1.0, 2.0, 3.0] == sorted(skipped)
    assert float(rows[-1]["guard/halted"]) == 1.0 and float(rows[0]["guard/halted"]) == 0.0
    assert float(rows[COLLAPSE_AT - 1]["guard/findings"]) == 0.0
    assert float(rows[-1]["guard/findings"]) >= 3.0
    assert len(rows) == halt_step + 1 and cb.step_guard.skipped_updates == 3


def test_fused_loss_zeroed_teacher_mid_run_takes_no_update(tmp_path, monkeypatch):
    """``training_step`` hands distill_loss's output to the callback (``fused_loss=True``): the
    zeroed teacher is caught from those signals alone (the logits reducer fails if called), no
    update is taken on it, and the default policy halts."""
    from distill_guard.integrations import step_guard

    def second_pass(*args, **kwargs):
        raise AssertionError("the guard read the teacher's logits a second time")

    monkeypatch.setattr(step_guard, "teacher_logprobs_from_logits", second_pass)
    trainer, module, cb, killer, _, ev = fit(tmp_path, collapse_at=COLLAPSE_AT, fused=True)
    assert killer.before is not None and same(killer.before, params(module.student))
    assert cb.guard.summary.first["teacher.uniform"] == COLLAPSE_AT
    assert min(cb.guard.summary.first.values()) == COLLAPSE_AT
    assert cb.guard.halt.step == COLLAPSE_AT + 2 and trainer.global_step == COLLAPSE_AT + 3
    assert not cb.step_guard.watching and cb.guard.module_canary is not None


def test_fused_loss_healthy_run_is_quiet(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="distill_guard")
    trainer, module, cb, _, start, ev = fit(tmp_path, fused=True)
    assert trainer.global_step == MAX_STEPS and cb.step_guard.skipped_updates == 0
    assert not same(start, params(module.student))
    assert [e for e in events(ev) if e.get("severity") in ("warn", "critical")] == []
    assert loud(caplog.records) == []
    assert cb.guard.run.vocab_size == VOCAB
