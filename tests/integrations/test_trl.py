"""TRL's real GKDTrainer with the guard attached as docs/integrations.md shows it.

``class GuardedGKDTrainer(GuardedDistillationMixin, GKDTrainer)`` and
``callbacks=[DistillGuardCallback("default", ...)]``, on CPU: a tiny Qwen3 teacher, a student
near it, a word-level tokenizer built offline, 12 optimizer steps (well under a second of
training each). TRL 1.16 keeps GKD in ``trl.experimental.gkd`` (``from trl import GKDTrainer``
fails there).

GKD settings: ``lmbda=1.0`` (every step trains on the student's own samples, generated with
``max_new_tokens`` from the prompt: on-policy distillation), ``beta=0.5`` (the JSD ceiling is
ln 2), ``seq_kd=False``. TRL divides the on-policy JSD sum by ``num_items_in_batch``, which the
Trainer counts on the *dataset's* labels before ``training_step`` swaps in the generated ones; so
``max_new_tokens`` equals the dataset's completion length (6 words and ``<|im_end|>``) and the
logged loss is the per-token JSD the ceiling check assumes.

A *poisoned update* is an optimizer step at or after the teacher went bad (step ``POISON_AT``;
it stays bad) after which the student's parameters differ from their snapshot at
``on_step_begin``: an update taken on the bad teacher's scores (:class:`_tiny.UpdateLedger`).

The divergence scenario also runs on the stand-in ``TinyGKDTrainer`` of test_transformers.py
(a plain ``transformers.Trainer``), which needs no TRL. The dead-teacher scenarios (zeroed or
garbage mid-run, the halt's checkpoint, the resume) run on every adapter in
``tests/integrations/conformance/``, through :func:`run`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

from distill_guard.integrations.transformers import (  # noqa: E402
    GUARD_STATE_FILE,
    DistillGuardCallback,
    GuardedDistillationMixin,
)
from distill_guard.metric_names import HF_METRIC_NAMES, pick_metrics  # noqa: E402
from distill_guard.observations import Metric  # noqa: E402

from ._tiny import (  # noqa: E402
    VOCAB,
    UpdateLedger,
    chat_rows,
    events,
    kill,
    loud,
    student_of,
    tiny_qwen3,
    tiny_tokenizer,
    token_rows,
)
from .test_transformers import GuardedTinyGKDTrainer  # noqa: E402

MAX_STEPS = 12
POISON_AT = 4
HEALTHY_LR = 1e-3
DIVERGENT_LR = 1e2
"""Far too high: the student's outputs saturate after one update, and the JSD sits at ln 2."""
COMPLETION_WORDS = 6
MAX_NEW_TOKENS = COMPLETION_WORDS + 1  # the dataset's completion tokens: words and <|im_end|>
RESPONSE_STEPS = 5
"""How long the guard may answer a diverging student with skipped updates before it halts."""


@functools.cache
def _guarded_gkd_trainer() -> type:
    gkd = pytest.importorskip("trl.experimental.gkd")

    class GuardedGKDTrainer(GuardedDistillationMixin, gkd.GKDTrainer):
        pass

    return GuardedGKDTrainer


@functools.cache
def _fused_gkd_trainer() -> type:
    class FusedGKDTrainer(_guarded_gkd_trainer()):
        distill_guard_fused_loss = True

    return FusedGKDTrainer


@functools.cache
def _guarded_distillation_trainer() -> type:
    trl = pytest.importorskip("trl")

    class GuardedDistillationTrainer(GuardedDistillationMixin, trl.DistillationTrainer):
        pass

    return GuardedDistillationTrainer


class Ledger(transformers.TrainerCallback):
    """Drives an :class:`UpdateLedger` from the Trainer's step events; listed before the guard's
    callback, so the teacher goes bad before anything of that step runs."""

    def __init__(self, ledger: UpdateLedger, guard: DistillGuardCallback):
        self.ledger, self.guard = ledger, guard
        self._skips = 0

    def on_step_begin(self, args, state, control, **kwargs):
        self.ledger.begin(state.global_step)
        self._skips = self.guard.step_guard.skipped_updates

    def on_step_end(self, args, state, control, **kwargs):
        self.ledger.end(self.guard.step_guard.skipped_updates > self._skips)


@dataclass
class Run:
    trainer: Any
    callback: DistillGuardCallback
    ledger: UpdateLedger
    events_path: Path
    out: Path

    @property
    def log(self) -> list[dict]:
        return events(self.events_path)

    @property
    def findings(self) -> list[dict]:
        return [e for e in self.log if e["kind"] == "finding"]

    @property
    def losses(self) -> list[float]:
        return [h["loss"] for h in self.trainer.state.log_history if "loss" in h]

    def story(self) -> str:
        """Per step: the finding codes, whether the update was skipped, whether it moved the
        student; for assertion messages."""
        lines = []
        for step in sorted(self.ledger.changed):
            codes = sorted(
                {f"{f['code']}({f['severity']})" for f in self.findings if f["step"] == step}
            )
            lines.append(
                f"step {step}: skipped={self.ledger.skipped[step]} "
                f"moved={self.ledger.changed[step]} {codes}"
            )
        halt = self.callback.guard.halt
        lines.append(f"halt: {halt.to_dict() if halt else None}")
        return "\n".join(lines)


def run(
    tmp_path,
    flavour="trl",
    *,
    poison=None,
    at=POISON_AT,
    lr=HEALTHY_LR,
    lmbda=1.0,
    max_steps=MAX_STEPS,
    overrides=(),
    spy: list | None = None,
    guard_state: dict | None = None,
    resume_from: Path | None = None,
    temperature: float = 0.9,
) -> Run:
    """Train the tiny student for ``max_steps`` with the guard; ``poison(teacher)`` at step ``at``.

    ``flavour``: ``trl`` (GKDTrainer), ``trl_fused`` (GKDTrainer with
    ``distill_guard_fused_loss``), ``distillation`` (``trl.DistillationTrainer``) or
    ``stand_in`` (test_transformers.py's plain-Trainer GKD). A resume as docs/integrations.md
    shows it: ``guard_state`` loaded without its halt, the Trainer resumed from ``resume_from``."""
    teacher = tiny_qwen3(seed=0)
    student = student_of(teacher)
    ev = tmp_path / "events.jsonl"
    callback = DistillGuardCallback(
        "default",
        overrides=[
            f"events_path={ev}",
            f"run.vocab_size={VOCAB}",
            "alerts.use_wandb=false",
            *overrides,
        ],
    )
    if spy is not None:  # the top-k logprobs each step hands the guard
        judge = callback.guard.on_teacher_scores

        def recording(step, **scores):
            if scores.get("topk_logprobs") is not None:
                spy.append(scores["topk_logprobs"])
            return judge(step, **scores)

        callback.guard.on_teacher_scores = recording
    if guard_state is not None:  # the references and counts, not the halt
        callback.guard.load_state_dict(guard_state, keep_halt=False)
    ledger = UpdateLedger(student, teacher, at=at if poison else None, poison=poison)
    callbacks = [Ledger(ledger, callback), callback]
    common = dict(
        output_dir=str(tmp_path / "out"),
        max_steps=max_steps,
        per_device_train_batch_size=4,
        learning_rate=lr,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )
    if flavour in ("trl", "trl_fused"):
        from datasets import Dataset
        from trl.experimental.gkd import GKDConfig

        args = GKDConfig(
            **common,
            bf16=False,  # TRL's default is bf16 autocast, on CPU too
            gradient_checkpointing=False,  # TRL's default is on
            lmbda=lmbda,
            beta=0.5,
            temperature=temperature,
            max_new_tokens=MAX_NEW_TOKENS,
            max_length=64,
        )
        cls = _fused_gkd_trainer() if flavour == "trl_fused" else _guarded_gkd_trainer()
        trainer = cls(
            model=student,
            teacher_model=teacher,
            args=args,
            train_dataset=Dataset.from_list(chat_rows(completion_len=COMPLETION_WORDS)),
            processing_class=tiny_tokenizer(),
            callbacks=callbacks,
        )
        assert trainer.teacher_model is teacher  # accelerate on CPU hands the module back
    elif flavour == "distillation":
        from datasets import Dataset
        from trl import DistillationConfig

        args = DistillationConfig(
            **common,
            bf16=False,
            gradient_checkpointing=False,
            beta=0.5,
            temperature=temperature,
            max_completion_length=MAX_NEW_TOKENS,
        )
        prompts = [{"prompt": r["messages"][:1]} for r in chat_rows()]
        trainer = _guarded_distillation_trainer()(
            model=student,
            teacher_model=teacher,
            args=args,
            train_dataset=Dataset.from_list(prompts),
            processing_class=tiny_tokenizer(),
            callbacks=callbacks,
        )
        assert trainer.teacher_model is teacher
    else:
        args = transformers.TrainingArguments(**common, remove_unused_columns=False)
        trainer = GuardedTinyGKDTrainer(
            model=student,
            args=args,
            train_dataset=token_rows(),
            teacher_model=teacher,
            callbacks=callbacks,
        )
    trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    return Run(trainer, callback, ledger, ev, tmp_path / "out")


@pytest.fixture(autouse=True)
def _quiet_trl(monkeypatch):
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")


@pytest.fixture(params=["trl", "stand_in"])
def flavour(request):
    if request.param == "trl":
        pytest.importorskip("trl.experimental.gkd")
    return request.param


# ---------------------------------------------------------------------- TRL's two trainers

DISTILLATION_STEPS = 6
"""DistillationTrainer generates every step with the student (about half a second a step on
CPU here): fewer steps than GKD, the same story."""


@pytest.fixture(params=["trl", "distillation"])
def trl_trainer(request):
    """TRL's on-policy distillation trainers: GKDTrainer (``trl.experimental.gkd``) and
    DistillationTrainer (``trl``, which projects the teacher's hidden states itself)."""
    pytest.importorskip("trl.experimental.gkd" if request.param == "trl" else "trl")
    return request.param


def test_healthy_teacher_every_update_applied_and_quiet(tmp_path, caplog, trl_trainer):
    """Silent: no finding at warn or above, no WARNING record, every update applied.

    On DistillationTrainer the tiny student never ends an answer, so every completion is
    clipped at ``max_completion_length`` (``completions/clipped_ratio`` is 1.0, which the
    truncation check rightly reports): that check is off here, and the test checks instead that
    the guard reads the ratio and the entropy TRL logs."""
    caplog.set_level("INFO", logger="distill_guard")
    distillation = trl_trainer == "distillation"
    steps = DISTILLATION_STEPS if distillation else MAX_STEPS
    observed: list[torch.Tensor] = []
    r = run(
        tmp_path,
        trl_trainer,
        max_steps=steps,
        overrides=["checks.truncation.enabled=false"] if distillation else (),
        spy=observed,
    )
    assert r.trainer.state.global_step == steps
    assert not r.callback.guard.halted and r.callback.step_guard.skipped_updates == 0
    assert r.ledger.changed == dict.fromkeys(range(steps), True), r.story()
    assert [e for e in r.log if e.get("severity") in ("warn", "critical")] == [], r.story()
    assert loud(caplog.records) == []
    assert not (r.out / f"checkpoint-{steps}").exists()
    # the guard did look: one vocabulary-wide top-k per step, over the completion tokens only
    assert len(observed) == steps, len(observed)
    completion_tokens = 4 * MAX_NEW_TOKENS  # 4 prompts a step, every completion at its limit
    for topk in observed:
        assert topk.shape[1] == 16 and topk.shape[0] == (
            completion_tokens if distillation else topk.shape[0]
        )
        assert bool((topk[:, 0] > -math.log(VOCAB) + 1.0).all())  # peaked, not uniform over 128
    assert len(r.losses) == steps
    if distillation:
        logged = pick_metrics(r.trainer.state.log_history[0], HF_METRIC_NAMES)
        assert logged[Metric.TRUNCATED_RATIO] == 1.0 and logged[Metric.STUDENT_ENTROPY] > 0.0
        assert max(r.losses) < 0.3 * math.log(2)
    else:
        assert r.callback.step_guard.watching
        assert max(r.losses) < 0.3 * math.log(2)


# ---------------------------------------------------------------------- both trainers


def test_diverging_student_is_not_blamed_on_the_teacher(tmp_path, flavour):
    """A learning rate far too high, a healthy teacher: the JSD sits at its ln 2 ceiling from
    the second step on. The step's teacher scores were checked healthy, so the ceiling is the
    student's doing: a ``student.diverged`` finding skips that update, and 3 consecutive critical
    steps halt with a checkpoint; no teacher reload is asked for and the run never goes on
    skipping updates for ever.

    The TRL run is off-policy here (``lmbda=0``): a saturated tiny student samples one token over
    and over, and the tiny teacher (tied embeddings) also predicts the token it just read, so on
    its own samples the two agree and the JSD stays far from the ceiling."""
    r = run(tmp_path, flavour, lr=DIVERGENT_LR, lmbda=0.0)
    ceiling = 0.95 * math.log(2)
    assert sum(loss >= ceiling for loss in r.losses) >= 2, r.losses  # the scenario holds
    blamed = [f for f in r.findings if f["code"].startswith("teacher.")]
    assert blamed == [], r.story()
    rewakes = [
        e
        for e in r.log
        if e["kind"] == "decision"
        and "rewake" in (e.get("action"), e.get("intended"))
        and "loss.jsd_ceiling" in e.get("codes", [])
    ]
    assert rewakes == [], f"{len(rewakes)} teacher rewake(s) for the ceiling\n{r.story()}"
    critical = [f for f in r.findings if f["severity"] == "critical"]
    assert [f for f in critical if f["code"] == "student.diverged"], r.story()
    first = min(f["step"] for f in critical)
    skipped = [s for s, skip in sorted(r.ledger.skipped.items()) if skip]
    assert all(s - first <= RESPONSE_STEPS for s in skipped), r.story()
    halt = r.callback.guard.halt
    if halt is not None:
        assert halt.step - first <= RESPONSE_STEPS, r.story()
        ckpt = r.out / f"checkpoint-{halt.step + 1}"
        assert (ckpt / GUARD_STATE_FILE).exists(), r.story()


# ---------------------------------------------------------------------- the fused loss


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0], ids=["forward_kl", "jsd", "reverse_kl"])
@pytest.mark.parametrize(
    "reduce",
    [
        dict(),
        dict(labels=False),
        dict(num_items_in_batch=7),
        dict(reduction="sum", temperature=0.7),
    ],
    ids=["batchmean", "no_labels", "num_items", "sum_temperature"],
)
def test_fused_generalized_jsd_loss_is_trls_own(beta, reduce):
    """Value and gradient of ``generalized_jsd_loss`` with ``distill_guard_fused_loss`` equal
    TRL's own: β = 0 forward KL, 1 reverse KL, the labels mask, each reduction."""
    gkd = pytest.importorskip("trl.experimental.gkd")
    fused = object.__new__(_fused_gkd_trainer())  # the method alone; no Trainer is built
    g = torch.Generator().manual_seed(0)
    student = torch.randn(3, 5, 33, generator=g).requires_grad_(True)
    teacher = torch.randn(3, 5, 33, generator=g) * 3
    labels = torch.randint(0, 33, (3, 5), generator=g)
    labels[0, :2] = labels[2, 4] = -100
    kw = dict(beta=beta, temperature=reduce.get("temperature", 1.0))
    kw["labels"] = None if reduce.get("labels") is False else labels
    kw.update({k: v for k, v in reduce.items() if k in ("num_items_in_batch", "reduction")})
    ours = fused.generalized_jsd_loss(student, teacher, **kw)
    (g_ours,) = torch.autograd.grad(ours, student)
    theirs = gkd.GKDTrainer.generalized_jsd_loss(student, teacher, **kw)
    (g_theirs,) = torch.autograd.grad(theirs, student)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(g_ours, g_theirs, atol=1e-6, rtol=1e-4)


def test_fused_loss_on_gkd_matches_trl_and_reads_the_logits_once(tmp_path, caplog, monkeypatch):
    """A healthy GKDTrainer run with the fused loss: each step's loss is what TRL's own loss
    gives on the same logits, every update is applied, nothing is said, and the guard reduced no
    logits itself (its reducer fails if called): the teacher has only the canary."""
    gkd = pytest.importorskip("trl.experimental.gkd")
    from distill_guard.integrations import step_guard

    def second_pass(*args, **kwargs):
        raise AssertionError("the guard read the teacher's logits a second time")

    monkeypatch.setattr(step_guard, "teacher_logprobs_from_logits", second_pass)
    pairs: list[tuple[float, float]] = []
    fused = _fused_gkd_trainer().generalized_jsd_loss

    def compared(self, student_logits, teacher_logits, **kw):
        loss = fused(self, student_logits, teacher_logits, **kw)
        with torch.no_grad():
            own = gkd.GKDTrainer.generalized_jsd_loss(student_logits, teacher_logits, **kw)
        pairs.append((float(loss.detach()), float(own)))
        return loss

    monkeypatch.setattr(_fused_gkd_trainer(), "generalized_jsd_loss", compared)
    caplog.set_level("INFO", logger="distill_guard")
    observed: list[torch.Tensor] = []
    r = run(tmp_path, "trl_fused", spy=observed)
    assert r.trainer.state.global_step == MAX_STEPS
    assert r.ledger.changed == dict.fromkeys(range(MAX_STEPS), True), r.story()
    assert [e for e in r.log if e.get("severity") in ("warn", "critical")] == [], r.story()
    assert loud(caplog.records) == []
    assert len(pairs) == MAX_STEPS
    for ours, theirs in pairs:
        assert ours == pytest.approx(theirs, rel=1e-5, abs=1e-7)
    assert r.losses == pytest.approx([p[0] for p in pairs], rel=1e-5)
    assert not r.callback.step_guard.watching and r.callback.guard.module_canary is not None
    assert len(observed) == MAX_STEPS and all(t.shape[1] == 1 for t in observed)
    assert all(bool((t[:, 0] > -math.log(VOCAB) + 1.0).all()) for t in observed)


def test_fused_loss_on_gkd_zeroed_teacher_takes_no_update(tmp_path):
    r = run(tmp_path, "trl_fused", poison=kill)
    assert r.ledger.poisoned == [], r.story()
    first = [f for f in r.findings if f["code"] == "teacher.uniform"]
    assert first and first[0]["step"] == POISON_AT, r.story()
    assert not [f for f in r.findings if f["step"] < POISON_AT], r.story()
    assert r.callback.guard.halted and r.callback.guard.halt.step == POISON_AT + 2, r.story()
    assert sum(r.ledger.changed.values()) == POISON_AT, r.story()


@pytest.mark.parametrize("declared", [None, 0.9])
def test_gkd_at_another_temperature_than_the_run_declares_trains_nothing(tmp_path, declared):
    """GKDTrainer divides the teacher's logits by its ``temperature`` in the loss. Undeclared,
    that temperature is the run's: the reference is taken at it and a GKD run at 2 is healthy.
    A run that declares 0.9 and trains at 2 consumes a teacher 2× hotter than declared: caught
    at step 0 by the checkpoint's reference, before the first update."""
    pytest.importorskip("trl.experimental.gkd")
    ckpt = tmp_path / "teacher"
    tiny_qwen3(seed=0).save_pretrained(ckpt)
    overrides = [f"teacher_reference={ckpt}"]
    if declared is not None:
        overrides.append(f"run.teacher_temperature={declared}")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
        r = run(tmp_path, "trl", max_steps=4, overrides=overrides, temperature=2.0)
    count = dict(r.callback.guard.summary.count)
    if declared is None:
        assert count == {} and all(r.ledger.changed.values()), count
        assert r.callback.guard.run.teacher_temperature == 2.0
    else:
        assert not any(r.ledger.changed.values()) and r.ledger.poisoned == [], r.ledger.changed
        assert r.callback.guard.summary.first["teacher.reference_mismatch"] == 0, count
