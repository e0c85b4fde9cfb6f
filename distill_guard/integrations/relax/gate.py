"""The gate before Relax's queue: no sample with dead teacher values is put for the trainer.

Relax converts each finished group and puts it into the trainer's queue
(``transfer_batch_to_data_system`` → ``async_put(partition_id=f"train_{rollout_id}")``) before
its rollout log hook runs (``docs/relax.md`` §3.2). The one user hook that sees the teacher's
values and still runs before the put, on both Relax lines, is the dynamic sampling filter: it is
called once per finished group, after teacher scoring. There the gate

- at the step's first group, checks the teacher with the canary against the fingerprint taken at
  the previous step's first group (Relax released and resumed it in between: the colocated step's
  sleep and wake, with Relax's own release and resume), then takes the next reference;
- judges each sample's values (uniform, non-finite) and, when the step's canary failed, takes
  every sample of the step as scored by a dead teacher;
- acts on the guard's decision: on a halt it masks the group and posts ``halt``; after a verified
  repair it re-scores the dead samples and keeps them only if the new values pass; otherwise it
  masks them (``remove_sample``, a zero ``loss_mask``, ``opd_sample_mask = False``);
- posts the step's tally on the run's verdict channel (:mod:`.verdicts`) for the trainer ranks.

The filter never drops a group: Relax refills a dropped group with new prompts, and against a
dead teacher it would sample forever.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import torch

from distill_guard.checks import TeacherCollapseCheck
from distill_guard.findings import Severity
from distill_guard.guard import DistillGuard
from distill_guard.integrations.relax import samples as fields
from distill_guard.integrations.relax.verdicts import StepVerdict, Verdict, VerdictChannel
from distill_guard.observations import TeacherScores
from distill_guard.policy import Action, Decision
from distill_guard.teachers.per_row_ids import score_ids_per_row

log = logging.getLogger("distill_guard")


def _host_call() -> None:
    """Relax releases and resumes the teacher itself (the trainer, between rollouts): the gate
    only marks where that happened."""


@dataclasses.dataclass
class RelaxGate:
    """The guard on Relax's rollout side, one per rollout process."""

    guard: DistillGuard
    board: VerdictChannel | None = None
    """Where the step verdicts go for the trainer ranks (a Ray actor, or a shared directory)."""
    token_selection: str = "student_sampled"
    """Relax's ``--opd-token-selection``: which teacher channel the samples carry."""
    top_k: int = 0
    """Relax's ``--opd-log-prob-top-k``."""
    gates: tuple[str, ...] = ()
    """The gates this run has wired (``filter``, ``train_step``, ``feedback``, ``log``)."""
    step: int | None = None
    """The rollout being gated; set at its first group, advanced by the log hook."""
    max_skipped_steps: int = 3
    """Consecutive skipped updates after which the run halts (a run that never trains)."""
    tallies: dict[int, StepVerdict] = dataclasses.field(default_factory=dict)
    _skipped: int = 0
    _woke: set[int] = dataclasses.field(default_factory=set)
    _canary_failed: set[int] = dataclasses.field(default_factory=set)
    _repaired: set[int] = dataclasses.field(default_factory=set)

    @property
    def teacher(self) -> Any:
        return self.guard.teacher

    def tally(self, rollout_id: int) -> StepVerdict:
        if rollout_id not in self.tallies:
            self.tallies[rollout_id] = StepVerdict(
                rollout_id,
                run=getattr(self.board, "run", ""),
                attempt=getattr(self.board, "attempt", None) or "",
            )
        return self.tallies[rollout_id]

    # ---------------------------------------------------------------- per group

    def filter_group(self, args: Any, group: Sequence[Any]) -> None:
        """Judge one finished group before Relax queues it; mask or re-score dead samples.
        Each sample is marked as judged; the step's verdict is counted at :meth:`end_rollout`
        from the samples Relax committed, not from the groups that passed here."""
        if self.step is None:
            self.step = int(getattr(args, "start_rollout_id", 0) or 0)
        step = self.step
        tally = self.tally(step)
        if step not in self._woke:
            self._woke.add(step)
            self._wake(step, tally)
        dead = self._dead(step, group)
        rescored: list[Any] = []
        if tally.verdict is Verdict.HALT:
            fields.mask_out(group)
        elif dead:
            decision = self._decide(step, dead)
            if decision.action is Action.HALT:
                tally.raise_to(Verdict.HALT, _why(decision))
                fields.mask_out(group)
            elif step in self._repaired:
                bad = self._rescore(step, dead)
                rescored = [s for s in dead if all(s is not b for b in bad)]
                fields.mask_out(bad)
            else:
                fields.mask_out(dead)
                tally.raise_to(Verdict.TRAIN, decision.message)  # records why, trains the rest
        for s in group:
            fields.mark_judged(
                s, step, dead=any(s is d for d in dead), rescored=any(s is r for r in rescored)
            )

    def convert(self, args: Any, samples: Sequence[Any]) -> None:
        """At Relax's conversion, where every path puts teacher values into the queue (the
        filter's groups, the abort path's, a deferred-OPD flush): judge every sample no gate
        judged yet, as the filter would. The trainer's data is built from them right after."""
        unjudged = [s for s in samples if fields.judgement(s) is None]
        if unjudged:
            self.filter_group(args, unjudged)

    def _wake(self, step: int, tally: StepVerdict) -> None:
        """The step's canary, against the fingerprint of the previous rollout's end."""
        if self.guard.colocated is None:
            return
        decision = self.guard.wake(step, resume=_host_call)
        if decision.action is Action.HALT:
            tally.raise_to(Verdict.HALT, _why(decision))
            return
        if any(f.severity is Severity.CRITICAL for f in decision.reasons):
            self._canary_failed.add(step)
        if decision.repaired:
            self._repaired.add(step)
        # The next step's reference, taken now: the teacher is awake and Relax's trainer cannot
        # release it before this step's data is queued. At the log hook it could: the trainer
        # may already be releasing it, and a request in flight during a release kills SGLang.
        self.guard.colocated.fingerprint(step)

    def _dead(self, step: int, group: Sequence[Any]) -> list[Any]:
        """The group's samples scored by a dead teacher: every scored one when the step's canary
        failed, else those whose own values are uniform or non-finite."""
        check = self._collapse_check()
        dead = []
        for s in group:
            values = fields.teacher_values(s, self.token_selection)
            if values.empty:
                continue
            if step in self._canary_failed or _judged_dead(check, step, values, self.guard):
                dead.append(s)
        return dead

    def _collapse_check(self) -> TeacherCollapseCheck:
        """The guard's own teacher-collapse check (its thresholds), else a default one."""
        found = (c for c in self.guard.checks if isinstance(c, TeacherCollapseCheck))
        return next(found, None) or TeacherCollapseCheck()

    def _decide(self, step: int, dead: Sequence[Any]) -> Decision:
        """The guard's word on the dead samples (its policy: halt, or repair the teacher)."""
        if step in self._repaired:  # already repaired this step: these were scored before it
            return Decision(step, Action.REWAKE, repaired=True)
        values = fields.stack(fields.teacher_values(s, self.token_selection) for s in dead)
        decision = self.guard.on_teacher_scores(
            step, values.token, values.topk, topk_own=values.topk_own
        )
        if decision.repaired:
            self._repaired.add(step)
        if not decision.acts and step in self._canary_failed:
            # the canary failed but the values themselves pass: still never train on them
            return Decision(
                step, Action.SKIP_BATCH, message="scored by a teacher that failed the canary"
            )
        return decision

    def _rescore(self, step: int, dead: Sequence[Any]) -> list[Any]:
        """Score ``dead`` again with the repaired teacher and write the values back in place;
        the samples that still fail (or cannot be re-scored) are returned, to be masked.

        ``student_sampled`` re-scores the sampled tokens; ``teacher_topk`` the teacher's own
        top-K (its new ids replace the dead teacher's); ``student_topk`` the teacher's logprobs
        of the student's own top-K ids, row by row (SGLang's ``token_ids_logprob``). ``union``
        cannot be rebuilt (the sample keeps the merged ids, not the student's half): masked."""
        check = self._collapse_check()
        bad = []
        for s in dead:
            topk = getattr(s, fields.TOPK_FIELD, None)
            if topk is not None and self.token_selection not in ("teacher_topk", "student_topk"):
                bad.append(s)
                continue
            try:
                self._rescore_one(s, topk is not None)
            except Exception as exc:  # noqa: BLE001 - the teacher failed again: mask, do not crash
                log.error("distill_guard: re-scoring a sample failed: %s", exc)
                bad.append(s)
                continue
            if _judged_dead(
                check, step, fields.teacher_values(s, self.token_selection), self.guard
            ):
                bad.append(s)
            else:
                fields.unmask(s)  # masked earlier (the feedback gate): verified now, train on it
        return bad

    def _rescore_one(self, s: Any, has_topk: bool) -> None:
        ids, start = fields.teacher_inputs(s)
        teacher_topk = has_topk and self.token_selection == "teacher_topk"
        res = self.teacher.score(
            [ids], top_k=self.top_k if teacher_topk else 0, logprob_start_len=start
        )
        rows = res.token_logprobs[0].shape[0]
        if getattr(s, fields.TOKEN_FIELD, None) is not None:
            fields.put(s, fields.TOKEN_FIELD, res.token_logprobs[0][-int(s.response_length) :])
        if teacher_topk:
            fields.put(s, fields.TOPK_FIELD, res.topk_logprobs[0][-int(s.response_length) :])
            fields.put(s, fields.TOPK_IDS_FIELD, res.topk_ids[0][-int(s.response_length) :])
        elif has_topk:  # student_topk: the student's ids, one set per row
            row_ids = torch.as_tensor(fields.numeric(getattr(s, fields.TOPK_IDS_FIELD)))
            row_ids = row_ids.to(torch.int64)
            offset = rows - row_ids.shape[0]  # the response's rows are the last ones
            values = score_ids_per_row(self.teacher, ids, start + offset, row_ids)
            fields.put(s, fields.TOPK_FIELD, values)

    # ---------------------------------------------------------------- per step

    def end_rollout(self, rollout_id: int, samples: Sequence[Any]) -> dict[str, float]:
        """The rollout log hook. In Relax it runs after the step was queued, with the samples
        Relax committed to it: count the step from them and complete its verdict for the
        trainer. In slime and miles it runs before the data is converted, and the post-process
        gate completes the step instead: only report."""
        if self.step is not None and self.step != rollout_id and self.step in self.tallies:
            moved = self.tallies.pop(self.step)  # the first rollout id was guessed wrong
            self.tallies[rollout_id] = dataclasses.replace(moved, rollout_id=rollout_id)
            self.step = rollout_id
        tally = self.tally(rollout_id)
        if "post_process" not in self.gates:
            self.count_committed(rollout_id, samples)
            self.complete_step(rollout_id)
        return self.metrics(tally)

    def post_process(self, args: Any, samples: Sequence[Any]) -> None:
        """slime / miles: the teacher's values were just filled in by the run's own reward
        post-process, at the start of the conversion; judge them, then complete the step."""
        self.filter_group(args, samples)
        assert self.step is not None
        self.count_committed(self.step, samples)
        self.complete_step(self.step)

    def count_committed(self, rollout_id: int, committed: Sequence[Any]) -> None:
        """The step's tally from what was committed to it. A sample the filter judged counts as
        it left it; any other was queued without passing a gate (no filter wired, or Relax's
        abort path under partial rollout) and is judged now: dead values there are in the
        trainer's data with a live loss mask, so the step's update must not be taken."""
        tally = self.tally(rollout_id)
        found = [j for j in map(fields.judgement, committed) if j is not None]
        unjudged = [s for s in committed if fields.judgement(s) is None]
        late = [s for s in self._dead(rollout_id, unjudged) if not fields.out_of_loss(s)]
        tally.samples = len(committed)
        tally.dead = sum(j["dead"] for j in found) + len(late)
        tally.rescored = sum(j["rescored"] for j in found)
        tally.masked = sum(fields.masked_by_guard(s) for s in committed)
        if late:
            unwired = "filter" not in self.gates
            where = (
                "the dynamic sampling filter gate is not loaded"
                if unwired
                else "they were committed without passing the dynamic sampling filter (Relax's "
                "abort path under partial rollout)"
            )
            halt = unwired or self.guard.policy.critical_action is Action.HALT
            tally.raise_to(
                Verdict.HALT if halt else Verdict.SKIP,
                f"{len(late)} committed samples with dead teacher values were queued unfiltered "
                f"({where}): {'halting' if halt else 'skipping the update'} before the trainer "
                "uses them",
            )
        guard_masked = tally.masked > 0
        if committed and guard_masked and all(fields.out_of_loss(s) for s in committed):
            tally.raise_to(
                Verdict.SKIP,
                "every committed sample of the step is out of the loss: an update on a zero "
                "loss would still move the weights (weight decay, momentum)",
            )

    def complete_step(self, rollout_id: int) -> None:
        """Post the step's final verdict and move on to the next step. A run whose updates were
        skipped on ``max_skipped_steps`` consecutive steps halts: it is not training."""
        tally = self.tally(rollout_id)
        self._skipped = self._skipped + 1 if tally.verdict is Verdict.SKIP else 0
        if self._skipped >= self.max_skipped_steps:
            tally.raise_to(
                Verdict.HALT,
                f"the updates of {self._skipped} consecutive steps were skipped (bound "
                f"{self.max_skipped_steps}, DISTILL_GUARD_MAX_SKIPPED_STEPS): the run is not "
                "training on anything. Fix the teacher (see the reasons above) and resume",
            )
        tally.complete = True
        self._post(tally)
        self.step = rollout_id + 1

    def metrics(self, tally: StepVerdict) -> dict[str, float]:
        return {
            "guard/samples": float(tally.samples),
            "guard/dead_samples": float(tally.dead),
            "guard/masked_samples": float(tally.masked),
            "guard/rescored_samples": float(tally.rescored),
            "guard/repairs": float(self.guard.repairs),
            "guard/verdict": float(tally.verdict.rank),
            "guard/halted": float(tally.verdict is Verdict.HALT),
            "guard/skipped_in_a_row": float(self._skipped),
        }

    def _post(self, tally: StepVerdict) -> None:
        if self.board is not None:
            try:
                self.board.post(tally)
            except OSError as exc:
                log.error(
                    "distill_guard: cannot post the verdict of step %s: %s", tally.rollout_id, exc
                )


def _judged_dead(
    check: TeacherCollapseCheck, step: int, values: fields.TeacherValues, guard: DistillGuard
) -> bool:
    scores = TeacherScores(step, values.token, values.topk, topk_own=values.topk_own)
    return any(f.severity is Severity.CRITICAL for f in check.on_teacher_scores(scores, guard.run))


def _why(decision: Decision) -> str:
    """The decision and the finding behind it, whose message names what to change."""
    first = next((f for f in decision.reasons if f.severity is Severity.CRITICAL), None)
    return f"{decision.message}. {first.message}" if first is not None else decision.message
