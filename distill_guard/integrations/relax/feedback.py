"""The SDPO branch's per-sample gate: Relax's feedback hook ``check_transfer_channels``.

On redai-infra/Relax's SDPO line (``--opd-feedback-class``), Relax calls the feedback class's
``check_transfer_channels(sample, channels, top_k)`` for every sample after teacher scoring and
before the sample is converted and queued, in the top-K modes (``docs/relax.md`` §3). A sample
whose teacher top-K is uniform or non-finite is kept out of every loss term there
(``opd_sample_mask = False``, ``remove_sample``); ``guard_on_collapse="raise"`` fails the rollout
instead (Relax does not catch it: the rollout service stops). Current redai-studio/Relax has no
such flag; there the dynamic sampling filter is the gate (:mod:`.gate`).
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

from distill_guard.checks import TeacherCollapseCheck
from distill_guard.errors import GuardError, GuardValueError
from distill_guard.findings import Finding, Severity
from distill_guard.integrations.relax import samples as fields
from distill_guard.observations import RunSpec, TeacherScores

log = logging.getLogger("distill_guard")


class TeacherCollapseError(GuardError, RuntimeError):
    """Raised for a sample whose teacher top-K is dead, with ``guard_on_collapse="raise"``."""


class TeacherCollapseFeedbackMixin:
    """Per-sample check in ``check_transfer_channels``. Keyword arguments, through
    ``--opd-feedback-kwargs``: ``guard_vocab_size`` (else ``DISTILL_GUARD_VOCAB_SIZE``, else
    inferred from the values), ``guard_atol``, ``guard_on_collapse`` (``mask``, the default, or
    ``raise``), ``guard_token_selection`` (``student_topk``, the one selection the SDPO
    feedback accepts: the rows are the teacher's logprobs of the student's ids)."""

    def __init__(
        self,
        *args: Any,
        guard_vocab_size: int | None = None,
        guard_atol: float = 1e-3,
        guard_on_collapse: str = "mask",
        guard_token_selection: str = "student_topk",
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        env_v = os.environ.get("DISTILL_GUARD_VOCAB_SIZE")
        if guard_on_collapse not in ("raise", "mask"):
            raise GuardValueError(
                f"guard_on_collapse must be 'raise' or 'mask', got {guard_on_collapse!r}"
            )
        self.guard_run = RunSpec(vocab_size=guard_vocab_size or (int(env_v) if env_v else None))
        self.guard_check = TeacherCollapseCheck(atol=guard_atol)
        self.guard_on_collapse = guard_on_collapse
        self.guard_token_selection = guard_token_selection
        self.guard_collapsed = 0

    def check_transfer_channels(self, sample: Any, channels: Any, top_k: int) -> Any:
        bad = self._guard_judge(sample, channels)
        if bad is not None:
            self.guard_collapsed += 1
            if self.guard_on_collapse == "raise":
                raise TeacherCollapseError(bad.message)
            fields.mask_out([sample])
            log.error("distill_guard: sample kept out of the loss: %s", bad.message)
        parent = getattr(super(), "check_transfer_channels", None)
        return parent(sample, channels, top_k) if parent is not None else None

    def _guard_judge(self, sample: Any, channels: Any) -> Finding | None:
        """The first critical finding on the sample's teacher top-K, or None (also on bad data)."""
        try:
            values = channels.get(fields.TOPK_FIELD) if hasattr(channels, "get") else None
            if values is None:
                return None
            rows = fields.topk_rows(values, channels.get(fields.TOPK_LEN_FIELD))
            judged = fields.as_judged(fields.TeacherValues(None, rows), self.guard_token_selection)
            scores = TeacherScores(
                getattr(sample, "index", 0) or 0, topk_logprobs=rows, topk_own=judged.topk_own
            )
            found = self.guard_check.on_teacher_scores(scores, self.guard_run)
        except Exception:  # noqa: BLE001 - the guard's own fault must not fail the sample
            log.exception("distill_guard: could not check a sample's teacher top-K")
            return None
        return next((f for f in found if f.severity is Severity.CRITICAL), None)


class _NoRelaxFeedback:
    """Base used when Relax is not installed (tests, docs): the hooks do nothing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.kwargs = kwargs

    def check_student_topk_ids(self, sample: Any, top_k: int) -> None:
        return None

    def check_transfer_channels(self, sample: Any, channels: Any, top_k: int) -> None:
        return None


FEEDBACK_BASES = {
    "GuardedGoldenAnswerSDPOFeedback": (
        "relax.utils.opd.sdpo.feedback",
        "GoldenAnswerSDPOFeedback",
    ),
    "GuardedSDPOFeedback": ("relax.utils.opd.sdpo.feedback", "SDPOFeedback"),
    "GuardedOPDFeedback": ("relax.utils.opd.feedback", "OPDFeedback"),
}
"""Our class name → the Relax class it subclasses (SDPO branch, ``relax/utils/opd``)."""


@functools.cache
def feedback_class(name: str) -> type:
    """``GuardedGoldenAnswerSDPOFeedback`` & co., built on first access over Relax's class (a
    stand-in base where Relax is not installed)."""
    module, base_name = FEEDBACK_BASES[name]
    try:
        base = getattr(__import__(module, fromlist=[base_name]), base_name)
    except (ImportError, AttributeError):
        base = _NoRelaxFeedback
    return type(
        name,
        (TeacherCollapseFeedbackMixin, base),
        {"__module__": "distill_guard.integrations.relax"},
    )
