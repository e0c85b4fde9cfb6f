"""What the test does around each documented snippet, and what running it must do.

A setup fills a :class:`Context`: the placeholders the snippet shows inside string literals
(``http://127.0.0.1:30000``, ``/ckpt/teacher``, ``DIR``) with what stands for them here (a
reference server on a free port, a tiny model on disk), a server, files, variables or a stand-in
module it needs around it, and a check of what the snippet did. It gives the snippet's code no
name: the snippet and the set-up blocks the docs show above it run in a namespace of their own
(``tests/docs/test_snippets.py``), with what the package ships (``distill_guard.testing``).
"""

from __future__ import annotations

import contextlib
import os
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import torch

from distill_guard.testing.histories import collapsed_history, healthy_history, write_jsonl
from distill_guard.testing.servers import reference_teacher
from distill_guard.testing.tiny import build_tiny_qwen3

from .snippets import Snippet

URL = "http://127.0.0.1:30000"
"""The server address the docs show."""
MODEL = "/ckpt/teacher"
"""The model directory the docs show."""


Check = Callable[[dict[str, Any]], None]
"""What a snippet must have done, asked of its namespace after it ran."""


@dataclass
class Context:
    cwd: Path
    stack: contextlib.ExitStack
    snippet: Snippet
    substitutions: dict[str, str] = field(default_factory=dict)
    """Placeholder → what stands for it here (whole shell words; inside Python string literals)."""
    check: Check = lambda ns: None
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

    def model_dir(self) -> Path:
        """A tiny model on disk, standing for the docs' ``MODEL``."""
        self.substitutions[MODEL] = str(self.tiny_model())
        return self.tiny_model()


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


def _halt_event(path: Path) -> dict[str, Any]:
    (halt,) = [e for e in _events(path) if e["kind"] == "halt"]
    return halt


# ---------------------------------------------------------------------- README.md


def _check_the_dying_teacher_halted(ctx: Context, ns: dict[str, Any]) -> None:
    """The loop over ``stand_ins(teacher_dies_after=3)``: dead from step 3, the default policy
    skips twice, then halts at step 5; the loop saved the student and the with block closed the
    event file."""
    sg = ns["sg"]
    assert sg.halted and ns["step"] == 5 and sg.skipped_updates == 3
    assert (ctx.cwd / "halt.pt").exists()
    assert "teacher.uniform" in _halt_event(ctx.cwd / "guard.jsonl")["message"]
    kinds = [e["kind"] for e in _events(ctx.cwd / "guard.jsonl")]
    assert kinds[0] == "attached" and kinds[-1] == "closed"


@setup("plain-loop")
def plain_loop(ctx: Context) -> None:
    """The README loop over the stand-ins, with the package's ``distill_loss``."""

    def check(ns: dict[str, Any]) -> None:
        from distill_guard.losses import distill_loss

        _check_the_dying_teacher_halted(ctx, ns)
        assert ns["distill_loss"] is distill_loss
        sg = ns["sg"]
        warned = [
            e
            for e in _events(ctx.cwd / "guard.jsonl")
            if e["kind"] == "finding" and e["severity"] in ("warn", "critical")
        ]
        assert len(warned) >= 3
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

    def check(ns: dict[str, Any]) -> None:
        guard = ns["guard"]
        assert ns["decision"].repaired and not guard.halted
        repairs = [e for e in _events(ctx.cwd / "guard.jsonl") if e["kind"] == "repair.ok"]
        assert ns["step"] == 2 and len(repairs) == 2  # every wake after the first sleep

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
    """The stand-in LightningModule over a teacher that dies after three healthy steps."""

    def check(ns: dict[str, Any]) -> None:
        guard, trainer = ns["guard"], ns["trainer"]
        assert guard.guard.halt.step == 5 and trainer.global_step == 6  # skip, skip, halt
        assert Path(guard.halt_checkpoint).exists()
        assert "teacher.uniform" in _halt_event(ctx.cwd / "guard.jsonl")["message"]

    ctx.check = check


@setup("trl")
def trl(ctx: Context) -> None:
    """DistillationTrainer over the stand-ins on disk, the teacher zeroed from step 3."""
    ctx.stack.enter_context(env_var("TRL_EXPERIMENTAL_SILENCE", "1"))

    def check(ns: dict[str, Any]) -> None:
        guard, trainer = ns["guard"], ns["trainer"]
        assert guard.guard.halt.step == 5 and trainer.state.global_step == 6  # skip, skip, halt
        assert (ctx.cwd / "out" / "checkpoint-6" / "distill_guard_state.pt").exists()
        assert "teacher.uniform" in _halt_event(ctx.cwd / "guard.jsonl")["message"]

    ctx.check = check


@setup("trl-resume")
def trl_resume(ctx: Context) -> None:
    """The docs' halted run first: the set-up block's own trainer, its teacher zeroed at step 4
    (halted at step 6: ``out/checkpoint-7``), run here in a namespace of its own; then the
    snippet resumes a trainer of that set-up with the teacher as it is on disk."""
    from distill_guard.testing.standins import kill_after

    ctx.stack.enter_context(env_var("TRL_EXPERIMENTAL_SILENCE", "1"))
    halted_run = {"__name__": "__halted_run__"}
    exec(compile(ctx.snippet.prelude, "trl-resume halted run", "exec"), halted_run)  # noqa: S102
    kill_after(halted_run["teacher"], healthy_steps=4)
    halted_run["trainer"].train()
    halted = halted_run["guard"]
    assert halted.guard.halt.step == 6 and (ctx.cwd / "out" / "checkpoint-7").is_dir()
    before = halted.guard.summary.metrics()["guard/findings"]

    def check(ns: dict[str, Any]) -> None:
        guard, trainer = ns["guard"], ns["trainer"]
        assert guard is not halted and trainer.state.global_step == 12 and not guard.guard.halted
        # the counts came back with the state, and nothing new was found after the resume
        # (the resumed Trainer's log history starts with the halted run's steps 1-7)
        resumed = [h for h in trainer.state.log_history if h.get("step", 0) > 7 and "loss" in h]
        assert [h["step"] for h in resumed] == list(range(8, 13))
        assert {h["guard/findings"] for h in resumed} == {before}

    ctx.check = check


@setup("hydra-app")
def hydra_app(ctx: Context) -> None:
    """The app config is data: it must parse (the next snippet composes it)."""


@setup("hydra-callbacks")
def hydra_callbacks(ctx: Context) -> None:
    """The app's ``conf/train.yaml``: the docs' ``hydra-app`` block (its set-up composes it)."""
    from hydra.core.global_hydra import GlobalHydra

    from .snippets import snippets

    (app,) = [s for s in snippets((ctx.snippet.doc,)) if s.setup == "hydra-app"]
    (ctx.cwd / "conf").mkdir()
    (ctx.cwd / "conf" / "train.yaml").write_text(app.code)
    GlobalHydra.instance().clear()
    ctx.stack.callback(GlobalHydra.instance().clear)

    def check(ns: dict[str, Any]) -> None:
        from distill_guard.integrations.lightning import DistillGuardCallback

        assert ns["cfg"].guard.events_path == "guard.jsonl"
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


@setup("replicas")
def replicas(ctx: Context) -> None:
    """Four reference replicas behind the real sglang-router, the second without the weights
    backup (it wakes zeroed at every wake); the docs' router URL and checkpoint stand for them."""
    import pytest

    pytest.importorskip("sglang_router", reason="pip install 'distill_guard[router]'")
    from distill_guard.testing.router import reference_replicas, sglang_router

    served = ctx.stack.enter_context(reference_replicas(ctx.model_dir(), [True, False, True, True]))
    ctx.substitutions[URL] = ctx.stack.enter_context(sglang_router([r.url for r in served]))

    def check(ns: dict[str, Any]) -> None:
        woke = ns["woke"]
        assert ns["step"] == 2 and woke.decision.action.value != "halt"
        zeroed = next(w for w in woke.replicas if w.url == served[1].url)  # the router's order
        assert [m.value for m in zeroed.moves] == ["quarantine", "repair", "readmit"]
        assert not any(w.moves for w in woke.replicas if w is not zeroed)
        assert sorted(ns["teacher"].serving) == sorted(r.url for r in served)
        assert all(r.server.dead_reason is None for r in served)

    ctx.check = check


@setup("replicas-probe")
def replicas_probe(ctx: Context) -> None:
    """Two reference replicas (the second without the weights backup) behind the real router."""
    import pytest

    pytest.importorskip("sglang_router", reason="pip install 'distill_guard[router]'")
    from distill_guard.testing.router import reference_replicas, sglang_router

    served = ctx.stack.enter_context(reference_replicas(ctx.tiny_model(), [True, False]))
    for i, r in enumerate(served, start=1):
        ctx.substitutions[f"http://127.0.0.1:3000{i}"] = r.url
    ctx.substitutions[URL] = ctx.stack.enter_context(sglang_router([r.url for r in served]))


@setup("mopd-routes")
def mopd_routes(ctx: Context) -> None:
    """Two routes over two different tiny checkpoints, each behind its own real sglang-router:
    math's two replicas (the second wakes zeroed at every wake), code's one."""
    import pytest

    pytest.importorskip("sglang_router", reason="pip install 'distill_guard[router]'")
    from distill_guard.testing.router import reference_replicas, sglang_router

    ckpts = {}
    for name, seed in (("math", 0), ("code", 1)):
        ckpts[name] = build_tiny_qwen3(ctx.cwd / f"{name}-teacher", vocab_size=512, seed=seed)
        ctx.substitutions[f"/ckpt/{name}-teacher"] = str(ckpts[name])
    math = ctx.stack.enter_context(reference_replicas(ckpts["math"], [True, False]))
    code = ctx.stack.enter_context(reference_replicas(ckpts["code"], [True]))
    routers = {"30000": math, "31000": code}
    for port, served in routers.items():
        router = ctx.stack.enter_context(sglang_router([r.url for r in served]))
        ctx.substitutions[f"http://127.0.0.1:{port}"] = router

    def check(ns: dict[str, Any]) -> None:
        woke, routes = ns["woke"], ns["routes"]
        assert ns["step"] == 2 and woke.decision.action.value == "alert" and not routes.down
        zeroed = next(w for w in woke.routes["math"].replicas if w.url == math[1].url)
        assert [m.value for m in zeroed.moves] == ["quarantine", "repair", "readmit"]
        assert [r.moves for r in woke.routes["code"].replicas] == [[]]
        assert [r.route for r in ns["receipts"]] == ["math", "code"]
        assert list(ns["admitted"]) == [0, 1]
        assert all(r.server.dead_reason is None for r in math + code)

    ctx.check = check


@setup("sglang-engine")
def sglang_engine(ctx: Context) -> None:
    """``sglang`` stands in as a module whose ``Engine`` has sglang.Engine's signatures over a
    TorchTeacher (sglang is not installed here; the docs say so)."""
    from distill_guard.teachers import TorchTeacher
    from distill_guard.testing.engine_standin import EngineStandIn

    def engine(
        model_path: str,
        enable_memory_saver: bool = False,
        enable_weights_cpu_backup: bool = False,
        **server_args: Any,
    ) -> EngineStandIn:
        return EngineStandIn(
            TorchTeacher.from_pretrained(
                model_path,
                enable_memory_saver=enable_memory_saver,
                enable_cpu_backup=enable_weights_cpu_backup,
            )
        )

    fake = types.ModuleType("sglang")
    fake.Engine = engine  # type: ignore[attr-defined]
    ctx.stack.enter_context(mock.patch.dict(sys.modules, {"sglang": fake}))
    ctx.model_dir()

    def check(ns: dict[str, Any]) -> None:
        assert isinstance(ns["engine"], EngineStandIn)
        scores = ns["teacher"].score([[1, 2, 3, 4]], top_k=2)
        assert torch.isfinite(torch.as_tensor(scores.token_logprobs[0])).all()

    ctx.check = check


def _on_a_model_dir(name: str) -> Callable[[Check], Check]:
    """The setup of a snippet that loads the docs' ``MODEL``: a tiny model on disk stands for it,
    and the decorated function checks what the snippet did."""

    def register(check: Check) -> Check:
        def on_a_model_dir(ctx: Context) -> None:
            ctx.model_dir()
            ctx.check = check

        setup(name)(on_a_model_dir)
        return check

    return register


@_on_a_model_dir("torch-teacher")
def _zeroed_after_a_wake(ns: dict[str, Any]) -> None:
    teacher = ns["teacher"]
    teacher.release()
    teacher.resume()  # without the backup: zeroed, as SGLang's default leaves it
    assert all(bool((p == 0).all()) for p in teacher.model.parameters())


@_on_a_model_dir("canary")
def _canary_caught_it(ns: dict[str, Any]) -> None:
    assert ns["step"] == 0 and "teacher.uniform" in {f.code for f in ns["findings"]}


@_on_a_model_dir("repair")
def _repaired_at_once(ns: dict[str, Any]) -> None:
    outcome = ns["outcome"]
    assert outcome.ok and outcome.attempts == 1
    assert [f.code for f in outcome.findings] == ["teacher.repaired"]


@_on_a_model_dir("preflight")
def _no_backup_twice(ns: dict[str, Any]) -> None:
    codes = [f.code for f in ns["findings"]]
    assert codes.count("config.no_weights_backup") == 2, codes


def env_var(name: str, value: str) -> Any:
    """``name=value`` in the environment while the context is open (the old value after)."""
    return mock.patch.dict(os.environ, {name: value})


# ---------------------------------------------------------------------- docs/losses.md


@setup("fused-plain-loop")
def fused_plain_loop(ctx: Context) -> None:
    """The README loop's stand-ins, with the fused loss: the teacher dies after three healthy
    steps and the guard sees it from distill_loss's signals."""

    def check(ns: dict[str, Any]) -> None:
        _check_the_dying_teacher_halted(ctx, ns)
        assert ns["sg"].guard.run.vocab_size == ns["out"].vocab_size

    ctx.check = check


@setup("hidden-plain-loop")
def hidden_plain_loop(ctx: Context) -> None:
    """The fused loop on hidden states and lm heads: the same dying teacher, the same halt."""

    def check(ns: dict[str, Any]) -> None:
        _check_the_dying_teacher_halted(ctx, ns)
        assert ns["out"].vocab_size == ns["student"].lm_head.weight.shape[0]

    ctx.check = check


@setup("fused-loss")
def fused_loss(ctx: Context) -> None:
    def check(ns: dict[str, Any]) -> None:
        m, head = ns["m"], ns["head"]
        assert m["valid_tokens"] == 10 and 0 < m["loss"] < ns["out"].ceiling
        assert head.weight.grad is not None and bool(head.weight.grad.abs().sum() > 0)

    ctx.check = check


# ---------------------------------------------------------------------- docs/after-a-halt.md


def _resumed_records(path: Path) -> list[dict[str, Any]]:
    """The event file's records from the resume on: from its ``halt_lifted`` record (the
    resumed guard took the halted run's state without its halt) to the resumed run's ``closed``."""
    records = _events(path)
    lifted = [i for i, e in enumerate(records) if e["kind"] == "halt_lifted"]
    assert len(lifted) == 1, [e["kind"] for e in records]
    resumed = records[lifted[0] :]
    assert resumed[-1]["kind"] == "closed", [e["kind"] for e in resumed]
    return resumed


def _nothing_new(path: Path) -> list[dict[str, Any]]:
    """The resumed run found nothing and did not halt; its records."""
    resumed = _resumed_records(path)
    assert [e for e in resumed if e["kind"] in ("finding", "halt", "checkpoint")] == []
    return resumed


def _broken_teachers_are_caught(state: dict[str, Any], step: int) -> None:
    """The page's claim about its check: held to the saved state, a teacher still zeroed is
    ``teacher.uniform`` and one turned to garbage ``teacher.fingerprint_mismatch``."""
    from distill_guard import build_guard
    from distill_guard.testing.standins import tiny_random_qwen3, zero_weights
    from tests.integrations._tiny import garble

    for poison, code in (
        (zero_weights, "teacher.uniform"),
        (garble, "teacher.fingerprint_mismatch"),
    ):
        teacher = tiny_random_qwen3()
        poison(teacher)
        guard = build_guard("default")
        guard.load_state_dict(state, keep_halt=False)
        assert code in {f.code for f in guard.watch_module_teacher(teacher).check(step)}, code


@setup("after-halt-plain")
def after_halt_plain(ctx: Context) -> None:
    """The README loop's stand-ins halted at step 5, checked on the rebuilt teacher, and resumed
    for steps 6 and 7 with nothing new."""

    def check(ns: dict[str, Any]) -> None:
        assert ns["first"]["code"] == "teacher.uniform" and ns["first"]["step"] == 3
        assert ns["halt"]["step"] == 5 and ns["saved"]["step"] == 5
        assert ns["findings"] == []
        sg = ns["sg"]
        assert ns["step"] == 7 and not sg.halted and sg.skipped_updates == 3  # the halted run's
        kinds = [e["kind"] for e in _nothing_new(ctx.cwd / "guard.jsonl")]
        assert kinds[:2] == ["halt_lifted", "attached"]
        _broken_teachers_are_caught(ns["saved"]["guard"], 6)

    ctx.check = check


@setup("after-halt-trl")
def after_halt_trl(ctx: Context) -> None:
    """GKDTrainer on the stand-ins, halted at step 6 (``out/checkpoint-7``), checked on the
    reloaded teacher, and resumed to step 12 with nothing new."""
    ctx.stack.enter_context(env_var("TRL_EXPERIMENTAL_SILENCE", "1"))

    def check(ns: dict[str, Any]) -> None:
        assert ns["halt"]["step"] == 6 and ns["checkpoint"]["path"].endswith("checkpoint-7")
        assert ns["checkpoint"]["teacher_left_out"]["in_checkpoint"] is False
        assert ns["findings"] == []
        guard, trainer = ns["guard"], ns["trainer"]
        assert trainer.state.global_step == 12 and not guard.guard.halted
        _nothing_new(ctx.cwd / "guard.jsonl")

    ctx.check = check


@setup("after-halt-lightning")
def after_halt_lightning(ctx: Context) -> None:
    """The stand-in module halted at step 5, its checkpoint without the teacher, resumed by
    ``trainer.fit(module, ckpt_path=...)`` alone to step 8 with nothing new."""

    def check(ns: dict[str, Any]) -> None:
        assert ns["halt"]["step"] == 5
        left_out = ns["state"]["teacher_left_out"]
        assert left_out["modules"] == ["teacher"] and left_out["tensors"] == 25
        assert {k.split(".")[0] for k in ns["saved"]["state_dict"]} == {"student"}
        assert ns["findings"] == []
        guard, trainer = ns["guard"], ns["trainer"]
        assert trainer.global_step == 8 and not guard.guard.halted
        resumed = _nothing_new(ctx.cwd / "guard.jsonl")
        (kept,) = [e for e in resumed if e["kind"] == "teacher_kept"]
        assert kept["checkpoint_left_out"] == left_out
        _broken_teachers_are_caught(ns["state"]["guard"], 6)

    ctx.check = check


RELAX_EVENTS = "/save/opd/distill_guard"
"""The directory of the Relax launchers' event files the docs show (``$SAVE_DIR/distill_guard``)."""


@setup("after-halt-relax")
def after_halt_relax(ctx: Context) -> None:
    """The Relax test harness (Relax's step order, the guard's hooks, two gloo trainer ranks, the
    reference server as the teacher) with the teacher's weights backup off: the guard halts
    before rollout 0; the snippet reads the event files it wrote."""
    from distill_guard.testing.tiny import build_tiny_qwen3
    from tests.conftest import _forkserver_context
    from tests.integrations import relax_harness

    teacher = build_tiny_qwen3(
        ctx.cwd / "teacher", vocab_size=relax_harness.VOCAB, embed_std=0.3, max_positions=128
    )
    result = relax_harness.run(
        ctx.cwd, teacher, line="studio", backup=False, steps=1, context=_forkserver_context()
    )
    ctx.substitutions[RELAX_EVENTS] = str(result["out"])

    def check(ns: dict[str, Any]) -> None:
        records = ns["records"]
        assert {e["rank"] for e in records if e["kind"] == "halt"} == {0, 1}
        (first, *_) = [e for e in records if e["kind"] == "finding"]
        assert first["code"] == "teacher.uniform" and first["step"] == 0
        checkpoints = [e for e in records if e["kind"] == "checkpoint"]
        assert len(checkpoints) == relax_harness.RANKS
        assert all(e["teacher_left_out"]["in_checkpoint"] is False for e in checkpoints)

    ctx.check = check


def _a_teacher_with_its_backup(ctx: Context) -> None:
    """A reference server whose teacher keeps its weights across sleep and wake: the fixed one."""
    ctx.serve(enable_memory_saver=True, enable_cpu_backup=True)


setup("after-halt-relax-check")(_a_teacher_with_its_backup)
setup("after-halt-slime-check")(_a_teacher_with_its_backup)


@setup("after-halt-relax-probe")
def after_halt_relax_probe(ctx: Context) -> None:
    _a_teacher_with_its_backup(ctx)

    def check(ns: dict[str, Any]) -> None:
        report = ns["report"]
        assert report.ok and not report.repaired and len(report.cycles) == 3

    ctx.check = check
