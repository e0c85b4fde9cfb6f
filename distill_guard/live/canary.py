"""The canary run against a live teacher: measured just before sleep, again just after wake.

:class:`Canary` does the teacher calls and keeps the reference; the judgement itself is the pure
:class:`~distill_guard.checks.canary.CanaryCheck`.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from distill_guard.checks.canary import CanaryCheck, CanaryComparison, CanaryMeasurement
from distill_guard.errors import GuardTypeError
from distill_guard.findings import Code, Finding, Severity
from distill_guard.live.teacher_temperature import takes_temperature
from distill_guard.teachers.base import Teacher, TeacherError

log = logging.getLogger("distill_guard")

if TYPE_CHECKING:
    from distill_guard.live.teacher_reference import TeacherReference


class Canary:
    """Scores a fixed sequence on a teacher; holds the fingerprint a wake is compared with.

    Build it from a :class:`CanaryCheck` (the Hydra node ``checks.canary``) or from that check's
    fields: ``Canary(top_k=8)``.
    """

    def __init__(self, check: CanaryCheck | None = None, **fields: Any) -> None:
        if check is not None and fields:
            raise GuardTypeError("give a CanaryCheck or its fields, not both")
        self.check = check if check is not None else CanaryCheck(**fields)
        self.vocab_size: int | None = self.check.vocab_size
        """V: configured, else asked of the teacher, else inferred from a flat response."""
        self._tokens: list[int] | None = None
        self._fingerprint: CanaryMeasurement | None = None
        self._deterministic: bool | None = None
        self.last_comparison: CanaryComparison | None = None
        """What the last judgement measured."""
        self.reference: TeacherReference | None = None
        """The checkpoint's reference (:meth:`use_reference`): every judgement is held against
        it too, and a repair against it alone."""
        self.last_reference_values: dict[str, Any] | None = None
        """What the last judgement against the reference measured."""
        self.serving_dtype: str | None = None
        """The dtype the teacher serves in (its server info's ``dtype``, a module's parameters):
        the kernel tolerance against the reference is that dtype's."""

    @property
    def top_k(self) -> int:
        return self.check.top_k

    @property
    def length(self) -> int:
        return len(self._tokens) if self._tokens is not None else self.check.length

    @property
    def last_fingerprint(self) -> CanaryMeasurement | None:
        return self._fingerprint

    # -- what the teacher is -----------------------------------------------------------------

    def resolve_vocab_size(self, teacher: Teacher | None) -> int | None:
        """V from the configuration, else from the teacher; None if neither can tell."""
        if self.vocab_size is None and teacher is not None:
            try:
                self.vocab_size = teacher.vocab_size
            except TeacherError:
                return None
        return self.vocab_size

    def canary_tokens(self, teacher: Teacher | None = None) -> list[int]:
        """The sequence, drawn on first use and then fixed."""
        if self._tokens is None:
            self._tokens = self.check.draw_tokens(self.resolve_vocab_size(teacher))
        return list(self._tokens)

    def is_deterministic(self, teacher: Teacher | None) -> bool:
        """The configured flag, else the teacher's ``enable_deterministic_inference``."""
        if self.check.deterministic is not None:
            return self.check.deterministic
        if self._deterministic is None:
            try:
                info = teacher.server_info() if teacher is not None else {}
            except TeacherError:
                return False  # unknown: the wider tolerance, not a false alarm; ask again later
            self._deterministic = bool(info.get("enable_deterministic_inference", False))
        return self._deterministic

    def use_reference(self, reference: TeacherReference) -> None:
        """Hold every measurement against ``reference`` too; the canary takes its tokens (a
        fingerprint of other tokens is dropped: it cannot be compared any more)."""
        if self._tokens is not None and self._tokens != list(reference.tokens):
            self._fingerprint = None
        self._tokens = list(reference.tokens)
        if self.vocab_size is None and reference.vocab_size:
            self.vocab_size = int(reference.vocab_size)
        self.reference = reference
        self._reference_measurement = reference.measurement()  # judged against at every wake

    # -- measuring ---------------------------------------------------------------------------

    def measure(self, teacher: Teacher, step: int | None = None) -> CanaryMeasurement:
        """One scoring call on the canary. Raises :class:`TeacherError` if the teacher fails."""
        tokens = self.canary_tokens(teacher)
        t0 = time.perf_counter()
        kwargs: dict[str, Any] = {}
        ref = self.reference
        if ref is not None and ref.temperature != 1.0 and takes_temperature(teacher):
            kwargs["temperature"] = ref.temperature  # asked as the run asks for its scores
        res = teacher.score([tokens], top_k=self.top_k, logprob_start_len=0, **kwargs)
        seconds = time.perf_counter() - t0
        return CanaryMeasurement(
            tokens=tokens,
            token_logprobs=res.token_logprobs[0].tolist(),
            topk_logprobs=res.topk_logprobs[0].tolist() if res.topk_logprobs else None,
            topk_ids=res.topk_ids[0].tolist() if res.topk_ids else None,
            step=step,
            seconds=seconds,
        )

    def fingerprint(self, teacher: Teacher, step: int | None = None) -> CanaryMeasurement:
        """Score the canary and keep it as the reference for the next ``verify`` (before sleep)."""
        self.is_deterministic(teacher)
        self._fingerprint = self.measure(teacher, step)
        return self._fingerprint

    def accept(self, measured: CanaryMeasurement) -> None:
        """Keep a measurement already judged clean as the next reference."""
        self._fingerprint = measured

    def verify(
        self, teacher: Teacher, step: int | None = None, *, repair: bool = False
    ) -> list[Finding]:
        """Score the canary after wake and judge it; empty when the teacher is as it was.

        ``repair``: the verification of a reload. With a reference it is judged against the
        reference alone (the truth), not against the last fingerprint, which may be the
        fault's own (a teacher wrong from its first wake).

        Raises :class:`TeacherError` when the teacher cannot be scored.
        """
        return self.judge(self.measure(teacher, step), teacher=teacher, repair=repair)

    def judge(
        self,
        measured: CanaryMeasurement,
        teacher: Teacher | None = None,
        *,
        repair: bool = False,
    ) -> list[Finding]:
        """Judge a measurement against the fingerprint and the reference; remembers a V
        inferred from it."""
        skip_fingerprint = repair and self.reference is not None
        findings, comparison = self.check.judge(
            measured,
            None if skip_fingerprint else self._fingerprint,
            vocab_size=self.resolve_vocab_size(teacher),
            deterministic=self.is_deterministic(teacher),
        )
        if comparison.vocab_inferred:
            self.vocab_size = comparison.vocab_size
        self.last_comparison = comparison
        ref = self.reference
        if ref is not None:
            tolerance_mean, tolerance_max = ref.tolerance(self._serving_dtype(teacher))
            wrong, self.last_reference_values = self.check.judge_reference(
                measured,
                self._reference_measurement,
                tolerance_mean=tolerance_mean,
                tolerance_max=tolerance_max,
                source=ref.source,
                temperature=ref.temperature,
            )
            if wrong is not None and not any(f.severity is Severity.CRITICAL for f in findings):
                findings.append(wrong)
        return findings

    def _serving_dtype(self, teacher: Teacher | None) -> str | None:
        """The configured dtype, else the teacher's ``dtype`` server argument (asked once)."""
        if self.serving_dtype is None and teacher is not None:
            try:
                dtype = teacher.server_info().get("dtype")
            except TeacherError:
                return None  # the widest tolerance this time; ask again later
            self.serving_dtype = str(dtype) if dtype else "auto"
        return self.serving_dtype

    def forget(self) -> None:
        """Drop the fingerprint: the next verify has no reference (uniform and non-finite only)."""
        self._fingerprint = None

    # -- state -------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "tokens": self._tokens,
            "vocab_size": self.vocab_size,
            "fingerprint": self._fingerprint.to_dict() if self._fingerprint else None,
            "reference": self.reference.to_dict() if self.reference is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._tokens = list(state["tokens"]) if state.get("tokens") is not None else None
        saved = state.get("vocab_size")
        if saved is not None and self.check.vocab_size is None:  # a configured V is kept
            self.vocab_size = int(saved)
        elif saved is not None and int(saved) != self.check.vocab_size:
            log.warning(
                "distill_guard: the saved canary vocabulary size %s differs from the configured "
                "checks.canary.vocab_size %s; the configured one is kept. Check that the run "
                "resumes with the teacher it was saved with.",
                saved,
                self.check.vocab_size,
            )
        fp = state.get("fingerprint")
        self._fingerprint = CanaryMeasurement.from_dict(fp) if fp else None
        if state.get("reference"):
            from distill_guard.live.teacher_reference import TeacherReference

            self.use_reference(TeacherReference.from_dict(state["reference"]))


def teacher_error_finding(
    error: Exception,
    step: int | None = None,
    *,
    during: str = "",
    severity: Severity = Severity.CRITICAL,
) -> Finding:
    """``teacher.unreachable`` for a teacher call that failed, naming the call and the error.

    Critical where the guard needed the answer (a repair, a probe); a warning where it only
    could not check this step (the canary at a wake), so training continues.
    """
    where = f" during {during}" if during else ""
    if during == "resume":
        where += " (the teacher was left asleep; nothing scored now would be its own)"
    if severity is Severity.CRITICAL:
        advice = (
            "The teacher cannot be checked or used until it answers; check that the server is up "
            "and reachable (and its API key)."
        )
    else:
        advice = (
            "The guard could not check it this step; training continues. Check the teacher "
            "server's health and the configured timeout."
        )
    return Finding(
        Code.TEACHER_UNREACHABLE,
        severity,
        f"Teacher call failed{where}: {type(error).__name__}: {error}. {advice}",
        step,
        {"error": str(error), "error_type": type(error).__name__, "during": during},
    )
