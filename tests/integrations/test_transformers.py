"""A real transformers.Trainer with the guard in its callbacks: a teacher made uniform mid-run."""

from __future__ import annotations

import logging
import math

import pytest
import torch

transformers = pytest.importorskip("transformers")

from distill_guard.integrations.transformers import (  # noqa: E402
    DistillGuardCallback,
    GuardedDistillationMixin,
    find_guard_callback,
    guard_trainer,
)
from distill_guard.observations import Metric  # noqa: E402

from ._tiny import (  # noqa: E402
    VOCAB,
    events,
    jsd,
    kill,
    params,
    same,
    student_of,
    tiny_qwen3,
    token_rows,
)

MAX_STEPS = 12
COLLAPSE_AT = 4


class TinyGKDTrainer(transformers.Trainer):
    """Stands in for TRL's GKDTrainer: the teacher runs inside compute_loss, loss is the JSD."""

    def __init__(self, *args, teacher_model, beta=0.5, nan_at=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.teacher_model = teacher_model.eval()
        self.beta = beta
        self.nan_at = nan_at

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        out = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
        with torch.no_grad():
            t = self.teacher_model(
                input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]
            ).logits
        loss = jsd(out.logits, t, inputs["attention_mask"], self.beta)
        if self.nan_at is not None and self.state.global_step == self.nan_at:
            loss = loss * float("nan")
        return (loss, out) if return_outputs else loss


class GuardedTinyGKDTrainer(GuardedDistillationMixin, TinyGKDTrainer):
    pass


class Recorder(transformers.TrainerCallback):
    """Kills the teacher at the start of a step and snapshots the student just before."""

    def __init__(self, teacher, student, at):
        self.teacher, self.student, self.at = teacher, student, at
        self.before = None

    def on_step_begin(self, args, state, control, **kwargs):
        if self.at is not None and state.global_step == self.at:
            self.before = params(self.student)
            kill(self.teacher)


def run(
    tmp_path,
    *,
    collapse_at=None,
    nan_at=None,
    trainer_cls=GuardedTinyGKDTrainer,
    report_to="none",
    before_train=None,
    **cb,
):
    teacher = tiny_qwen3(seed=0)
    student = student_of(teacher)
    start = params(student)
    ev = tmp_path / "events.jsonl"
    callback = DistillGuardCallback(
        "default",
        overrides=[f"events_path={ev}", f"run.vocab_size={VOCAB}", "alerts.use_wandb=false"],
        **cb,
    )
    rec = Recorder(teacher, student, collapse_at)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=MAX_STEPS,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=report_to,
        use_cpu=True,
        remove_unused_columns=False,
        disable_tqdm=True,
        seed=0,
    )
    trainer = trainer_cls(
        model=student,
        args=args,
        train_dataset=token_rows(),
        teacher_model=teacher,
        nan_at=nan_at,
        callbacks=[rec, callback],
    )
    if before_train is not None:
        before_train(trainer)
    trainer.train()
    return trainer, callback, rec, start, ev


ADVICE = "use GuardedDistillationMixin"


def test_the_raw_loss_advice_is_given_only_where_the_mixin_is_missing(tmp_path, caplog):
    """With the mixin in the trainer, on_train_begin still advised using the mixin."""
    caplog.set_level(logging.INFO, logger="distill_guard")
    run(tmp_path / "mixin")
    assert ADVICE not in caplog.text
    caplog.clear()
    run(tmp_path / "plain", trainer_cls=TinyGKDTrainer)
    assert ADVICE in caplog.text


def test_nan_loss_hidden_from_on_log_is_caught_raw(tmp_path):
    # logging_nan_inf_filter (on by default) hides this NaN from on_log; the mixin sees it raw
    trainer, cb, _, _, ev = run(tmp_path, nan_at=3)
    assert trainer.state.global_step == MAX_STEPS
    assert cb.step_guard.skipped_updates == 1
    assert all(math.isfinite(float(p.detach().sum())) for p in trainer.model.parameters())
    found = [e for e in events(ev) if e["kind"] == "finding"]
    assert [(e["code"], e["step"]) for e in found] == [("metric.nonfinite", 3)]


def test_guard_trainer_watches_the_teacher_without_the_mixin(tmp_path):
    teacher = tiny_qwen3(seed=0)
    student = student_of(teacher)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=4,
        per_device_train_batch_size=4,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        remove_unused_columns=False,
        disable_tqdm=True,
    )
    trainer = TinyGKDTrainer(
        model=student, args=args, train_dataset=token_rows(16), teacher_model=teacher
    )
    kill(teacher)
    cb = guard_trainer(
        trainer,
        "default",
        overrides=["policy.critical_action=HALT", "alerts.use_wandb=false"],
    )
    before = params(student)
    trainer.train()
    assert cb.guard.halted and cb.guard.halt.step == 0
    assert same(before, params(trainer.model))
    assert trainer.state.global_step == 1
    assert (tmp_path / "out" / "checkpoint-1").exists()
    assert cb.guard.run.vocab_size == VOCAB  # learnt from the logits' width


def test_on_log_maps_keys_to_roles_and_halts_on_metrics(tmp_path):
    cb = DistillGuardCallback(
        "default",
        overrides=["alerts.use_wandb=false"],
        metric_keys={Metric.LOSS: "loss", Metric.STUDENT_ENTROPY: "ent"},
    )
    args = transformers.TrainingArguments(output_dir=str(tmp_path), report_to="none")
    state = transformers.TrainerState()
    control = transformers.TrainerControl()
    seen = []
    cb.guard.on_finding = seen.append
    for step in range(1, 4):  # a loss at the JSD ceiling, logged after each update
        state.global_step = step
        cb.on_log(args, state, control, logs={"loss": 0.69, "ent": 0.4, "epoch": 0.1})
    assert {f.code for f in seen} == {"loss.jsd_ceiling"} and seen[0].step == 0
    assert control.should_training_stop and control.should_save
    assert cb.guard.halt.step == 2


def test_the_old_guard_overrides_keyword_is_refused_with_its_new_name():
    with pytest.raises(TypeError, match="'guard_overrides': it is now 'overrides'"):
        DistillGuardCallback("default", guard_overrides=["alerts.use_wandb=false"])
    with pytest.raises(TypeError, match="unexpected keyword argument 'overides'"):
        DistillGuardCallback("default", overides=["alerts.use_wandb=false"])
    trainer = TinyGKDTrainer(
        model=student_of(tiny_qwen3()),
        args=transformers.TrainingArguments(output_dir="unused", report_to="none", use_cpu=True),
        train_dataset=token_rows(4),
        teacher_model=tiny_qwen3(),
    )
    with pytest.raises(TypeError, match="it is now 'overrides'"):
        guard_trainer(trainer, "default", guard_overrides=["alerts.use_wandb=false"])


GUARD_KEYS = {
    "guard/findings",
    "guard/skipped_updates",
    "guard/repairs",
    "guard/halted",
    "guard/verdict",
}


@pytest.mark.parametrize("way", ["mixin", "guard_trainer"])
def test_guard_metrics_reach_the_report_to_callbacks_and_log_history(tmp_path, monkeypatch, way):
    """The Trainer lists its report_to callbacks (here wandb, disabled) before the user's: the
    mixin and guard_trainer put the guard's callback first, so wandb's on_log sees guard/*."""
    pytest.importorskip("wandb")
    from transformers.integrations import WandbCallback

    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    reported: list[dict] = []

    def spy(trainer):
        if way == "guard_trainer":  # the callback joins after the Trainer was built
            trainer.callback_handler.callbacks.remove(find_guard_callback(trainer))
            guard_trainer(trainer, "default", overrides=["alerts.use_wandb=false"])
        wandb_cb = next(
            c for c in trainer.callback_handler.callbacks if isinstance(c, WandbCallback)
        )
        real = wandb_cb.on_log

        def on_log(args, state, control, logs=None, **kwargs):
            reported.append(dict(logs or {}))
            return real(args, state, control, logs=logs, **kwargs)

        wandb_cb.on_log = on_log

    trainer_cls = GuardedTinyGKDTrainer if way == "mixin" else TinyGKDTrainer
    trainer, cb, *_ = run(
        tmp_path,
        collapse_at=COLLAPSE_AT,
        trainer_cls=trainer_cls,
        report_to=["wandb"],
        before_train=spy,
    )
    cb = find_guard_callback(trainer)
    callbacks = trainer.callback_handler.callbacks
    assert callbacks[0] is cb and cb.first
    steps = [r for r in reported if "loss" in r]
    assert steps and all(r.keys() >= GUARD_KEYS for r in steps), steps[:1]
    history = [h for h in trainer.state.log_history if "loss" in h]
    assert [{k: h[k] for k in GUARD_KEYS} for h in history] == [
        {k: r[k] for k in GUARD_KEYS} for r in steps
    ]
    # before the collapse: trained and clean; after it: dropped updates counted, then the halt
    assert history[0]["guard/verdict"] == 0.0 and history[0]["guard/findings"] == 0.0
    last = history[-1]
    assert last["guard/halted"] == 1.0 and last["guard/verdict"] == 2.0
    assert last["guard/skipped_updates"] == float(cb.step_guard.skipped_updates) > 0
    assert last["guard/findings"] >= 3.0 and last["guard/repairs"] == 0.0


def test_the_callback_alone_logs_guard_metrics_to_log_history_and_says_where_they_miss(
    tmp_path, monkeypatch, caplog
):
    """Placed by callbacks= without the mixin, the callback runs after wandb's: the keys reach
    state.log_history, and one INFO line says how to have them reported."""
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    caplog.set_level(logging.INFO, logger="distill_guard")
    trainer, cb, *_ = run(tmp_path, trainer_cls=TinyGKDTrainer, report_to=["wandb"])
    history = [h for h in trainer.state.log_history if "loss" in h]
    assert len(history) == MAX_STEPS and all(h.keys() >= GUARD_KEYS for h in history)
    assert all(h["guard/verdict"] == 0.0 and h["guard/findings"] == 0.0 for h in history)
    told = [r for r in caplog.records if "guard/* metrics reach state.log_history" in r.message]
    assert len(told) == 1 and told[0].levelno == logging.INFO


def test_guard_trainer_without_a_teacher_module_warns(caplog):
    """Issue 28: a guard that can watch no teacher said so at INFO level only (unseen by
    default); it is a WARNING naming the attribute it looked at and the way to fix it."""
    trainer = TinyGKDTrainer(
        model=student_of(tiny_qwen3()),
        args=transformers.TrainingArguments(output_dir="unused", report_to="none", use_cpu=True),
        train_dataset=token_rows(4),
        teacher_model=tiny_qwen3(),
    )
    trainer.teacher_model = None
    with caplog.at_level(logging.WARNING, logger="distill_guard"):
        guard_trainer(trainer, "default", overrides=["alerts.use_wandb=false"])
    (record,) = [r for r in caplog.records if "no teacher module" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert "trainer.teacher_model is NoneType" in record.getMessage()
    assert "teacher=MODULE" in record.getMessage()
