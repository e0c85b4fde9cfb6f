"""What each documented snippet takes from its surroundings, and what running it must do.

A setup fills a :class:`Context`: the names a snippet uses without defining them (the user's
teacher, loader, model), the placeholders it shows (``http://127.0.0.1:30000``, ``/ckpt/teacher``,
``DIR``) with what stands for them here (a reference server on a free port, a tiny model on
disk), and a check of what the snippet did. The snippet itself runs as written.
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from distill_guard.testing.histories import collapsed_history, healthy_history, write_jsonl
from distill_guard.testing.servers import reference_teacher
from distill_guard.testing.tiny import build_tiny_qwen3

URL = "http://127.0.0.1:30000"
"""The server address the docs show."""


@dataclass
class Context:
    cwd: Path
    stack: contextlib.ExitStack
    namespace: dict[str, Any] = field(default_factory=dict)
    substitutions: dict[str, str] = field(default_factory=dict)
    """Placeholder → what stands for it here (whole shell words; substrings of Python code)."""
    check: Callable[[dict[str, Any]], None] = lambda ns: None
    """Runs after the snippet, with its namespace (empty for shell snippets)."""

    def tiny_model(self, vocab_size: int = 512) -> Path:
        path = self.cwd / f"tiny{vocab_size}"
        if not path.exists():
            build_tiny_qwen3(path, vocab_size=vocab_size)
        return path

    def serve(self, **teacher_kwargs: Any) -> str:
        """A reference server over a tiny model, standing for the docs' ``URL``."""
        url, _ = self.stack.enter_context(reference_teacher(self.tiny_model(), **teacher_kwargs))
        self.substitutions[URL] = url
        return url


SETUPS: dict[str, Callable[[Context], None]] = {}


def setup(name: str) -> Callable[[Callable[[Context], None]], Callable[[Context], None]]:
    def register(fn: Callable[[Context], None]) -> Callable[[Context], None]:
        SETUPS[name] = fn
        return fn

    return register


NO_BACKUP = {"enable_memory_saver": True, "enable_cpu_backup": False, "fault": "zeros"}
"""A colocated teacher as SGLang leaves it by default: zeroed weights after every wake."""


def _events(path: Path) -> list[dict[str, Any]]:
    from distill_guard.events import read_events

    return read_events(path)


# ---------------------------------------------------------------------- README.md


class DyingTeacher(torch.nn.Module):
    """A teacher module whose weights are zeroed before its ``healthy + 1``-th batch forward
    (batches of ``batch`` rows; the guard's one-row canary does not count)."""

    def __init__(self, inner: torch.nn.Module, healthy: int = 3, batch: int = 4) -> None:
        super().__init__()
        self.inner, self.healthy, self.batch, self.calls = inner, healthy, batch, 0
        self.config = getattr(inner, "config", None)

    def forward(self, **kw: Any) -> Any:
        from tests.integrations._tiny import kill

        self.calls += kw["input_ids"].shape[0] == self.batch
        if self.calls == self.healthy + 1:
            kill(self.inner)
        return self.inner(**kw)


def _halt_event(path: Path) -> dict[str, Any]:
    (halt,) = [e for e in _events(path) if e["kind"] == "halt"]
    return halt


def _loop_with_a_dying_teacher(ctx: Context) -> None:
    """A plain loop's surroundings: a tiny Qwen3 teacher that dies after three healthy steps, a
    student near it, its optimizer and a loader of 8 batches of 4."""
    from tests.integrations._tiny import student_of, tiny_qwen3, token_batches

    teacher = tiny_qwen3()
    student = student_of(teacher)
    loader = token_batches(8)
    ctx.namespace.update(
        torch=torch,
        loader=loader,
        teacher=DyingTeacher(teacher),
        student=student,
        optimizer=torch.optim.AdamW(student.parameters(), lr=1e-3),
    )


@setup("plain-loop")
def plain_loop(ctx: Context) -> None:
    """The user's loop over a tiny Qwen3 whose teacher dies after three healthy steps."""
    from tests.integrations._tiny import jsd

    _loop_with_a_dying_teacher(ctx)
    ctx.namespace["distill_loss"] = lambda s, t: jsd(s, t, torch.ones(s.shape[:-1]))

    def check(ns: dict[str, Any]) -> None:
        sg = ns["sg"]
        # dead from step 3; the default policy skips twice, then halts
        assert sg.halted and ns["step"] == 5 and sg.skipped_updates == 3
        assert (ctx.cwd / "halt.pt").exists()
        assert "teacher.uniform" in _halt_event(ctx.cwd / "guard.jsonl")["message"]
        warned = [
            e
            for e in _events(ctx.cwd / "guard.jsonl")
            if e["kind"] == "finding" and e["severity"] in ("warn", "critical")
        ]
        assert len(warned) >= 3
        kinds = [e["kind"] for e in _events(ctx.cwd / "guard.jsonl")]
        assert kinds[0] == "attached" and kinds[-1] == "closed"  # the with block closed it
        assert sg.metrics == {
            "guard/findings": float(len(warned)),
            "guard/skipped_updates": 3.0,
            "guard/repairs": 0.0,
            "guard/halted": 1.0,
            "guard/verdict": 2.0,
        }

    ctx.check = check


@setup("live-teacher")
def live_teacher(ctx: Context) -> None:
    """A reference server whose teacher loses its weights at every wake."""
    ctx.serve(**NO_BACKUP)
    ctx.namespace["steps"] = 3

    def check(ns: dict[str, Any]) -> None:
        guard = ns["guard"]
        assert ns["decision"].repaired and not guard.halted
        repairs = [e for e in _events(ctx.cwd / "guard.jsonl") if e["kind"] == "repair.ok"]
        assert len(repairs) == ns["steps"] - 1  # every wake after the first sleep

    ctx.check = check


@setup("build-guard")
def build_guard_strict(ctx: Context) -> None:
    def check(ns: dict[str, Any]) -> None:
        guard = ns["guard"]
        assert guard.run.vocab_size == 151936
        drift = next(c for c in guard.checks if type(c).__name__ == "EntropyDriftCheck")
        assert drift.threshold_sigma == 4
        assert guard.policy.halt_after_critical_steps == 2  # strict, not default's 3

    ctx.check = check


@setup("live-server")
def live_server(ctx: Context) -> None:
    """The CLI against a reference server without weights backup, and a model to serve."""
    from distill_guard.testing.servers import free_port

    ctx.serve(**NO_BACKUP)
    ctx.substitutions["DIR"] = str(ctx.tiny_model())
    ctx.substitutions["30000"] = str(free_port())


@setup("run-history")
def run_history(ctx: Context) -> None:
    """A run's metric history, as Relax logs it (JSONL) and as wandb exports it (CSV)."""
    import csv

    write_jsonl(collapsed_history(), ctx.cwd / "run.jsonl")
    rows = list(healthy_history(100))
    with (ctx.cwd / "run.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["_step", "train/opd_loss", "train/entropy_loss"])
        for r in rows:
            w.writerow([r["train/step"], r["train/loss"], r["train/entropy_loss"]])


# ---------------------------------------------------------------------- docs/integrations.md


@setup("lightning")
def lightning(ctx: Context) -> None:
    """``module``: a LightningModule distilling a tiny Qwen3 whose teacher dies after 3 steps."""
    from tests.integrations._tiny import student_of, tiny_qwen3
    from tests.integrations.test_lightning import Distill

    teacher = tiny_qwen3(seed=0)
    ctx.namespace["module"] = Distill(DyingTeacher(teacher), student_of(teacher))

    def check(ns: dict[str, Any]) -> None:
        guard, trainer = ns["guard"], ns["trainer"]
        assert guard.guard.halt.step == 5 and trainer.global_step == 6  # skip, skip, halt
        assert Path(guard.halt_checkpoint).exists()
        assert "teacher.uniform" in _halt_event(ctx.cwd / "guard.jsonl")["message"]

    ctx.check = check


def _dies_at_batch(teacher: torch.nn.Module, healthy: int, batch: int = 4) -> None:
    """Zero ``teacher`` before the backbone's ``healthy + 1``-th forward of a ``batch``-row
    batch: TRL's trainers run the backbone (GKD through the model, DistillationTrainer through
    its hidden states), the guard's one-row canary does not count."""
    from tests.integrations._tiny import kill

    calls = 0

    def pre(_mod: Any, args: Any, kwargs: dict[str, Any]) -> None:
        nonlocal calls
        ids = kwargs.get("input_ids", args[0] if args else None)
        calls += ids is not None and ids.shape[0] == batch
        if calls == healthy + 1:
            kill(teacher)

    teacher.model.register_forward_pre_hook(pre, with_kwargs=True)


def _trl_common(**kw: Any) -> dict[str, Any]:
    """A CPU run's TrainingArguments, as tests/integrations/test_trl.py sets them."""
    return dict(
        output_dir="out",
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
        bf16=False,  # TRL's default is bf16 autocast, on CPU too
        gradient_checkpointing=False,
        beta=0.5,
        temperature=0.9,
        **kw,
    )


@setup("trl")
def trl(ctx: Context) -> None:
    """``student``, ``teacher`` (zeroed from step 3), ``args`` (a CPU DistillationConfig) and
    ``prompts``; the student's name leads TRL to its tokenizer, as a hub name would."""
    from datasets import Dataset
    from trl import DistillationConfig

    from tests.integrations._tiny import chat_rows, student_of, tiny_qwen3, tiny_tokenizer

    ctx.stack.enter_context(env_var("TRL_EXPERIMENTAL_SILENCE", "1"))
    teacher = tiny_qwen3(seed=0)
    student = student_of(teacher)
    tiny_tokenizer().save_pretrained(ctx.cwd / "student")
    student.config._name_or_path = str(ctx.cwd / "student")
    _dies_at_batch(teacher, healthy=3)
    ctx.namespace.update(
        student=student,
        teacher=teacher,
        args=DistillationConfig(**_trl_common(max_steps=8, max_completion_length=7)),
        prompts=Dataset.from_list([{"prompt": r["messages"][:1]} for r in chat_rows(32)]),
    )

    def check(ns: dict[str, Any]) -> None:
        guard, trainer = ns["guard"], ns["trainer"]
        assert guard.guard.halt.step == 5 and trainer.state.global_step == 6  # skip, skip, halt
        assert (ctx.cwd / "out" / "checkpoint-6" / "distill_guard_state.pt").exists()
        assert "teacher.uniform" in _halt_event(ctx.cwd / "guard.jsonl")["message"]

    ctx.check = check


@setup("trl-resume")
def trl_resume(ctx: Context) -> None:
    """The docs' halted run (a GKD student whose teacher was zeroed at step 4, halted at step 6:
    ``out/checkpoint-7``), then ``guard`` and ``trainer`` for the run resumed on the fixed teacher."""
    from datasets import Dataset
    from trl.experimental.gkd import GKDConfig, GKDTrainer

    from distill_guard.integrations.transformers import (
        DistillGuardCallback,
        GuardedDistillationMixin,
    )
    from tests.integrations._tiny import chat_rows, student_of, tiny_qwen3, tiny_tokenizer

    ctx.stack.enter_context(env_var("TRL_EXPERIMENTAL_SILENCE", "1"))

    class GuardedGKDTrainer(GuardedDistillationMixin, GKDTrainer):
        pass

    def trainer(teacher: torch.nn.Module, guard: DistillGuardCallback) -> Any:
        args = GKDConfig(**_trl_common(max_steps=12, lmbda=1.0, max_new_tokens=7, max_length=64))
        return GuardedGKDTrainer(
            model=student,
            teacher_model=teacher,
            args=args,
            train_dataset=Dataset.from_list(chat_rows(completion_len=6)),
            processing_class=tiny_tokenizer(),
            callbacks=[guard],
        )

    def callback() -> DistillGuardCallback:
        return DistillGuardCallback("default", overrides=["alerts.use_wandb=false"])

    student = student_of(tiny_qwen3(seed=0))
    dying = tiny_qwen3(seed=0)
    _dies_at_batch(dying, healthy=4)
    halted = callback()
    trainer(dying, halted).train()
    assert halted.guard.halt.step == 6 and (ctx.cwd / "out" / "checkpoint-7").is_dir()
    guard = callback()
    ctx.namespace.update(torch=torch, guard=guard, trainer=trainer(tiny_qwen3(seed=0), guard))

    def check(ns: dict[str, Any]) -> None:
        trainer = ns["trainer"]
        assert trainer.state.global_step == 12 and not guard.guard.halted
        # the counts came back with the state, and nothing new was found after the resume
        # (the resumed Trainer's log history starts with the halted run's steps 1-7)
        resumed = [h for h in trainer.state.log_history if h.get("step", 0) > 7 and "loss" in h]
        assert [h["step"] for h in resumed] == list(range(8, 13))
        before = halted.guard.summary.metrics()["guard/findings"]
        assert {h["guard/findings"] for h in resumed} == {before}

    ctx.check = check


@setup("hydra-app")
def hydra_app(ctx: Context) -> None:
    """The app config is data: it must parse (the next snippet composes it)."""


@setup("hydra-callbacks")
def hydra_callbacks(ctx: Context) -> None:
    """``cfg``: the app config of the docs (the ``hydra-app`` block) composed by Hydra."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from tests.docs.snippets import snippets

    (app,) = [s for s in snippets() if s.setup == "hydra-app"]
    conf = ctx.cwd / "conf"
    conf.mkdir()
    (conf / "train.yaml").write_text(app.code)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(str(conf), version_base="1.3"):
            ctx.namespace["cfg"] = compose("train")
    finally:
        GlobalHydra.instance().clear()

    def check(ns: dict[str, Any]) -> None:
        from distill_guard.integrations.lightning import DistillGuardCallback

        (cb,) = [c for c in ns["trainer"].callbacks if isinstance(c, DistillGuardCallback)]
        assert cb.guard.policy.halt_after_critical_steps == 3  # the composed default preset
        assert str(cb.guard.events.path) == "guard.jsonl"

    ctx.check = check


# ---------------------------------------------------------------------- docs/teachers.md


@setup("sglang-http")
def sglang_http(ctx: Context) -> None:
    ctx.serve()

    def check(ns: dict[str, Any]) -> None:
        assert ns["teacher"].vocab_size == 512

    ctx.check = check


@setup("sglang-engine")
def sglang_engine(ctx: Context) -> None:
    """``sglang`` stands in as a module whose ``Engine`` has sglang.Engine's signatures."""
    from distill_guard.teachers import TorchTeacher
    from tests.teachers.test_sglang_engine import FakeEngine

    model = ctx.tiny_model()

    def engine(model_path: str, enable_memory_saver: bool, enable_weights_cpu_backup: bool):
        return FakeEngine(
            TorchTeacher.from_pretrained(
                model_path,
                enable_memory_saver=enable_memory_saver,
                enable_cpu_backup=enable_weights_cpu_backup,
            )
        )

    fake = types.ModuleType("sglang")
    fake.Engine = engine  # type: ignore[attr-defined]
    ctx.stack.enter_context(_module("sglang", fake))
    ctx.namespace["engine"] = engine(str(model), True, True)
    ctx.substitutions["/ckpt/teacher"] = str(model)

    def check(ns: dict[str, Any]) -> None:
        scores = ns["teacher"].score([[1, 2, 3, 4]], top_k=2)
        assert torch.isfinite(torch.as_tensor(scores.token_logprobs[0])).all()

    ctx.check = check


@setup("torch-teacher")
def torch_teacher(ctx: Context) -> None:
    ctx.substitutions["/ckpt/teacher"] = str(ctx.tiny_model())

    def check(ns: dict[str, Any]) -> None:
        teacher = ns["teacher"]
        teacher.release()
        teacher.resume()  # without the backup: zeroed, as SGLang's default leaves it
        assert all(bool((p == 0).all()) for p in teacher.model.parameters())

    ctx.check = check


def _dead_after_wake(ctx: Context) -> Any:
    from distill_guard.teachers import TorchTeacher

    return TorchTeacher.from_pretrained(ctx.tiny_model(), **NO_BACKUP)


@setup("canary")
def canary(ctx: Context) -> None:
    ctx.namespace.update(teacher=_dead_after_wake(ctx), step=0)

    def check(ns: dict[str, Any]) -> None:
        assert "teacher.uniform" in {f.code for f in ns["findings"]}

    ctx.check = check


@setup("repair")
def repair(ctx: Context) -> None:
    import logging

    from distill_guard.live.canary import Canary

    teacher = _dead_after_wake(ctx)
    canary = Canary(length=16, seed=0, top_k=4)
    canary.fingerprint(teacher, 0)
    teacher.release()
    teacher.resume()  # the weights are gone
    ctx.namespace.update(
        teacher=teacher, canary=canary, step=1, log=logging.getLogger("distill_guard.docs")
    )

    def check(ns: dict[str, Any]) -> None:
        outcome = ns["outcome"]
        assert outcome.ok and outcome.attempts == 1
        assert [f.code for f in outcome.findings] == ["teacher.repaired"]

    ctx.check = check


@setup("preflight")
def preflight(ctx: Context) -> None:
    ctx.namespace["teacher"] = _dead_after_wake(ctx)

    def check(ns: dict[str, Any]) -> None:
        codes = [f.code for f in ns["findings"]]
        assert codes.count("config.no_weights_backup") == 2, codes

    ctx.check = check


@contextlib.contextmanager
def env_var(name: str, value: str) -> Any:
    import os

    saved = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved


@contextlib.contextmanager
def _module(name: str, module: types.ModuleType) -> Any:
    saved = sys.modules.get(name)
    sys.modules[name] = module
    try:
        yield module
    finally:
        if saved is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = saved


# ---------------------------------------------------------------------- docs/losses.md


@setup("fused-plain-loop")
def fused_plain_loop(ctx: Context) -> None:
    """The README loop's models and loader, with the fused loss: the teacher dies after three
    healthy steps and the guard sees it from distill_loss's signals."""
    _loop_with_a_dying_teacher(ctx)

    def check(ns: dict[str, Any]) -> None:
        sg = ns["sg"]
        assert sg.halted and ns["step"] == 5 and sg.skipped_updates == 3  # skip, skip, halt
        assert (ctx.cwd / "halt.pt").exists()
        assert "teacher.uniform" in _halt_event(ctx.cwd / "guard.jsonl")["message"]
        assert sg.guard.run.vocab_size == ns["out"].vocab_size

    ctx.check = check


@setup("fused-loss")
def fused_loss(ctx: Context) -> None:
    g = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(16, 512)
    student_logits = head(torch.randn(2, 6, 16, generator=g))
    ctx.namespace.update(
        student_logits=student_logits,
        teacher_logits=torch.randn(2, 6, 512, generator=g) * 2,
        attention_mask=torch.tensor([[1] * 6, [1] * 4 + [0] * 2]),
    )

    def check(ns: dict[str, Any]) -> None:
        m = ns["m"]
        assert m["valid_tokens"] == 10 and 0 < m["loss"] < ns["out"].ceiling
        assert head.weight.grad is not None and bool(head.weight.grad.abs().sum() > 0)

    ctx.check = check
