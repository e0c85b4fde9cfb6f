"""A replicated teacher in a colocated run: each replica checked after its own wake, a broken one
quarantined, repaired and readmitted, the run halted only when too few replicas serve.

Each replica is a :class:`~distill_guard.live.colocate.ColocatedTeacher` of its own, at its own
address (:mod:`distill_guard.teachers.replicas`): its canary, its checksum, its repair. What the
fleet does with a replica's verdict is decided by the pure functions here::

    wake ─► clean ──────────────────────────────────────► serving (readmitted if it was out)
         └► broken ─► quarantine (router: DELETE) ─► repair ─► verified ─► readmit (POST)
                                                            └► not ─► stays out
    then: serving replicas < min_healthy_replicas ─► halt; else the run trains on the rest

A replica is readmitted only once its canary matched the checkpoint's reference
(:mod:`~distill_guard.live.teacher_reference`), never another replica or its own first
fingerprint: a fleet that woke wrong everywhere must not vouch for itself. The router's worker
API is ``docs/sglang-contract.md`` §8.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from distill_guard.errors import GuardValueError
from distill_guard.findings import Code, Finding, Severity
from distill_guard.live.canary import Canary, teacher_error_finding
from distill_guard.live.colocate import ColocatedTeacher
from distill_guard.live.receipts import (
    GateResult,
    Verdict,
    WakeKey,
    WakeLedger,
    WakeReceipt,
    gate,
    worst,
)
from distill_guard.live.repair import EventSink
from distill_guard.policy import Action, Decision
from distill_guard.teachers.base import TeacherError

if TYPE_CHECKING:
    from distill_guard.checks.canary import CanaryCheck
    from distill_guard.live.teacher_reference import TeacherReference
    from distill_guard.teachers.base import ScoreResult
    from distill_guard.teachers.replicas import Replica
    from distill_guard.teachers.sglang_router import RouterWorker, SGLangRouter

log = logging.getLogger("distill_guard")
WARN = Severity.WARN

REPLICA_METRICS: dict[str, str] = {
    "guard/replicas_healthy": "replicas serving now (verified at their last check)",
    "guard/replicas_quarantined": "replicas out of the router (or the trainer's list) now",
    "guard/replica/<id>/serving": "1 while the replica serves, 0 while it is quarantined",
    "guard/replica/<id>/quarantines": "times it was taken out so far",
    "guard/replica/<id>/failed_wakes": "its wakes found failed so far, at the wake or later",
    "guard/replica/<id>/repairs": "its verified repairs so far",
    "guard/replica/<id>/incidents": "its incidents so far (each alerted once)",
}
""":meth:`ReplicatedTeacher.metrics`: totals and states, not per-step counts, as the guard's own
(:data:`distill_guard.summary.GUARD_METRICS`); under ``guard/``, which the metric resolver never
takes for a training metric (:func:`distill_guard.metric_names.looks_like`)."""


def metric_id(url: str) -> str:
    """A replica's ``<id>`` in metric names: ``host_port`` (``http://127.0.0.1:30001`` →
    ``127_0_0_1_30001``), one path segment of letters, digits, ``_`` and ``-``."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", url.split("://", 1)[-1].rstrip("/"))


class ReplicaState(str, enum.Enum):
    """Whether a replica gets the run's traffic."""

    SERVING = "serving"
    QUARANTINED = "quarantined"
    """Out of the router (or of the trainer's list): it serves nothing until it is verified
    against the checkpoint's reference and readmitted."""


class Move(str, enum.Enum):
    """What the fleet does with one replica after its wake (:func:`after_wake`)."""

    KEEP = "keep"
    """Clean and serving: nothing to do."""
    QUARANTINE = "quarantine"
    """Broken and serving: take it out, then repair it."""
    REPAIR = "repair"
    """Broken and already out: repair it again."""
    READMIT = "readmit"
    """Clean and out: its canary matched the checkpoint's reference, so it comes back."""


def broken(findings: Sequence[Finding]) -> bool:
    """A wake whose findings hold a critical one: the replica must not serve as it is (a fault
    of its weights, an answer it did not give, a state that cannot be known)."""
    return any(f.severity >= Severity.CRITICAL for f in findings)


def after_wake(state: ReplicaState, findings: Sequence[Finding]) -> Move:
    """The move for a replica in ``state`` whose wake found ``findings``."""
    if broken(findings):
        return Move.QUARANTINE if state is ReplicaState.SERVING else Move.REPAIR
    return Move.KEEP if state is ReplicaState.SERVING else Move.READMIT


def after_repair(verified: bool) -> Move | None:
    """After a repair: readmit a verified replica; one that is not stays out (None)."""
    return Move.READMIT if verified else None


def fleet_decision(
    step: int,
    states: dict[str, ReplicaState],
    min_healthy: int,
    reasons: Sequence[Finding] = (),
    *,
    unquarantined: Sequence[str] = (),
) -> Decision:
    """Continue on the serving replicas while there are at least ``min_healthy`` of them; halt
    below, or when a broken replica could not be taken out (``unquarantined``: it still gets
    traffic). ``reasons``: the replicas' findings at warn or above, carried on the decision."""
    serving = sorted(u for u, s in states.items() if s is ReplicaState.SERVING)
    out = sorted(u for u, s in states.items() if s is ReplicaState.QUARANTINED)
    kept = tuple(f for f in reasons if f.severity >= Severity.WARN)
    if unquarantined:
        names = ", ".join(unquarantined)
        return Decision(
            step,
            Action.HALT,
            kept,
            message=f"halt: broken replica(s) {names} could not be taken out of the router and "
            "were not repaired: they still get the run's traffic",
        )
    if len(serving) < min_healthy:
        below = Finding(
            Code.TEACHER_REPLICAS_BELOW_MIN,
            Severity.CRITICAL,
            f"{len(serving)} of {len(states)} teacher replicas serve, below "
            f"min_healthy_replicas={min_healthy}; quarantined: {', '.join(out) or 'none'}. The "
            "run halts: too few verified replicas are left to score its samples. Repair or "
            "restart the quarantined replicas (their findings say why), or lower "
            "replicas.min_healthy_replicas.",
            step,
            {"serving": serving, "quarantined": out, "min_healthy_replicas": min_healthy},
        )
        return Decision(step, Action.HALT, (below, *kept), message=f"halt: {below.message}")
    action = Action.ALERT if kept else Action.CONTINUE
    message = f"{len(serving)} of {len(states)} replicas serve" + (
        f" ({len(out)} quarantined: {', '.join(out)})" if out else ""
    )
    return Decision(step, action, kept, message=message)


@dataclass
class ReplicaWake:
    """What one replica's wake came to."""

    url: str
    state: ReplicaState
    """Its state after the wake."""
    moves: list[Move] = field(default_factory=list)
    """What was done, in order (``quarantine``, ``repair``, ``readmit``)."""
    findings: list[Finding] = field(default_factory=list)
    """Its wake's, its repair's and its router calls' findings."""
    alert: Finding | None = None
    """The one alert of the replica's incident, at the wake that opened it (its quarantine);
    None at the incident's later wakes (counted in its repairs, as
    :class:`~distill_guard.live.incidents.IncidentTracker` counts one teacher's) and when
    nothing failed."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "state": self.state.value,
            "moves": [m.value for m in self.moves],
            "findings": [f.to_dict() for f in self.findings],
            "alert": self.alert.to_dict() if self.alert is not None else None,
        }


@dataclass
class FleetWake:
    """A wake of every replica, and the run's decision from it."""

    decision: Decision
    replicas: list[ReplicaWake]

    @property
    def serving(self) -> list[str]:
        """The replicas that get traffic now (where no router routes, give the trainer these)."""
        return [r.url for r in self.replicas if r.state is ReplicaState.SERVING]

    @property
    def findings(self) -> list[Finding]:
        """Every replica's findings, in the replicas' order."""
        return [f for r in self.replicas for f in r.findings]

    @property
    def alerts(self) -> list[Finding]:
        """One per replica incident opened here (the decision notifies only when there is one,
        or at a halt)."""
        return [r.alert for r in self.replicas if r.alert is not None]

    def to_dict(self) -> dict[str, Any]:
        return {
            "decision": self.decision.to_dict(),
            "replicas": [r.to_dict() for r in self.replicas],
        }


@dataclass
class _Member:
    replica: Replica
    colocated: ColocatedTeacher
    state: ReplicaState = ReplicaState.SERVING
    listed: RouterWorker | None = None
    """Its router entry when it was taken out (to put it back as it was); None when the router
    did not list it (then it is not added back: the guard never puts a replica into a router
    that did not route to it)."""
    in_router: bool = False
    key: WakeKey | None = None
    """The wake (or the wake's verified repair) whose weights it serves now: its receipts'."""
    quarantines: int = 0
    failed_wakes: int = 0
    """Its wakes (and verified repairs) found failed, at the check after the wake or later."""


class ReplicatedTeacher:
    """The replicas of one teacher, each slept, woken, checked and repaired at its own address.

    Args:
        replicas: the replicas (:func:`~distill_guard.teachers.replicas.make_replicas`).
        reference: the checkpoint's reference every replica is verified against
            (:class:`~distill_guard.live.teacher_reference.TeacherReference`); required: a
            readmission is a verdict against the truth, not against the fleet.
        router: the router the replicas serve behind; its worker API takes a broken replica out
            and puts a verified one back. None: the trainer routes, by :attr:`serving`.
        min_healthy_replicas: the fewest serving replicas the run trains on; below, it halts
            (``replicas.min_healthy_replicas`` in the guard config).
        canary: the canary check each replica's canary is made from (its tokens are the
            reference's).
        repair_attempts, repair_backoff_s: bounds of one replica's repair.
        tags: the memory tags to release and resume (None: all).
        on_event: receives ``replica.quarantined``, ``replica.readmitted``,
            ``replica.router_failed`` and every repair event, each with the replica's ``url``.

    Around a step: :meth:`wake`, then the samples scored by :meth:`score` (each with its
    :class:`~distill_guard.live.receipts.WakeReceipt`; :meth:`routed_receipt` for one scored
    through the router), :meth:`recheck` after the scoring, :meth:`gate` before the optimizer,
    :meth:`sleep`; :meth:`metrics` for the logger. Driven by the guard:
    :meth:`DistillGuard.attach_replicas <distill_guard.guard.DistillGuard.attach_replicas>`.
    """

    def __init__(
        self,
        replicas: Sequence[Replica],
        reference: TeacherReference,
        *,
        router: SGLangRouter | None = None,
        min_healthy_replicas: int = 1,
        canary: CanaryCheck | None = None,
        repair_attempts: int = 3,
        repair_backoff_s: float = 1.0,
        tags: Sequence[str] | None = None,
        on_event: EventSink | None = None,
    ) -> None:
        if not replicas:
            raise GuardValueError("a replicated teacher needs at least one replica")
        if not 1 <= min_healthy_replicas <= len(replicas):
            raise GuardValueError(
                f"min_healthy_replicas must be in [1, {len(replicas)}] for {len(replicas)} "
                f"replica(s), got {min_healthy_replicas}"
            )
        self.reference = reference
        self.router = router
        self.min_healthy_replicas = min_healthy_replicas
        self._emit = on_event or (lambda kind, payload: None)
        self._members: list[_Member] = []
        self.ledger = WakeLedger()
        """The verdict of every replica wake, which the gate before the optimizer reads."""
        self.wakes = 0
        """Fleet wakes so far (a receipt's ``wake``)."""
        self._turn = 0
        self._checking = "after its wake"
        listed = {w.url for w in router.workers()} if router is not None else set()
        for replica in replicas:
            c = Canary(canary) if canary is not None else Canary()
            c.use_reference(reference)
            colocated = ColocatedTeacher(
                replica.teacher,
                c,
                repair_attempts=repair_attempts,
                repair_backoff_s=repair_backoff_s,
                tags=tags,
            )
            self._members.append(_Member(replica, colocated, in_router=replica.url in listed))

    @property
    def urls(self) -> list[str]:
        return [m.replica.url for m in self._members]

    @property
    def states(self) -> dict[str, ReplicaState]:
        return {m.replica.url: m.state for m in self._members}

    @property
    def serving(self) -> list[str]:
        """The replicas that get traffic now."""
        return [u for u, s in self.states.items() if s is ReplicaState.SERVING]

    def colocated(self, url: str) -> ColocatedTeacher:
        """The colocated teacher of one replica (its canary, its incidents)."""
        return self._member(url).colocated

    def sleep(self, step: int) -> dict[str, list[Finding]]:
        """Fingerprint and release every replica; a quarantined one is released without a
        fingerprint (it is judged against the reference alone at its wake)."""
        return {
            m.replica.url: m.colocated.sleep(step, fingerprint=m.state is ReplicaState.SERVING)
            for m in self._members
        }

    def wake(self, step: int) -> FleetWake:
        """Wake and check every replica at its own address; then take every broken one out,
        then repair each and readmit the verified ones; then the run's decision.

        All are woken before any is repaired, and all broken ones are out before the first
        repair: the router's traffic meanwhile goes to awake, verified replicas only."""
        self.wakes += 1
        wakes: list[ReplicaWake] = []
        moves: list[Move] = []
        for m in self._members:
            m.key = (m.replica.url, self.wakes, 0)
            self.ledger.open(m.key)
            findings = m.colocated.wake(step)
            self._settle(m, Verdict.FAILED if broken(findings) else Verdict.HEALTHY)
            wakes.append(ReplicaWake(m.replica.url, m.state, findings=list(findings)))
            moves.append(after_wake(m.state, findings))
        return self._act(step, wakes, moves)

    def recheck(self, step: int) -> FleetWake:
        """The canary of every serving replica again, after the step's samples were scored and
        before the optimizer uses them; a replica that fails it now fails the wake it has
        served since (its receipts are refused by the gate from now on), is taken out, repaired
        and readmitted once verified, as at a wake."""
        wakes: list[ReplicaWake] = []
        moves: list[Move] = []
        for m in self._members:
            findings: list[Finding] = []
            if m.state is ReplicaState.SERVING:
                try:
                    findings = m.colocated.canary.verify(m.replica.teacher, step=step)
                except TeacherError as e:  # not shown failed: its verdict stands
                    during = "canary after scoring"
                    findings = [teacher_error_finding(e, step, during=during, severity=WARN)]
                if broken(findings):
                    self._settle(m, Verdict.FAILED)
            wakes.append(ReplicaWake(m.replica.url, m.state, findings=list(findings)))
            moves.append(after_wake(m.state, findings) if broken(findings) else Move.KEEP)
        self._checking = "after scoring (its wake's samples are refused)"
        try:
            return self._act(step, wakes, moves, settle=False)
        finally:
            self._checking = "after its wake"

    def _act(
        self,
        step: int,
        wakes: list[ReplicaWake],
        moves: list[Move],
        *,
        settle: bool = True,
    ) -> FleetWake:
        opens = [  # a replica's incident runs from its first failed check to a clean wake
            move in (Move.QUARANTINE, Move.REPAIR) and m.colocated.incidents.current is None
            for m, move in zip(self._members, moves)
        ]
        routed = [
            move is Move.QUARANTINE and not self._quarantine(m, step, out)
            for m, out, move in zip(self._members, wakes, moves)
        ]
        exposed = []
        for m, out, move, still in zip(self._members, wakes, moves, routed):
            if move is not Move.KEEP and self._mend(m, step, out, move, still):
                exposed.append(m.replica.url)
            out.state = m.state
        for out, new in zip(wakes, opens):
            if new:
                out.alert = next(
                    (f for f in out.findings if f.code == Code.TEACHER_REPLICA_QUARANTINED),
                    next((f for f in out.findings if f.severity >= Severity.CRITICAL), None),
                )
        reasons = [f for w in wakes for f in w.findings]
        decision = fleet_decision(
            step, self.states, self.min_healthy_replicas, reasons, unquarantined=exposed
        )
        if decision.action is Action.ALERT and not any(w.alert for w in wakes):
            decision = dataclasses.replace(decision, notify=False)  # a known incident's repeat
        for m in self._members:
            if settle and m.state is ReplicaState.SERVING:  # its held traffic runs (not at a halt)
                m.colocated.settle(decision)
        return FleetWake(decision, wakes)

    def _settle(self, m: _Member, verdict: Verdict) -> None:
        if m.key is None:
            return
        if verdict is Verdict.FAILED and self.ledger.get(m.key) is not Verdict.FAILED:
            m.failed_wakes += 1
        self.ledger.settle(m.key, verdict)

    # -- metrics -----------------------------------------------------------------------------

    def metrics(self) -> dict[str, float]:
        """The fleet's :data:`REPLICA_METRICS`, for the trainer's logger beside the guard's
        (``guard/replica/<id>/...`` per replica, ``<id>`` its :func:`metric_id`)."""
        out = {
            "guard/replicas_healthy": float(len(self.serving)),
            "guard/replicas_quarantined": float(len(self._members) - len(self.serving)),
        }
        for m in self._members:
            inc = m.colocated.incidents
            base = f"guard/replica/{metric_id(m.replica.url)}/"
            out[base + "serving"] = float(m.state is ReplicaState.SERVING)
            out[base + "quarantines"] = float(m.quarantines)
            out[base + "failed_wakes"] = float(m.failed_wakes)
            out[base + "repairs"] = float(m.colocated.repairs)
            out[base + "incidents"] = float(inc.closed_count + (inc.current is not None))
        return out

    @property
    def repairs(self) -> int:
        """Verified repairs of every replica over the run."""
        return sum(m.colocated.repairs for m in self._members)

    # -- resume ------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs: the wake count, the ledger, and per replica (by address)
        its state, its router entry while it is out, its counts and its colocated state
        (canary, incidents)."""
        return {
            "wakes": self.wakes,
            "ledger": self.ledger.state_dict(),
            "replicas": {
                m.replica.url: {
                    "state": m.state.value,
                    "in_router": m.in_router,
                    "listed": dataclasses.asdict(m.listed) if m.listed is not None else None,
                    "key": list(m.key) if m.key is not None else None,
                    "quarantines": m.quarantines,
                    "failed_wakes": m.failed_wakes,
                    "colocated": m.colocated.state_dict(),
                }
                for m in self._members
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a saved fleet; a replica the state does not name keeps its own (a replica
        added since), one it names that is not here is ignored. A replica saved out of the
        router stays out until verified: the router is told nothing at the load."""
        from distill_guard.teachers.sglang_router import RouterWorker

        self.wakes = int(state.get("wakes", self.wakes))
        if "ledger" in state:
            self.ledger.load_state_dict(state["ledger"])
        saved = state.get("replicas", {})
        for m in self._members:
            mine = saved.get(m.replica.url)
            if mine is None:
                continue
            m.state = ReplicaState(mine.get("state", m.state.value))
            m.in_router = bool(mine.get("in_router", m.in_router))
            m.listed = RouterWorker(**mine["listed"]) if mine.get("listed") else None
            key = mine.get("key")
            m.key = (str(key[0]), int(key[1]), int(key[2])) if key else None
            m.quarantines = int(mine.get("quarantines", 0))
            m.failed_wakes = int(mine.get("failed_wakes", 0))
            m.colocated.load_state_dict(mine.get("colocated", {}))

    # -- receipts ----------------------------------------------------------------------------

    def receipt(self, url: str) -> WakeReceipt:
        """The receipt of a sample the replica at ``url`` scores now (its wake's verdict as it
        stands); a replica not yet woken gives a pending one."""
        m = self._member(url)
        if m.key is None:
            return WakeReceipt(m.replica.url, self.wakes)
        _, wake, repair = m.key
        return WakeReceipt(m.replica.url, wake, self.ledger.get(m.key), repair)

    def routed_receipt(self) -> WakeReceipt:
        """The receipt of a sample scored through the router: the router's answer does not say
        which replica served (``docs/sglang-contract.md`` §8, R8), so it names every serving
        replica's wake; a failure found later in any of them refuses it."""
        keys = tuple(m.key for m in self._members if m.state is ReplicaState.SERVING and m.key)
        verdict = worst(self.ledger.get(k) for k in keys) if keys else Verdict.PENDING
        return WakeReceipt(None, self.wakes, verdict, candidates=keys)

    def score(
        self, sequences: Sequence[Sequence[int]], **kw: Any
    ) -> tuple[ScoreResult, WakeReceipt]:
        """Score on the next serving replica (the guard's own round robin, where the trainer
        routes) and say which replica and wake scored: ``(result, receipt)``."""
        serving = [m for m in self._members if m.state is ReplicaState.SERVING]
        if not serving:
            raise TeacherError("no teacher replica serves: every one is quarantined")
        m = serving[self._turn % len(serving)]
        self._turn += 1
        receipt = self.receipt(m.replica.url)
        return m.replica.teacher.score(sequences, **kw), receipt

    def gate(self, receipts: Sequence[WakeReceipt]) -> GateResult:
        """:func:`~distill_guard.live.receipts.gate` with the verdicts as they are now."""
        return gate(receipts, self.ledger.verdicts)

    def _member(self, url: str) -> _Member:
        base = url.rstrip("/")
        for m in self._members:
            if m.replica.url == base:
                return m
        raise GuardValueError(f"{base} is not a replica of this teacher")

    def _mend(self, m: _Member, step: int, out: ReplicaWake, move: Move, routed: bool) -> bool:
        """Repair a broken replica (``move``: quarantine or repair) and readmit it once
        verified, or readmit a clean quarantined one; whether it is broken and still routed
        (its removal failed, ``routed``, and its repair did not verify)."""
        if move in (Move.QUARANTINE, Move.REPAIR):
            out.moves.append(Move.REPAIR)
            cause = [f for f in out.findings if f.severity >= Severity.CRITICAL]
            outcome, _ = m.colocated.repair(step, cause, self._on_repair(m.replica.url))
            out.findings += outcome.findings
            if outcome.ok and m.key is not None:  # what it serves from now on: the reload's
                url, wake, repair = m.key
                m.key = (url, wake, repair + 1)
                self.ledger.open(m.key)
                self.ledger.settle(m.key, Verdict.HEALTHY)
            if after_repair(outcome.ok) is None or routed:  # not verified, or never taken out
                return routed and not outcome.ok
        out.moves.append(Move.READMIT)
        self._readmit(m, step, out)
        return False

    def _on_repair(self, url: str) -> EventSink:
        return lambda kind, payload: self._emit(kind, {**payload, "url": url})

    def _quarantine(self, m: _Member, step: int, out: ReplicaWake) -> bool:
        """Take ``m`` out of the router (where it was listed); whether it is out."""
        url = m.replica.url
        out.moves.append(Move.QUARANTINE)
        codes = sorted({f.code for f in out.findings if f.severity >= Severity.CRITICAL})
        if self.router is not None and m.in_router:
            try:
                m.listed = self.router.remove(url)
            except TeacherError as e:
                out.findings.append(self._router_failed(step, url, "take it out", e, critical=True))
                return False
        m.state = ReplicaState.QUARANTINED
        m.quarantines += 1
        how = (
            f"taken out of router {self.router.url} (DELETE /workers/{m.listed.id})"
            if m.listed is not None and self.router is not None
            else "taken out of the trainer's replica list (ReplicatedTeacher.serving)"
        )
        out.findings.append(
            Finding(
                Code.TEACHER_REPLICA_QUARANTINED,
                Severity.WARN,
                f"Teacher replica {m.replica.name} failed its check {self._checking} "
                f"({', '.join(codes)}) and was {how}: it serves no sample until it is repaired "
                "and verified against the checkpoint's reference. The run trains on the "
                f"{len(self.serving)} other serving replica(s) meanwhile.",
                step,
                {"replica": url, "codes": codes, "serving": self.serving},
            )
        )
        self._emit("replica.quarantined", {"url": url, "step": step, "codes": codes})
        return True

    def _readmit(self, m: _Member, step: int, out: ReplicaWake) -> None:
        """Put a verified replica back (the router, where it had listed it)."""
        url = m.replica.url
        if self.router is not None and m.in_router:
            try:
                self.router.add(url, m.listed)
            except TeacherError as e:
                out.findings.append(
                    self._router_failed(step, url, "put it back", e, critical=False)
                )
                return
        m.state, m.listed = ReplicaState.SERVING, None
        out.findings.append(
            Finding(
                Code.TEACHER_REPLICA_READMITTED,
                Severity.INFO,
                f"Teacher replica {m.replica.name} was verified against the checkpoint's "
                f"reference ({self.reference.source}) and serves again.",
                step,
                {"replica": url},
            )
        )
        self._emit("replica.readmitted", {"url": url, "step": step})

    def _router_failed(
        self, step: int, url: str, what: str, error: Exception, *, critical: bool
    ) -> Finding:
        assert self.router is not None
        self._emit("replica.router_failed", {"url": url, "step": step, "error": str(error)})
        return Finding(
            Code.TEACHER_ROUTER_FAILED,
            Severity.CRITICAL if critical else Severity.WARN,
            f"Router {self.router.url} did not {what} for replica {url}: "
            f"{type(error).__name__}: {error}. "
            + (
                "It may still route samples to a replica that failed its check."
                if critical
                else "The replica is verified but stays out; the guard tries again at its "
                "next wake."
            ),
            step,
            {"replica": url, "router": self.router.url, "error": str(error)},
        )
