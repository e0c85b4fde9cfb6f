"""Multi-teacher OPD (MOPD): samples routed to several teachers, each route's teacher guarded on
its own, with its own reference.

A route (``"math"``, ``"code"``) is one teacher: a
:class:`~distill_guard.live.replicas.ReplicatedTeacher` (one replica or several) with its own
checkpoint's reference and its own ``min_healthy_replicas``, as Relax runs one
``TeacherManager`` per teacher. :class:`TeacherRoutes` sleeps, wakes and rechecks each route's
teacher by itself; a route that fails (below its bound, or its teacher unreachable) is *down*:
it scores nothing (:meth:`TeacherRoutes.score` raises), what its failed wakes scored is refused,
and the other routes train on. Only a route marked ``required``, or every route down at once,
halts the run (:func:`routes_decision`, pure)::

    each route ─► its fleet's decision ─► halt? ─► required ─► the run halts
                                                └► not ───► the route is down, the rest train
    every route down ─► the run halts (nothing is left to train on)

Receipts carry the route (:class:`RouteReceipt`); :func:`route_gate` judges each one against
its own route's ledger only, so a failed wake of one route refuses exactly that route's samples.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from distill_guard.errors import GuardRuntimeError, GuardValueError
from distill_guard.findings import Finding
from distill_guard.live.canary import teacher_error_finding
from distill_guard.live.receipts import GateResult, Verdict, WakeKey, WakeReceipt, current
from distill_guard.policy import Action, Decision
from distill_guard.teachers.base import TeacherError

if TYPE_CHECKING:
    from distill_guard.live.replicas import FleetWake, ReplicatedTeacher
    from distill_guard.teachers.base import ScoreResult


class RouteDownError(GuardRuntimeError):
    """A sample sent to a route that is down (its last wake or recheck failed it): route it
    elsewhere or drop it; nothing it would score could train the student."""


@dataclass
class Route:
    """One MOPD route and the teacher that scores its samples."""

    name: str
    """The route's name, as the trainer routes samples (``"math"``)."""
    teacher: ReplicatedTeacher
    """Its teacher, with its own checkpoint's reference and ``min_healthy_replicas``."""
    required: bool = False
    """True: the run cannot train without this route, so its halt is the run's. False: a failed
    route is down and the others train on."""


@dataclass(frozen=True)
class RouteReceipt:
    """Which route, and which of its teacher's replica wakes, scored a sample."""

    route: str
    receipt: WakeReceipt
    """The route's teacher's own receipt (its replica, wake and repair)."""

    def to_dict(self) -> dict[str, Any]:
        return {"route": self.route, **self.receipt.to_dict()}


def route_gate(
    receipts: Sequence[RouteReceipt], verdicts: Mapping[str, Mapping[WakeKey, Verdict]]
) -> GateResult:
    """:func:`~distill_guard.live.receipts.gate` across routes: each receipt judged against its
    own route's verdicts only (a route the mapping does not name: pending, held), so one route's
    failed wake never refuses another route's samples, even at the same address."""
    out: dict[Verdict, list[int]] = {v: [] for v in Verdict}
    for i, r in enumerate(receipts):
        out[current(r.receipt, verdicts.get(r.route, {}))].append(i)
    return GateResult(
        tuple(out[Verdict.HEALTHY]), tuple(out[Verdict.FAILED]), tuple(out[Verdict.PENDING])
    )


def _tagged(route: str, findings: Iterable[Finding]) -> tuple[Finding, ...]:
    """The findings with the route named in their values and message."""
    return tuple(
        dataclasses.replace(
            f, message=f"[route {route}] {f.message}", values={**f.values, "route": route}
        )
        for f in findings
    )


def routes_decision(
    step: int,
    decisions: Mapping[str, Decision],
    required: Iterable[str],
    already_down: Iterable[str] = (),
) -> Decision:
    """The run's decision from each route's own: halt when a ``required`` route halts or when
    every route halts; otherwise the halted routes are down (an alert) and the rest train on.

    Each reason carries its route (``values["route"]``, ``[route NAME]`` in its message). It
    notifies when a route goes down now (not one in ``already_down``) or an up route's decision
    notifies: a route that stays down is one alert, as a replica's incident is."""
    must, before = set(required), set(already_down)
    down = sorted(r for r, d in decisions.items() if d.action is Action.HALT)
    reasons = tuple(f for r, d in decisions.items() for f in _tagged(r, d.reasons))
    fatal = sorted(must.intersection(down))
    if fatal or (decisions and len(down) == len(decisions)):
        why = (
            f"required route(s) {', '.join(fatal)} failed"
            if fatal
            else f"every route is down ({', '.join(down)})"
        )
        return Decision(step, Action.HALT, reasons, message=f"halt: {why}")
    up = {r: d for r, d in decisions.items() if r not in down}
    alerting = [d for d in up.values() if d.action is not Action.CONTINUE]
    if not down and not alerting:
        return Decision(step, Action.CONTINUE, reasons, message=f"routes up: {', '.join(up)}")
    notify = bool(set(down) - before) or any(d.notify for d in alerting)
    message = f"routes up: {', '.join(up)}" + (
        f"; down: {', '.join(down)} (they score nothing until a wake verifies them)" if down else ""
    )
    return Decision(step, Action.ALERT, reasons, message=message, notify=notify)


@dataclass
class RoutesWake:
    """A wake (or recheck) of every route, and the run's decision from them."""

    decision: Decision
    """The run's (:func:`routes_decision`)."""
    routes: dict[str, FleetWake | None]
    """Each route's fleet wake; None where its teacher could not be reached at all."""
    down: list[str]
    """The routes that score nothing now."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "decision": self.decision.to_dict(),
            "routes": {r: w.to_dict() if w else None for r, w in self.routes.items()},
            "down": list(self.down),
        }


class TeacherRoutes:
    """The teachers of an MOPD run, one per route, each guarded on its own.

    Args:
        routes: the routes (:class:`Route`), each with its own
            :class:`~distill_guard.live.replicas.ReplicatedTeacher`; names unique, and no
            replica address in two routes (one server slept twice is killed by SGLang).

    Around a step, as for one replicated teacher: :meth:`wake`, :meth:`score` per sample (by
    its route), :meth:`recheck` after the scoring, :meth:`gate` before the optimizer,
    :meth:`sleep`; :meth:`metrics` for the logger, :meth:`state_dict` for the checkpoint.
    """

    def __init__(self, routes: Sequence[Route]) -> None:
        if not routes:
            raise GuardValueError("MOPD needs at least one route")
        self._routes: dict[str, Route] = {}
        owner: dict[str, str] = {}
        for r in routes:
            if r.name in self._routes:
                raise GuardValueError(f"route {r.name!r} is given twice")
            for url in r.teacher.urls:
                if url in owner:
                    raise GuardValueError(
                        f"replica {url} is in routes {owner[url]!r} and {r.name!r}: each "
                        "route's teacher is its own servers"
                    )
                owner[url] = r.name
            self._routes[r.name] = r
        self.down: set[str] = set()
        """Routes whose last wake or recheck failed them: they score nothing until a wake
        brings them back."""

    @property
    def names(self) -> list[str]:
        return list(self._routes)

    @property
    def required(self) -> list[str]:
        return [n for n, r in self._routes.items() if r.required]

    def teacher(self, route: str) -> ReplicatedTeacher:
        """The route's teacher."""
        return self._route(route).teacher

    def sleep(self, step: int) -> dict[str, list[Finding]]:
        """Sleep every route's teacher; one that cannot be reached is reported, not raised."""
        out: dict[str, list[Finding]] = {}
        for name, r in self._routes.items():
            try:
                found = r.teacher.sleep(step)
                out[name] = list(_tagged(name, (f for fs in found.values() for f in fs)))
            except TeacherError as e:
                out[name] = list(_tagged(name, [teacher_error_finding(e, step, during="sleep")]))
        return out

    def wake(self, step: int) -> RoutesWake:
        """Wake and check each route's teacher against its own reference, then the run's
        decision; a route's down-ness is set anew (a route comes back once its wake verifies
        enough replicas)."""
        return self._each(step, "wake")

    def recheck(self, step: int) -> RoutesWake:
        """Each up route's canaries after the scoring (:meth:`ReplicatedTeacher.recheck`)."""
        return self._each(step, "recheck", skip=set(self.down))

    def _each(self, step: int, how: str, skip: Iterable[str] = ()) -> RoutesWake:
        fleets: dict[str, FleetWake | None] = {}
        decisions: dict[str, Decision] = {}
        for name, r in self._routes.items():
            if name in skip:
                decisions[name] = Decision(step, Action.HALT, (), message="down", notify=False)
                fleets[name] = None
                continue
            try:
                fleet = getattr(r.teacher, how)(step)
            except TeacherError as e:
                finding = teacher_error_finding(e, step, during=f"route {name}'s {how}")
                fleets[name], decisions[name] = None, Decision(step, Action.HALT, (finding,))
                continue
            fleets[name], decisions[name] = fleet, fleet.decision
        before = set(self.down)
        self.down = {n for n, d in decisions.items() if d.action is Action.HALT}
        decision = routes_decision(step, decisions, self.required, before)
        return RoutesWake(decision, fleets, sorted(self.down))

    def score(
        self, route: str, sequences: Sequence[Sequence[int]], **kw: Any
    ) -> tuple[ScoreResult, RouteReceipt]:
        """Score on the route's teacher (its next serving replica): ``(result, receipt)``; a
        route that is down raises :class:`RouteDownError`."""
        r = self._route(route)
        if route in self.down:
            raise RouteDownError(f"route {route!r} is down: its teacher failed its last check")
        result, receipt = r.teacher.score(sequences, **kw)
        return result, RouteReceipt(route, receipt)

    def routed_receipt(self, route: str) -> RouteReceipt:
        """The receipt of a sample scored through the route's router."""
        return RouteReceipt(route, self._route(route).teacher.routed_receipt())

    def gate(self, receipts: Sequence[RouteReceipt]) -> GateResult:
        """:func:`route_gate` with every route's verdicts as they are now."""
        return route_gate(receipts, {n: r.teacher.ledger.verdicts for n, r in self._routes.items()})

    def metrics(self) -> dict[str, float]:
        """Each route's teacher's metrics under ``guard/route/<name>/`` (``guard/replicas_healthy``
        becomes ``guard/route/math/replicas_healthy``), and ``guard/route/<name>/up``."""
        out: dict[str, float] = {}
        for name, r in self._routes.items():
            base = f"guard/route/{name}/"
            out[base + "up"] = float(name not in self.down)
            out.update({base + k.removeprefix("guard/"): v for k, v in r.teacher.metrics().items()})
        return out

    def state_dict(self) -> dict[str, Any]:
        """Each route's teacher's state (its ledger, its replicas), and the routes down."""
        return {
            "routes": {n: r.teacher.state_dict() for n, r in self._routes.items()},
            "down": sorted(self.down),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore each route by name; a route the state does not name keeps its own, one it
        names that is not here is ignored."""
        for name, saved in state.get("routes", {}).items():
            if name in self._routes:
                self._routes[name].teacher.load_state_dict(saved)
        self.down = {n for n in state.get("down", []) if n in self._routes}

    def _route(self, route: str) -> Route:
        try:
            return self._routes[route]
        except KeyError:
            raise GuardValueError(
                f"no route {route!r}; routes: {', '.join(self._routes)}"
            ) from None
