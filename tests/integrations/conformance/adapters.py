"""One driver per adapter behind one protocol (:class:`Driver`), and what a run left (:class:`Outcome`).

A driver runs its adapter's own training loop in the host framework's real order of events, with
the teacher poisoned mid-run (``kill``: every weight zero, a uniform teacher; ``garble``: noise at
each tensor's own scale, which only the canary's fingerprint tells) or not, and resumes a halted
run. What counts is what the trainer consumed: ``Outcome.poisoned`` lists the optimizer steps that
moved the student while the teacher scores they used were the dead teacher's.

In-process adapters (:class:`InProcess`): ``STEPS`` optimizer steps of a tiny Qwen3 student near
its teacher; the teacher is poisoned at the start of step ``AT`` and stays bad
(:class:`~tests.integrations._tiny.UpdateLedger`, which also records which steps moved the
student). The default policy asks for a rewake that nothing can carry out on an in-process module,
so each dead step's update is dropped, and the third consecutive one halts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest
import torch

from .._tiny import VOCAB, UpdateLedger, events, jsd, student_of, tiny_qwen3, token_batches

STEPS, AT = 8, 3
Poison = Callable[[torch.nn.Module], None]


@dataclasses.dataclass
class Outcome:
    """What one run left, the same for every adapter."""

    root: Path
    """Where the run wrote (its event file, its checkpoints)."""
    moved: dict[int, bool]
    """Per optimizer step the host went through: did the student's parameters change?"""
    poisoned: list[int]
    """Steps whose update moved the student while the scores it used were the dead teacher's."""
    events: list[dict]
    halt_step: int | None
    saved: list[Path]
    """The checkpoints the adapter wrote (found on disk, not assumed)."""
    state: dict | None
    """The guard's state a resume starts from (read from the halt checkpoint)."""
    host_steps: int
    """The host's own step counter at the end (in the checkpoint, when there is one)."""
    skipped: int
    """Updates the guard dropped over the run (restored ones included)."""
    count: dict[str, int]
    """The guard's findings per code over the run (restored ones included)."""
    losses: list[float] | None = None
    vocab_size: int | None = None

    @property
    def findings(self) -> list[dict]:
        return [e for e in self.events if e["kind"] == "finding"]

    @property
    def loud(self) -> list[dict]:
        """Findings at warn or above."""
        return [f for f in self.findings if f["severity"] in ("warn", "critical")]

    @property
    def halts(self) -> list[dict]:
        return [e for e in self.events if e["kind"] == "halt"]

    def story(self) -> str:
        """Per step: moved or not, and the findings; for assertion messages."""
        lines = [
            f"step {s}: moved={m} "
            f"{sorted({(f['code'], f['severity']) for f in self.findings if f['step'] == s})}"
            for s, m in sorted(self.moved.items())
        ]
        lines.append(f"halt: {self.halt_step} {[h.get('message') for h in self.halts]}")
        return "\n".join(lines)


class Driver(Protocol):
    name: str
    steps: int
    """Optimizer steps of a full run."""
    at: int
    """The step whose teacher scores are the first dead ones."""
    dead_steps: int
    """Dead steps the default policy takes to halt: the halt is at ``at + dead_steps - 1``."""
    halt_records: int
    """``halt`` records a halt writes (one per process that stops)."""
    records_checkpoint: bool
    """Whether the adapter writes a ``checkpoint`` record for its halt checkpoint."""
    resumes_where_halted: bool
    """Whether the resumed run goes on from the halted step (else from step 0)."""

    def run(
        self,
        root: Path,
        poison: Poison | None = None,
        *,
        at: int | None = None,
        reference: bool = False,
    ) -> Outcome:
        """A full run; ``poison`` applied to the teacher at step ``at`` (the driver's own if
        None; it stays bad). ``reference``: the guard gets the teacher's reference from its
        checkpoint (``teacher_reference``), as docs/invariants.md §3.1 says to run."""

    def resume(self, root: Path, halted: Outcome, poison: Poison | None = None) -> Outcome:
        """Load ``halted.state`` without its halt (``load_state_dict(state, keep_halt=False)``)
        onto a fixed teacher and go on to the end; ``poison`` applied to it at the first resumed
        step (a teacher still dead: only the state's references can tell at once)."""

    def checkpoint(self, halted: Outcome) -> list[Path]:
        """The checkpoints the adapter's docs promise for ``halted.halt_step``."""


def zeroed_tensors(paths: list[Path]) -> list[str]:
    """Where the checkpoints hold an all-zero floating tensor of more than one element: a zeroed
    teacher's weights (no student, optimizer or guard state holds one). Every file of a
    checkpoint directory is read: torch files and safetensors."""
    found: list[str] = []
    for path in paths:
        for file in sorted(path.rglob("*")) if path.is_dir() else [path]:
            found += [f"{file.name}:{k}" for k in _zeroed(_tensors_of(file))]
    return found


def _tensors_of(file: Path) -> Any:
    if file.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(file)
    if file.suffix in (".pt", ".pth", ".ckpt", ".bin"):
        return torch.load(file, weights_only=False, map_location="cpu")
    return None


def _zeroed(obj: Any, key: str = "") -> Iterator[str]:
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point() and obj.numel() > 1 and not bool(obj.any()):
            yield key
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _zeroed(v, f"{key}.{k}" if key else str(k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _zeroed(v, f"{key}[{i}]")


def teacher_reference(root: Path) -> list[str]:
    """The override giving the guard the teacher's reference from its checkpoint: the in-process
    drivers' teacher (``tiny_qwen3()``, seed 0) written to ``root/teacher``, as a user's teacher
    is loaded from one."""
    path = root / "teacher_checkpoint"
    if not (path / "config.json").exists():
        tiny_qwen3().save_pretrained(path)
    return [f"teacher_reference={path}"]


def _overrides(events_path: Path) -> list[str]:
    return [f"events_path={events_path}", f"run.vocab_size={VOCAB}", "alerts.use_wandb=false"]


class InProcess:
    """The teacher is a module in the trainer's process; ``UpdateLedger`` poisons it at ``AT``."""

    steps, at, dead_steps, halt_records = STEPS, AT, 3, 1
    records_checkpoint = resumes_where_halted = True

    @staticmethod
    def outcome(root, ledger, guard, saved, state, host_steps, losses=None) -> Outcome:
        halt = guard.halt
        return Outcome(
            root,
            moved=dict(ledger.changed),
            poisoned=ledger.poisoned,
            events=events(guard.events.path),
            halt_step=halt.step if halt else None,
            saved=saved,
            state=state,
            host_steps=host_steps,
            skipped=guard.summary.skipped_updates,
            count=dict(guard.summary.count),
            losses=losses,
            vocab_size=guard.run.vocab_size,
        )


class PlainLoop(InProcess):
    """``distill_guard.StepGuard`` in the README's loop, given the teacher (``teacher=``: its
    canary). The loop breaks on ``sg.halted`` after saving, as the docs' loop does
    (``halt.pt``); here the save also holds the optimizer, the step and the guard's state, which
    the resume loads. The plain loop writes no ``checkpoint`` record: the save is the user's."""

    name = "plain"
    records_checkpoint = False

    def run(
        self,
        root: Path,
        poison: Poison | None = None,
        saved: dict | None = None,
        *,
        at: int | None = None,
        reference: bool = False,
    ) -> Outcome:
        from distill_guard import StepGuard

        teacher = tiny_qwen3()
        student = student_of(teacher)
        optimizer = torch.optim.AdamW(student.parameters(), lr=1e-3)
        start = 0 if saved is None else saved["step"] + 1  # a resume goes on after the halt
        at = (self.at if at is None else at) if saved is None else start
        ledger = UpdateLedger(student, teacher, at=at if poison else None, poison=poison)
        overrides = [f"events_path={root / 'guard.jsonl'}", "alerts.use_wandb=false"]
        overrides += teacher_reference(root) if reference else []
        sg = StepGuard("default", overrides, teacher=teacher)  # V learnt from the logits
        losses: list[float] = []
        if saved is not None:
            student.load_state_dict(saved["student"])
            optimizer.load_state_dict(saved["optimizer"])
            sg.guard.load_state_dict(saved["guard"], keep_halt=False)
        with sg:
            for step, batch in list(enumerate(token_batches(self.steps)))[start:]:
                ledger.begin(step)
                with torch.no_grad():
                    t_logits = teacher(**batch).logits
                sg.observe_teacher_logits(t_logits, mask=batch["attention_mask"])
                loss = jsd(student(**batch).logits, t_logits, batch["attention_mask"])
                loss.backward()
                ledger.end(not sg.optimizer_step(optimizer, step))
                sg.after_update(step, {"loss": loss.item()})
                losses.append(loss.item())
                if sg.halted:
                    state = {"student": student.state_dict(), "optimizer": optimizer.state_dict()}
                    torch.save(
                        {**state, "step": step, "guard": sg.guard.state_dict()}, self._pt(root)
                    )
                    break
        found = sorted(root.glob(self._pt(root).name))
        ckpt = torch.load(found[0], weights_only=False) if found else {}
        return self.outcome(
            root, ledger, sg.guard, found, ckpt.get("guard"), ckpt.get("step", step) + 1, losses
        )

    def resume(self, root: Path, halted: Outcome, poison: Poison | None = None) -> Outcome:
        return self.run(root, poison, saved=torch.load(halted.saved[0], weights_only=False))

    def checkpoint(self, halted: Outcome) -> list[Path]:
        return [self._pt(halted.root)]

    @staticmethod
    def _pt(root: Path) -> Path:
        return root / "halt.pt"


@contextlib.contextmanager
def _trl_quiet() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
        yield


class HFTrainer(InProcess):
    """A ``transformers.Trainer`` subclass with ``GuardedDistillationMixin`` and
    ``callbacks=[DistillGuardCallback(...)]``, as docs/integrations.md shows it, driven by
    ``test_trl.run`` (its ``Ledger`` callback poisons the teacher at ``on_step_begin``, before
    anything of the step runs). The halt checkpoint is ``checkpoint-N`` with ``N`` the Trainer's
    ``global_step`` (dropped updates included), the guard's state in ``distill_guard_state.pt``;
    the resume is the docs' ``trl-resume``: that state without its halt, and
    ``trainer.train(resume_from_checkpoint=...)`` on a fresh, healthy teacher.

    ``flavour``: ``stand_in`` (test_transformers.py's plain-Trainer GKD: the teacher's forward in
    ``compute_loss``), ``trl`` (``trl.experimental.gkd.GKDTrainer``), ``distillation``
    (``trl.DistillationTrainer``, which projects the teacher's hidden states itself)."""

    def __init__(self, name: str, flavour: str, needs: str, overrides: tuple[str, ...] = ()):
        self.name, self.flavour, self.needs, self.overrides = name, flavour, needs, overrides

    def run(
        self,
        root: Path,
        poison: Poison | None = None,
        *,
        at: int | None = None,
        reference: bool = False,
        **resume: Any,
    ):
        at = self.at if at is None else at
        overrides = (*self.overrides, *(teacher_reference(root) if reference else []))
        with _trl_quiet():
            pytest.importorskip(self.needs)
            from distill_guard.integrations.transformers import GUARD_STATE_FILE

            from .. import test_trl

            r = test_trl.run(
                root,
                self.flavour,
                poison=poison,
                at=at,
                max_steps=self.steps,
                overrides=overrides,
                **resume,
            )
        saved = sorted(r.out.glob("checkpoint-*"))
        state, host_steps = None, r.trainer.state.global_step
        if saved:  # what the checkpoint itself holds: the guard's state, the Trainer's step
            ckpt = saved[-1]
            if (ckpt / GUARD_STATE_FILE).exists():
                state = torch.load(ckpt / GUARD_STATE_FILE, weights_only=False)
            host_steps = json.loads((ckpt / "trainer_state.json").read_text())["global_step"]
        return self.outcome(root, r.ledger, r.callback.guard, saved, state, host_steps, r.losses)

    def resume(self, root: Path, halted: Outcome, poison: Poison | None = None) -> Outcome:
        resume = dict(guard_state=halted.state, resume_from=halted.saved[0])
        return self.run(root, poison, at=halted.host_steps, **resume)

    def checkpoint(self, halted: Outcome) -> list[Path]:
        return [halted.root / "out" / f"checkpoint-{halted.halt_step + 1}"]


@functools.cache
def _lightning_ledger() -> type:
    pl = pytest.importorskip("lightning.pytorch")

    class Ledger(pl.Callback):
        """Drives an ``UpdateLedger`` from Lightning's batch events (listed before the guard)."""

        def __init__(self, ledger: UpdateLedger, guard: Any, losses: list[float]):
            self.ledger, self.guard, self.losses = ledger, guard, losses

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.ledger.begin(trainer.global_step)
            self.skips = self.guard.step_guard.skipped_updates

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.ledger.end(self.guard.step_guard.skipped_updates > self.skips)
            self.losses.append(float(outputs["loss"]))

    return Ledger


class Lightning(InProcess):
    """``distill_guard.integrations.lightning.DistillGuardCallback`` in a CPU ``pl.Trainer``
    around test_lightning.py's ``Distill`` module (the teacher in ``pl_module.teacher``, watched by
    a forward hook). The halt checkpoint is the guard's ``trainer.save_checkpoint`` to
    ``checkpoints/distill_guard-halt-step=N.ckpt``, the guard's state in its callback state.

    Resume: ``trainer.fit(module, ckpt_path=<halt checkpoint>)`` on a module built as the run
    builds it (a healthy teacher), and nothing else, as docs/after-a-halt.md shows it. The halt
    checkpoint holds none of the teacher's weights, so the teacher keeps its own, and the
    callback's ``load_state_dict`` takes the guard's state without its halt."""

    name = "lightning"

    def run(
        self,
        root: Path,
        poison: Poison | None = None,
        halted: Outcome | None = None,
        *,
        at: int | None = None,
        reference: bool = False,
    ):
        from distill_guard.integrations.lightning import DistillGuardCallback

        from ..test_lightning import Distill, cpu_trainer

        Ledger = _lightning_ledger()
        at = (self.at if at is None else at) if halted is None else halted.host_steps
        teacher = tiny_qwen3(seed=0)
        module = Distill(teacher, student_of(teacher))
        ledger = UpdateLedger(module.student, teacher, at=at if poison else None, poison=poison)
        overrides = _overrides(root / "events.jsonl") + (
            teacher_reference(root) if reference else []
        )
        cb = DistillGuardCallback("default", overrides=overrides)
        losses: list[float] = []
        callbacks = [Ledger(ledger, cb, losses), cb]
        trainer = cpu_trainer(root, callbacks, max_steps=self.steps)
        trainer.fit(module, ckpt_path=halted.saved[0] if halted is not None else None)
        reported = [Path(cb.halt_checkpoint)] if cb.halt_checkpoint else []
        saved = sorted({*(root / "checkpoints").glob("*"), *reported})  # on disk, or said so
        ckpt = torch.load(saved[-1], weights_only=False) if saved else {}
        state = next(
            (v["guard"] for k, v in ckpt.get("callbacks", {}).items() if "DistillGuard" in k), None
        )
        host_steps = ckpt.get("global_step", trainer.global_step)
        return self.outcome(root, ledger, cb.guard, saved, state, host_steps, losses)

    def resume(self, root: Path, halted: Outcome, poison: Poison | None = None) -> Outcome:
        return self.run(root, poison, halted=halted)

    def checkpoint(self, halted: Outcome) -> list[Path]:
        return [halted.root / "checkpoints" / f"distill_guard-halt-step={halted.halt_step}.ckpt"]


class RelaxHarness:
    """The Relax hooks in Relax's real step order (``tests/integrations/relax_harness.py``, the
    current redai-studio line, its default gates and ``DISTILL_GUARD_ON_DEAD_TEACHER=halt``): a
    rollout process scores with the colocated teacher behind the SGLang-protocol reference server,
    two gloo trainer ranks consume the queued copy; a poisoned update is a rank's optimizer step
    that moved its student on queued values differing from the never-slept teacher's.

    Mid-run death: the harness's own "dead teacher" is a wake without the weights backup, which is
    dead from the first wake on. Here the teacher runs with the backup, and its wake before rollout
    ``at`` (Relax's ``update_weights()`` → ``/resume_memory_occupation``) leaves the weights
    poisoned (the same ``kill`` / ``garble`` as the other adapters, right after the real resume,
    on the server's side); the backup then keeps the poisoned weights, so the teacher stays dead.
    The live teacher could be repaired, but the default on a dead wake is ``halt``: every rank
    checkpoints through the run's save function and stops before training rollout ``at``.

    Resume: the Relax integration keeps its guard's state in the rollout process (no state file),
    and the harness starts its trainer ranks fresh at rollout 0 (it cannot load their
    checkpoint). So the resume is the closest the harness can express: the halted rollout gate's
    state, loaded with ``keep_halt=False`` into the relaunched run's gate (the teacher fixed: with
    its backup, never poisoned); its canary reference is the halted run's."""

    name = "relax"
    at, dead_steps = 1, 1
    records_checkpoint, resumes_where_halted = True, False

    def __init__(self, teacher_dir: Path, context: Any = None):
        """``context``: where the trainer ranks are started (the session's fork server is the
        fastest: ``tests/conftest.py::forkserver``)."""
        from .. import relax_harness

        self.harness = relax_harness
        self.teacher_dir, self.context = teacher_dir, context
        self.steps = relax_harness.STEPS
        self.halt_records = 1 + relax_harness.RANKS  # the rollout gate's, one per trainer rank

    def run(
        self,
        root: Path,
        poison: Poison | None = None,
        state: dict | None = None,
        *,
        at: int | None = None,
        reference: bool = False,
        on_dead: str = "halt",
    ) -> Outcome:
        from distill_guard.integrations import relax
        from distill_guard.teachers import TorchTeacher

        at = (self.at if at is None else at) if state is None else 0  # a relaunch: rollout 0
        env = {}
        if reference:  # the teacher's own checkpoint (the server's model_path), read here
            base = f"run.vocab_size={self.harness.VOCAB} alerts.use_wandb=false repair.backoff_s=0"
            env["DISTILL_GUARD_OVERRIDES"] = f"{base} teacher_reference=auto"
        gates = []
        configure, resume = relax.configure, TorchTeacher.resume
        wakes = 0

        def configured(*args: Any, **kwargs: Any) -> Any:
            gate = configure(*args, **kwargs)
            if state is not None:
                gate.guard.load_state_dict(state, keep_halt=False)
            gates.append(gate)
            return gate

        def dying_resume(teacher: Any, tags: Any = None) -> None:
            nonlocal wakes
            resume(teacher, tags)
            if teacher.enable_memory_saver:  # the colocated teacher (the never-slept one never is)
                wakes += 1
                if poison is not None and wakes == at + 1:  # wake 1 precedes rollout 0
                    poison(teacher.model)

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(relax, "configure", configured)
            mp.setattr(TorchTeacher, "resume", dying_resume)
            result = self.harness.run(
                root,
                self.teacher_dir,
                line="studio",
                backup=True,
                steps=self.steps,
                context=self.context,
                env=env,
                on_dead=on_dead,
            )
        (gate,) = gates
        trained = [{s["step"]: s for s in r["steps"]} for r in result["ranks"]]
        steps = sorted(set().union(*trained))
        halts = [e for e in result["events"] if e["kind"] == "halt"]
        return Outcome(
            result["out"],
            moved={s: all(t[s]["updated"] for t in trained if s in t) for s in steps},
            poisoned=[
                s
                for s in steps
                if any(t[s]["updated"] and t[s]["consumed_poisoned"] for t in trained if s in t)
            ],
            events=result["events"],
            halt_step=min((h["step"] for h in halts), default=None),
            saved=sorted((result["out"] / "ckpt").glob("*.pt")),
            state=gate.guard.state_dict(),
            host_steps=len(steps),
            skipped=gate.guard.summary.skipped_updates,
            count=dict(gate.guard.summary.count),
            vocab_size=gate.guard.run.vocab_size,
        )

    def resume(self, root: Path, halted: Outcome, poison: Poison | None = None) -> Outcome:
        return self.run(root, poison, state=halted.state)

    def checkpoint(self, halted: Outcome) -> list[Path]:
        ckpt = halted.root / "ckpt"
        return [ckpt / f"rank{r}_rollout{halted.halt_step}.pt" for r in range(self.harness.RANKS)]
