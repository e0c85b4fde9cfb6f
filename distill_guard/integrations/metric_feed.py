"""After the update: a step's metrics, by the framework's names, handed to the guard."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from distill_guard.guard import DistillGuard
from distill_guard.metric_names import (
    METRIC_CANDIDATES,
    Names,
    as_float,
    lookalikes,
    pick_resolved,
    resolve_key,
    resolve_names,
)
from distill_guard.observations import Metric
from distill_guard.policy import Decision

log = logging.getLogger("distill_guard")


@dataclass
class MetricFeed:
    """Reads a step's metrics under the framework's names and hands them to the guard's
    ``on_step_metrics`` once per step, with what the step's own observation already said.

    A key that is read as no role but looks like one that has not been read in the run so far
    (:func:`~distill_guard.metric_names.lookalikes`) is told once per key, at INFO on the
    ``distill_guard`` logger: never a warning or a finding, a healthy run stays quiet."""

    guard: DistillGuard
    names: Names
    """``{role: framework name or names}``, resolved by :mod:`distill_guard.metric_names` as
    replay does."""
    loss_judged_before_update: bool = False
    """The raw loss was judged before the update: it is not judged again from the logs."""
    step_entropy: float | None = None
    """The student's entropy of the step from the fused loss, reported when the logs lack it."""
    _read: set[str] = field(default_factory=set, repr=False)
    """Roles read at least once in the run (their look-alikes are not news)."""
    _told: set[str] = field(default_factory=set, repr=False)

    def after_update(self, step: int, metrics: Mapping[str, float | None]) -> Decision:
        """Metrics keyed by :class:`~distill_guard.observations.Metric` roles, or by any known
        convention's names (``entropy``, ``train/entropy_loss``, ``completions/clipped_ratio``,
        ...: :data:`~distill_guard.metric_names.METRIC_CANDIDATES`); a role key wins over an
        alias of its role."""
        given = {k: v for k, v in metrics.items() if k in Metric.ALL}
        others = {k: v for k, v in metrics.items() if k not in given}
        wanted = {r: names for r, names in METRIC_CANDIDATES.items() if r not in given}
        keys = resolve_names(wanted, others.keys())
        # every known name of a role is that role, read under one key only: not passed on
        aliases = {
            key
            for names in METRIC_CANDIDATES.values()
            for name in names
            if (key := resolve_key(name, others)) is not None
        }
        unread = {k: v for k, v in others.items() if k not in aliases}
        picked = pick_resolved(others, keys)
        read: dict[str, Any] = {**picked, **given}
        if self.step_entropy is not None:  # the fused loss reports it
            read.setdefault(Metric.STUDENT_ENTROPY, self.step_entropy)
        self._tell_lookalikes(
            unread, read, Metric.ALL, "hand it to after_update as '{role}' if it is"
        )
        # keys of no role go on as they came (the non-finite check reads every value)
        values = {**unread, **picked, **given}
        return self._judge(step, values, self._take_entropy())

    def after_logs(
        self,
        step: int,
        logs: Mapping[str, Any],
        roles: Sequence[str] | None,
        *,
        skip_if_absent: bool,
    ) -> Decision | None:
        """Logged metrics by framework name (only ``roles`` if given); None, and nothing
        judged, when none was logged and ``skip_if_absent``."""
        names = self.names
        if roles is not None:
            names = {role: names[role] for role in roles if role in names}
        keys = resolve_names(names, logs.keys())
        metrics = pick_resolved(logs, keys)
        wants_entropy = roles is None or Metric.STUDENT_ENTROPY in roles
        read: dict[str, Any] = dict(metrics)
        if wants_entropy and self.step_entropy is not None:  # the fused loss reports it
            read[Metric.STUDENT_ENTROPY] = self.step_entropy
        self._tell_lookalikes(
            set(logs) - set(keys.values()),
            read,
            Metric.ALL if roles is None else roles,
            "map it with metric_keys={{'{role}': '{key}'}} if it is",
        )
        if not metrics and skip_if_absent and not (wants_entropy and self.step_entropy is not None):
            return None
        return self._judge(step, metrics, self._take_entropy() if wants_entropy else None)

    def _tell_lookalikes(
        self, unread: Iterable[str], read: Mapping[str, Any], roles: Iterable[str], how: str
    ) -> None:
        """Tell once per key, at INFO, of a key that looks like a role not read so far
        (``how``: what to do about it, with ``{key}`` and ``{role}``)."""
        self._read.update(role for role, v in read.items() if v is not None)
        fresh = [k for k in unread if k not in self._told]
        if not fresh:
            return
        for key, role in lookalikes(fresh, set(roles) - self._read).items():
            self._told.add(key)
            log.info(
                "distill_guard: metric '%s' looks like %s but was not read; %s",
                key,
                role,
                how.format(key=key, role=role),
            )

    def _take_entropy(self) -> float | None:
        entropy, self.step_entropy = self.step_entropy, None
        return entropy

    def _judge(
        self, step: int, metrics: Mapping[str, float | None], entropy: float | None
    ) -> Decision:
        values = {k: as_float(v) for k, v in metrics.items() if v is not None}
        if entropy is not None:
            values.setdefault(Metric.STUDENT_ENTROPY, entropy)
        if self.loss_judged_before_update:
            values.pop(Metric.LOSS, None)
        return self.guard.on_step_metrics(step, values)
