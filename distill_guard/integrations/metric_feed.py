"""After the update: a step's metrics, by the framework's names, handed to the guard."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from distill_guard.guard import DistillGuard
from distill_guard.metric_names import as_float, pick_metrics
from distill_guard.observations import Metric
from distill_guard.policy import Decision


@dataclass
class MetricFeed:
    """Reads a step's metrics under the framework's names and hands them to the guard's
    ``on_step_metrics`` once per step, with what the step's own observation already said."""

    guard: DistillGuard
    names: dict[str, str]
    """``{role: framework name}``, resolved by :mod:`distill_guard.metric_names` as replay does."""
    loss_judged_before_update: bool = False
    """The raw loss was judged before the update: it is not judged again from the logs."""
    step_entropy: float | None = None
    """The student's entropy of the step from the fused loss, reported when the logs lack it."""

    def after_update(self, step: int, metrics: Mapping[str, float | None]) -> Decision:
        """Metrics keyed by :class:`~distill_guard.observations.Metric` roles."""
        return self._judge(step, metrics, self._take_entropy())

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
        metrics = pick_metrics(logs, names)
        wants_entropy = roles is None or Metric.STUDENT_ENTROPY in roles
        if not metrics and skip_if_absent and not (wants_entropy and self.step_entropy is not None):
            return None
        return self._judge(step, metrics, self._take_entropy() if wants_entropy else None)

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
