"""How a stage's findings become the decision every rank carries out (and the record, at the
first, that the guard is watching).

One path for every hook of :class:`~distill_guard.guard.DistillGuard`: the policy's word on this
rank's findings, agreed by all ranks (:mod:`distill_guard.consensus`), cut to what can be done
where it was taken (:func:`~distill_guard.policy.feasible`), a rewake carried out on the ranks
that asked for it, then recorded, alerted and, for a halt, kept for good.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

from distill_guard.events import attach_record
from distill_guard.findings import Finding, internal_error
from distill_guard.live.canary import Canary
from distill_guard.policy import Action, Decision, Halt, acting, feasible, teacher_attributed
from distill_guard.stages import Stage

if TYPE_CHECKING:
    from distill_guard.guard import DistillGuard

log = logging.getLogger("distill_guard")


def announce(guard: DistillGuard) -> None:
    """Write the ``attached`` record (the run's spec, policy, checks, canary and sinks; never a
    secret) and say at INFO that the guard is watching, and how."""
    spec = guard.canary if guard.canary is not None else guard.canary_spec
    teacher = guard.teacher
    if teacher is not None:
        kind: str | None = type(teacher).__name__
    else:
        kind = "module" if guard.module_canary is not None else None
    record = attach_record(
        preset=guard.preset,
        checks=guard.checks,
        policy=guard.policy,
        run=guard.run,
        canary=spec.check if isinstance(spec, Canary) else spec,
        sinks=guard.alerter.describe() if guard.alerter.rank == 0 else [],
        rank=guard.rank,
        teacher=kind,
        teacher_reference=guard.reference.source if guard.reference is not None else None,
    )
    guard.events.write("attached", **record)
    log.info(
        "distill_guard: attached on rank %d (%s, %d checks%s); alerts to %s",
        guard.rank,
        f"preset {guard.preset}" if guard.preset else "custom configuration",
        len(guard.checks),
        ", monitor only" if guard.policy.monitor_only else "",
        ", ".join(["log", *(s["sink"] for s in record["alert_sinks"])]),
    )


def safe_decision(stage: Stage, step: int, exc: Exception) -> Decision:
    """The decision when deciding itself raised: skip the update while it is still to come
    (never train on scores the guard could not judge), else alert; never an exception."""
    log.exception("distill_guard: deciding at %s raised", stage)
    safe = Action.SKIP_BATCH if stage.update_pending else Action.ALERT
    why = "this step is not trained on the teacher's scores, as a precaution"
    fault = internal_error(
        stage.value, exc, step, why if safe is Action.SKIP_BATCH else "run goes on"
    )
    return Decision(step, safe, (fault,), message=f"{safe.value}: guard fault at {stage}")


def decide(
    guard: DistillGuard,
    stage: Stage,
    step: int,
    findings: list[Finding],
    made: Decision | None = None,
) -> Decision:
    """The decision every rank carries out at ``stage``: the policy's word on this rank's findings,
    agreed over the ranks, made feasible here, a rewake carried out, recorded and alerted.
    ``made``: this rank's decision where it was already made from the findings (a teacher made
    of replicas: its fleet's, which handled each broken replica), in place of the policy's."""
    if guard.summary.halt is not None and guard.stop_on_halt:
        return Decision(step, Action.HALT, message=guard.summary.halt.message)
    try:
        guard.record_findings(stage, findings)
        local = guard.policy.decide(step, findings) if made is None else made
    except Exception as exc:  # noqa: BLE001 - every rank must still reach the reduction
        local = safe_decision(stage, step, exc)
    decision = _reduce(guard, local) if guard.reducer is not None else local
    pending, can_reload = stage.update_pending, guard.colocated is not None
    wanted = decision
    decision = feasible(decision, update_pending=pending, can_reload=can_reload)
    if (
        decision.action is Action.ALERT
        and acting(wanted) is not None
        and teacher_attributed(wanted.reasons)
    ):
        guard.open_unactionable(decision)  # monitor-only too: it shows what acting would do
    local = feasible(local, update_pending=pending, can_reload=can_reload)
    if decision.action is Action.REWAKE:
        decision = _rewake(guard, stage, decision, local)
    if decision.action is not Action.CONTINUE:
        guard.events.write("decision", stage=stage.value, **decision.to_dict())
        if decision.notify:
            guard.send_alert(decision)
    if decision.action is Action.HALT and guard.summary.halt is None:
        guard.summary.halt = Halt.of(decision, stage.value)
        guard.events.write("halt", stage=stage.value, step=step, message=decision.message)
        guard.events.close()
    return decision


def _reduce(guard: DistillGuard, decision: Decision) -> Decision:
    assert guard.reducer is not None
    try:
        return guard.reducer(decision)
    except Exception as exc:  # noqa: BLE001
        log.exception("distill_guard: decision reduction failed")
        # Without agreement the safe course for the local rank is to stop: a rank that
        # carries on alone would hang the others at their next collective.
        return Decision(
            decision.step,
            Action.HALT,
            decision.reasons,
            message=f"halt: ranks could not agree on a decision ({exc})",
        )


def _rewake(guard: DistillGuard, stage: Stage, agreed: Decision, local: Decision) -> Decision:
    """Carry out an agreed rewake: only a rank whose own checks asked for it repairs (the
    others' teachers are fine: attribute before acting). Under a reducer a second reduction
    then gives every rank the outcome: a repair that failed anywhere halts all, and the
    repairing rank's notice reaches rank 0, which alerts once per incident."""
    outcome = _repair(guard, stage, agreed) if local.action is Action.REWAKE else local
    if guard.reducer is None:
        return outcome
    return dataclasses.replace(_reduce(guard, outcome), repaired=outcome.repaired)


def _repair(guard: DistillGuard, stage: Stage, decision: Decision) -> Decision:
    """Repair this rank's teacher, if the guard holds it; the decision as carried out."""
    colocated = guard.colocated
    if colocated is None:
        return decision
    carried, findings = colocated.rewake(
        decision,
        on_event=lambda kind, payload: guard.events.write(
            kind, stage=stage.value, **{**payload, "step": decision.step}
        ),
    )
    guard.record_findings(stage, findings)
    if carried.repaired:
        guard.close_incident(decision.step, "the teacher was repaired and verified")
    if carried.repaired and stage is Stage.WAKE:
        # the canary found the fault and the canary passes now: resolved. A fault found in
        # the scores is not proved gone by a canary that passes (one replica of several, a
        # scoring path the canary does not take): its steps keep counting toward the halt.
        guard.policy.resolved(decision.step)
    return carried
