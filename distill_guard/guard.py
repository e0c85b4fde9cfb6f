"""DistillGuard: runs the checks at each stage of a step; :mod:`distill_guard.carry_out` decides.

Where it sits in a colocated step (``docs/architecture.md``)::

    wake ─► canary ─► score ─► on_teacher_scores ─► loss/backward ─► optimizer
      ▲                                                                  │
    sleep ◄─ fingerprint ◄─────────────── on_step_metrics ◄──────────────┘

:meth:`DistillGuard.wake` and :meth:`DistillGuard.sleep` own the teacher's side of that step
(:class:`~distill_guard.live.colocate.ColocatedTeacher`) instead of the teacher's resume and
release. Every hook returns a :class:`~distill_guard.policy.Decision`; the guard never raises
into the trainer through its own fault (a check that throws, an unreachable teacher or a broken
alert channel becomes a finding like any other).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from distill_guard.alerts import Alerter, decision_alert
from distill_guard.carry_out import announce, decide, safe_decision
from distill_guard.checks import Check, default_checks
from distill_guard.checks.base import CHECK_HOOKS
from distill_guard.checks.canary import CanaryCheck
from distill_guard.events import EventLog
from distill_guard.findings import TEACHER_FAULTS, Code, Finding, internal_error
from distill_guard.guard_state import say_staged, stage_state
from distill_guard.live.canary import Canary
from distill_guard.live.colocate import ColocatedTeacher
from distill_guard.live.module_canary import ModuleCanary
from distill_guard.live.repair import Reloader
from distill_guard.live.teacher_reference import TeacherReference
from distill_guard.observations import RunSpec, StepMetrics, TeacherScores
from distill_guard.policy import Decision, Halt, Policy
from distill_guard.stages import Stage
from distill_guard.summary import GuardSummary
from distill_guard.teachers.base import Teacher, TeacherError
from distill_guard.watched_teachers import WatchedTeachers

if TYPE_CHECKING:
    from distill_guard.live.replicas import FleetWake, ReplicatedTeacher

log = logging.getLogger("distill_guard")

Reducer = Callable[[Decision], Decision]
"""Makes every rank take the same decision (see :mod:`distill_guard.consensus`)."""


class DistillGuard:
    """Watches an on-policy distillation run and, when the teacher dies, repairs it or halts.

    Built from a preset or config by :func:`~distill_guard.config.build_guard`; this is the
    programmatic form.

    Args:
        checks: the checks to run; :func:`~distill_guard.checks.default_checks` if None.
        policy: findings → decision; the default preset's if None.
        run: vocabulary size and loss of the run (``RunSpec``); learnt from the teacher if absent.
        events: an :class:`EventLog` or a path for one (JSONL, flushed per line).
        alerter: where alerts go; logger + wandb rank 0 by default (the configured guard of
            :func:`~distill_guard.config.build_guard` adds the webhook of ``alerts``).
        teacher: a live teacher (``distill_guard.teachers``) the guard sleeps, wakes, checks with
            the canary and repairs.
        canary: the canary (a :class:`Canary` or its :class:`CanaryCheck`); default if None.
        reloader: replaces the default reload (``update_weights_from_disk`` of the server's own
            ``model_path``), for EMA or tensor-pushed teachers.
        repair_attempts, repair_backoff_s: bounds of one repair.
        reducer: makes all ranks agree on each decision; None on a single process.
        rank: this process's rank (events and alerts are tagged with it).
        on_finding: called with every finding, info included (metrics export, replay).
        stop_on_halt: after a halt, answer every later hook with the same halt without
            looking; False keeps observing (replay shows what the rest of a run would show).
        teacher_reference: the teacher's reference from outside the run (a
            :class:`~distill_guard.live.teacher_reference.TeacherReference`, a reference file,
            a checkpoint directory or ``auto``), installed in the canary of the teacher the
            guard is given; None trusts the teacher's first fingerprint.
    """

    def __init__(
        self,
        checks: Sequence[Check] | None = None,
        policy: Policy | None = None,
        run: RunSpec | None = None,
        *,
        events: EventLog | str | os.PathLike[str] | None = None,
        alerter: Alerter | None = None,
        teacher: Teacher | None = None,
        canary: Canary | CanaryCheck | None = None,
        reloader: Reloader | None = None,
        repair_attempts: int = 3,
        repair_backoff_s: float = 1.0,
        reducer: Reducer | None = None,
        rank: int = 0,
        on_finding: Callable[[Finding], None] | None = None,
        stop_on_halt: bool = True,
        teacher_reference: TeacherReference | str | os.PathLike[str] | None = None,
    ) -> None:
        self.checks = list(default_checks() if checks is None else checks)
        self.policy = policy if policy is not None else Policy()
        self.run = run if run is not None else RunSpec()
        self._run_configured = run is not None
        """Whether the run's facts were given (a loaded state's then never replace them)."""
        self.events = events if isinstance(events, EventLog) else EventLog(events, rank=rank)
        self.alerter = alerter if alerter is not None else Alerter(rank=rank)
        self.preset: str | None = None
        """The preset it was built from (:func:`~distill_guard.config.build_guard` sets it)."""
        if self.alerter.on_error is None:
            self.alerter.on_error = self._alert_failed
        self.reducer = reducer
        self.rank = rank
        self.on_finding = on_finding
        self.stop_on_halt = stop_on_halt
        self.summary = GuardSummary()
        self.teachers = WatchedTeachers(
            canary,
            reloader=reloader,
            repair_attempts=repair_attempts,
            repair_backoff_s=repair_backoff_s,
            reference_spec=teacher_reference,
        )
        """The live teacher, the in-process teacher module, and the reference they are held
        against (:mod:`distill_guard.watched_teachers`)."""
        self._evidence: tuple[int, bool] | None = None
        self.open_incident: int | None = None
        """The step of a teacher-attributed critical nothing could act on, while it is open
        (:attr:`~distill_guard.observations.StepMetrics.open_incident`)."""
        self._attached = self._closed = False
        if teacher is not None:
            self.attach_teacher(teacher)

    def attach_teacher(
        self,
        teacher: Teacher,
        canary: Canary | CanaryCheck | None = None,
        *,
        reloader: Reloader | None = None,
    ) -> ColocatedTeacher:
        """Give the guard a live teacher to sleep, wake, verify and repair (learns V from it).

        ``canary`` and ``reloader`` default to the guard's own (its configuration's)."""
        colocated = self.teachers.attach(
            teacher, canary, reloader, temperature=self.run.temperature
        )
        if self.run.vocab_size is None:
            try:
                v = teacher.vocab_size
            except TeacherError:
                v = None
            if v:
                self.run = dataclasses.replace(self.run, vocab_size=int(v))
        return colocated

    def attach_replicas(self, teacher: ReplicatedTeacher) -> ReplicatedTeacher:
        """Give the guard a live teacher made of replicas
        (:class:`~distill_guard.live.replicas.ReplicatedTeacher`), in place of
        :meth:`attach_teacher`: :meth:`wake` and :meth:`sleep` drive every replica, the fleet's
        decision (quarantine, readmission, the halt bound) is the guard's at the wake, and the
        fleet is in :meth:`state_dict`."""
        return self.teachers.attach_replicas(teacher)

    @property
    def replicated(self) -> ReplicatedTeacher | None:
        """The live teacher made of replicas (:meth:`attach_replicas`), or None."""
        return self.teachers.replicated

    def watch_module_teacher(
        self, module: torch.nn.Module, *, temperature: float | None = None
    ) -> ModuleCanary:
        """Check an in-process teacher module on the canary before each update
        (:meth:`on_teacher_scores`): a teacher whose weights changed is caught even when its
        scores look like any teacher's (noise at the weights' own scale is not uniform).

        ``temperature``: the one the trainer consumes the teacher at (TRL's ``temperature``);
        it becomes the run's ``teacher_temperature`` where the run declares none, and a run
        that declares another is caught (the reference is taken at the declared one). With a
        reference, a teacher wrong from the start (garbage, another checkpoint, hotter or
        colder, a copy of the student) is caught at the first step."""
        if temperature is not None and self.run.teacher_temperature is None:
            self.run = dataclasses.replace(self.run, teacher_temperature=float(temperature))
        return self.teachers.watch_module(
            module,
            vocab_size=self.run.vocab_size,
            consumed_temperature=temperature if temperature is not None else self.run.temperature,
            temperature=self.run.temperature,
        )

    @property
    def colocated(self) -> ColocatedTeacher | None:
        """The teacher the guard sleeps, wakes and repairs; None without a live teacher."""
        return self.teachers.colocated

    @property
    def module_canary(self) -> ModuleCanary | None:
        """The canary of an in-process teacher module (:meth:`watch_module_teacher`)."""
        return self.teachers.module_canary

    @property
    def reference(self) -> TeacherReference | None:
        """The teacher's reference from outside the run, once made (kept in the state)."""
        return self.teachers.reference

    @property
    def canary_spec(self) -> Canary | CanaryCheck | None:
        """The canary a teacher attached later gets (the configured ``checks.canary``)."""
        return self.teachers.canary_spec

    @property
    def repair_attempts(self) -> int:
        """Reload-and-verify attempts of one repair (``repair.max_attempts``)."""
        return self.teachers.repair_attempts

    @property
    def repair_backoff_s(self) -> float:
        return self.teachers.repair_backoff_s

    @property
    def reloader(self) -> Reloader | None:
        return self.teachers.reloader

    # ------------------------------------------------------------------ lifecycle hooks

    def wake(self, step: int, *, resume: Callable[[], Any] | None = None) -> Decision:
        """Wake the teacher for this step and check it before it scores anything.

        Resumes the teacher (or runs the host's ``resume`` where the framework wakes it
        itself), scores the canary against the fingerprint taken before sleep, and repairs a
        dead teacher when the policy says so: ``decision.repaired`` then says it was reloaded
        and verified. Without a live teacher it only runs ``resume``.
        """
        fleet = self.replicated
        if fleet is not None:
            woke: list[FleetWake] = []
            findings = self._safely("wake", lambda: woke.append(fleet.wake(step)), step)
            findings = woke[0].findings if woke else findings
            return self._conclude(Stage.WAKE, step, findings, woke[0].decision if woke else None)
        if self.colocated is None:
            if resume is not None:
                resume()
            return self._conclude(Stage.WAKE, step, [])
        colocated = self.colocated
        findings = self._safely("wake", lambda: colocated.wake(step, resume), step)
        self._note_evidence(step, findings)
        decision = self._conclude(Stage.WAKE, step, findings)
        self._safely("settle", lambda: colocated.settle(decision), step)
        return decision

    def sleep(self, step: int, *, release: Callable[[], Any] | None = None) -> Decision:
        """Fingerprint the teacher, then put it to sleep (or run the host's ``release``).

        The fingerprint is the reference of the next :meth:`wake`: taken across one sleep, so
        teachers whose weights move between steps (EMA) are judged correctly.
        """
        fleet = self.replicated
        if fleet is not None:
            slept = self._safely(
                "sleep", lambda: [f for fs in fleet.sleep(step).values() for f in fs], step
            )
            return self._conclude(Stage.SLEEP, step, slept)
        if self.colocated is None:
            if release is not None:
                release()
            return self._conclude(Stage.SLEEP, step, [])
        colocated = self.colocated
        findings = self._safely("sleep", lambda: colocated.sleep(step, release), step)
        return self._conclude(Stage.SLEEP, step, findings)

    def on_teacher_scores(
        self,
        step: int,
        token_logprobs: torch.Tensor | None = None,
        topk_logprobs: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        *,
        topk_ids: torch.Tensor | None = None,
        token_ids: torch.Tensor | None = None,
        sample_index: torch.Tensor | None = None,
        topk_own: bool = True,
    ) -> Decision:
        """After the teacher scored this step's batch, before the loss: a uniform teacher is
        caught here, before it poisons an update. Act on ``skip_batch``/``rewake`` by not
        training on these scores (re-score if ``decision.repaired``).

        ``topk_ids``, ``token_ids`` and ``sample_index`` (see
        :class:`~distill_guard.observations.TeacherScores`) let the pairing checks see a
        tokenizer mismatch or logprobs shifted by one position; ``topk_own=False`` says the
        top-k rows are the teacher's logprobs of ids chosen elsewhere (a student's top-K)."""
        scores = TeacherScores(
            step, token_logprobs, topk_logprobs, mask, topk_ids, token_ids, sample_index, topk_own
        )
        findings = []
        module_canary = self.module_canary
        if module_canary is not None:
            findings += self._safely("canary", lambda: module_canary.check(step), step)
        findings += self._run_checks(Stage.TEACHER_SCORES, scores)
        seen = any(t is not None and t.numel() for t in (token_logprobs, topk_logprobs))
        if seen or module_canary is not None:
            self._note_evidence(step, findings)
        return self._conclude(Stage.TEACHER_SCORES, step, findings)

    def on_step_metrics(
        self, step: int, metrics: Mapping[str, float | None], *, before_update: bool = False
    ) -> Decision:
        """With the step's metrics keyed by :class:`~distill_guard.observations.Metric` roles
        (loss, student_entropy, truncated_ratio, teacher_logprob, eval_accuracy).

        ``before_update``: the step's update is still to come (a raw loss judged before the
        optimizer), so a ``skip_batch`` can still be carried out; after it, it cannot, and the
        decision says so instead of claiming a skip."""
        values = {k: v for k, v in metrics.items() if v is not None}
        evidence = self._evidence[1] if self._evidence and self._evidence[0] == step else None
        stage = Stage.STEP_METRICS_BEFORE_UPDATE if before_update else Stage.STEP_METRICS
        opened = self.open_incident
        if opened is not None and step - opened > self.policy.open_incident_steps:
            self.close_incident(step, f"not confirmed in {self.policy.open_incident_steps} steps")
        observed = StepMetrics(step, values, evidence, open_incident=self.open_incident)
        findings = self._run_checks(stage, observed)
        return self._conclude(stage, step, findings)

    # ------------------------------------------------------------------ state

    @property
    def teacher(self) -> Teacher | None:
        return self.colocated.teacher if self.colocated is not None else None

    @property
    def canary(self) -> Canary | None:
        return self.colocated.canary if self.colocated is not None else None

    @property
    def repairs(self) -> int:
        """Verified repairs of the teacher over the run."""
        if self.replicated is not None:
            return self.replicated.repairs
        return self.colocated.repairs if self.colocated is not None else 0

    @property
    def halt(self) -> Halt | None:
        """Why and where the run halted; None while it has not."""
        return self.summary.halt

    @property
    def halted(self) -> bool:
        return self.summary.halt is not None

    def set_rank(self, rank: int) -> None:
        """Tag events and alerts with ``rank``; ranks above 0 write their own event file."""
        self.rank = rank
        self.alerter.rank = rank
        self.events.set_rank(rank)

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs to keep its references (warm-up, CUSUM, counters)."""
        state: dict[str, Any] = {
            "checks": {c.name: c.state_dict() for c in self.checks},
            "policy": self.policy.state_dict(),
            "summary": self.summary.state_dict(),
            "run": dataclasses.asdict(self.run) | {"loss": self.run.loss.value},
        }
        state |= self.teachers.state_dict()
        state["open_incident"] = self.open_incident
        return state

    def load_state_dict(self, state: Mapping[str, Any], *, keep_halt: bool = True) -> None:
        """Take the references and counts of a saved run. ``keep_halt=False`` resumes a run that
        halted, once its cause is fixed: everything is kept but the halt (kept, the guard would
        halt again at its first hook); the event file records the halt being lifted.

        Whole or not at all: every part (each check's sub-state, the policy, the summary and its
        halt, ``run``, the teachers' part, the open incident) is checked and loaded into a staged
        copy first, and taken only once all of them loaded. A state that is not a mapping, has
        a key or ``run`` field this version does not know (another version's), or a value of
        the wrong kind (a corrupted checkpoint) raises
        :class:`~distill_guard.errors.GuardStateError` naming the key path, and the guard is
        exactly as it was (:mod:`distill_guard.guard_state`). Missing keys are fine: a state
        from before a field existed loads with its default.

        ``run``: a value the guard holds is never replaced by a saved one. A value it holds is
        one it was configured with (``run=``, or the config's ``run``), or learnt in this
        process before the load (V from a teacher attached earlier); a saved value that differs
        from it is said once (a WARNING and a ``state_run_kept`` event naming the field, both
        values and what to check), and the guard goes on with its own. Refusing the resume
        instead would stop a run whose configuration was changed on purpose (a β schedule, a
        new teacher); taking the saved value would judge the run by a loss or V that is not
        its own (a dead teacher read as near-uniform, not uniform), silently. A value the guard
        does not hold (None: V and the teacher temperature it learns from its teacher; every
        field of a guard built without ``run``) is the saved one, so what the run learnt is
        restored. (The canaries' own tokens, V and fingerprints are restored as saved.)
        """
        staged = stage_state(self, state)  # raises GuardStateError; nothing has changed then
        self.teachers.load_state_dict(staged.teachers)  # as checked on fresh canaries
        for i, check in staged.checks.items():
            self.checks[i] = check
        if staged.policy is not None:
            self.policy = staged.policy
        if staged.summary is not None:
            self.summary = staged.summary
        if not keep_halt and self.summary.halt is not None:
            lifted, self.summary.halt = self.summary.halt, None
            self.events.write("halt_lifted", step=lifted.step, halt=lifted.to_dict())
            log.info(
                "distill_guard: resuming after the halt at step %s (%s)",
                lifted.step,
                lifted.message,
            )
        if staged.run is not None:
            self.run = staged.run
        self.open_incident = staged.open_incident
        say_staged(self, staged)

    def close(self) -> None:
        """Deliver pending alerts, write the ``closed`` record (the run's summary), and flush
        and close the event log (call at the end of training or before a halt exit)."""
        if not self._closed:
            self._closed = True
            self._announce()
            try:
                self.alerter.close()
            except Exception:  # noqa: BLE001 - closing must not fail the trainer's exit
                log.exception("distill_guard: closing the alert sinks raised")
            self.events.write("closed", summary=self.summary.state_dict(), repairs=self.repairs)
        self.events.close()

    # ------------------------------------------------------------------ internals

    def _run_checks(self, stage: Stage, observation: Any) -> list[Finding]:
        """Every check's own hook of ``stage`` (:data:`~distill_guard.checks.base.CHECK_HOOKS`).

        A step's metrics without teacher evidence of their own (no scores seen this step) take
        it from a check that flags the teacher from them (its logged logprob at −ln V): the
        checks after it then read ``teacher_healthy=False``, so none says it saw no teacher
        evidence while ``teacher.uniform`` fired at the same step."""
        hook = CHECK_HOOKS[stage]
        findings: list[Finding] = []
        for check in self.checks:
            found = self._safely(
                check.name, lambda c=check, o=observation: hook(c, o, self.run), observation.step
            )
            findings += found
            if (
                isinstance(observation, StepMetrics)
                and observation.teacher_healthy is None
                and any(f.code in TEACHER_FAULTS for f in found)
            ):
                observation = dataclasses.replace(observation, teacher_healthy=False)
        return findings

    def _safely(
        self, who: str, fn: Callable[[], list[Finding] | None], step: int | None
    ) -> list[Finding]:
        """Run guard-side work; any exception becomes a finding instead of reaching the trainer."""
        try:
            return list(fn() or [])
        except Exception as exc:  # noqa: BLE001 - fail safe by design
            log.exception("distill_guard: %s raised", who)
            return [internal_error(who, exc, step, "the guard skipped it this step")]

    def _conclude(
        self, stage: Stage, step: int, findings: list[Finding], made: Decision | None = None
    ) -> Decision:
        """The one place a decision is made; a fault of the guard's own here becomes
        ``guard.internal_error`` and a safe decision, never an exception in the trainer."""
        self._announce()
        if self.teachers.pending:
            findings, self.teachers.pending = [*self.teachers.pending, *findings], []
        try:
            return decide(self, stage, step, findings, made)
        except Exception as exc:  # noqa: BLE001 - fail safe by design
            return safe_decision(stage, step, exc)

    def _announce(self) -> None:
        """The ``attached`` record, once, at the first hook: even a quiet run says it was watched."""
        if self._attached:
            return
        self._attached = True
        try:
            announce(self)
        except Exception:  # noqa: BLE001 - a record must not cost the run its step
            log.exception("distill_guard: writing the attach record raised")

    def _note_evidence(self, step: int, findings: list[Finding]) -> None:
        """What the teacher's own evidence (its canary, then its scores) says of this step; the
        latest wins (scores taken after a repair at wake are the repaired teacher's)."""
        codes = {f.code for f in findings}
        if codes & TEACHER_FAULTS:
            self._evidence = (step, False)
        elif Code.TEACHER_UNREACHABLE not in codes:
            self._evidence = (step, True)
            if self.open_incident is not None and step > self.open_incident:
                self.close_incident(step, "the teacher's own evidence is healthy again")

    def open_unactionable(self, decision: Decision) -> None:
        """A teacher-attributed critical that nothing could act on (no live teacher to reload,
        the update already taken) stays open: the student-signal checks then watch for the
        student following a dead teacher, and the policy halts when they see it."""
        if self.open_incident is None and decision.step is not None:
            self.open_incident = decision.step
            self.events.write(
                "incident_open",
                step=decision.step,
                codes=sorted({f.code for f in decision.reasons}),
            )

    def close_incident(self, step: int | None, why: str) -> None:
        """The open incident is over (a repair verified, healthy teacher evidence)."""
        if self.open_incident is not None:
            self.events.write("incident_closed", step=step, opened=self.open_incident, why=why)
            self.open_incident = None

    def record_findings(self, stage: Stage, findings: list[Finding]) -> None:
        """Count, log to the event file and hand on (``on_finding``) every finding of ``stage``."""
        for f in findings:
            self.summary.add_finding(f)
            self.events.write("finding", stage=str(stage), **f.to_dict())
            if self.on_finding is not None:
                self.on_finding(f)

    def send_alert(self, decision: Decision) -> None:
        """One alert for ``decision``, also written to the event file."""
        title, body, level = decision_alert(decision)
        self.events.write("alert", step=decision.step, title=title, level=level)
        self.alerter.alert(title, body, level)

    def _alert_failed(self, sink: str, title: str, error: str) -> None:
        self.events.write("alert_failed", sink=sink, title=title, error=error)
