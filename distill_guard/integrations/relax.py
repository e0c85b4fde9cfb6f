"""Relax: the guard through Relax's function-path hooks (``docs/relax.md`` §3).

Load with Relax's own flags; nothing in Relax needs patching::

    --custom-rollout-log-function-path distill_guard.integrations.relax.rollout_log_function
    --custom-eval-rollout-log-function-path distill_guard.integrations.relax.eval_rollout_log_function
    --opd-feedback-class distill_guard.integrations.relax.GuardedGoldenAnswerSDPOFeedback

:func:`rollout_log_function` runs in the rollout process once per step, after the teacher
prefill and (as in slime, inferred for Relax) before the samples become training data. It checks
every sample's teacher logprobs, adds ``guard/*`` metrics, and on a dead teacher repairs it
(reload, flush, canary), re-scores the step's samples in place so the step trains on correct
teacher logprobs, or, when it cannot, takes the samples out of the distillation loss; on a halt
it also raises :class:`GuardHalt`, so the poisoned rollout never reaches the trainer.

The hooks take their settings from the environment (Relax passes no extra arguments):

=============================  =====================================================================
``DISTILL_GUARD_PRESET``       ``default`` | ``monitor_only`` | ``strict`` (default ``default``)
``DISTILL_GUARD_OVERRIDES``    Hydra overrides of the guard node, space separated
                               (``run.vocab_size=151936 policy.halt_after_critical_steps=2``)
``DISTILL_GUARD_EVENTS``       the JSONL event file (else the preset's ``events_path``)
``DISTILL_GUARD_TEACHER_URL``  the teacher to probe and repair (else ``--opd-teacher-url``, or the
                               first of ``--opd-teacher-urls``); ``none`` turns repair off
``DISTILL_GUARD_HALT``         ``raise`` (default) or ``mark``: only write the halt marker and let
                               :func:`before_train_step_hook` checkpoint and stop every rank
=============================  =====================================================================

or from :func:`configure`, called in the rollout process before the first step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from distill_guard.checks import TeacherCollapseCheck
from distill_guard.config import GuardSpec, build_guard
from distill_guard.findings import Severity
from distill_guard.guard import DistillGuard
from distill_guard.metric_names import RELAX_METRIC_NAMES, resolve_key
from distill_guard.observations import LossKind, Metric, RunSpec, TeacherScores
from distill_guard.policy import Decision

log = logging.getLogger("distill_guard")

TOKEN_FIELD = "teacher_log_probs"
TOPK_FIELD = "opd_topk_teacher_log_probs"
TOPK_IDS_FIELD = "opd_topk_token_ids"
TOPK_LEN_FIELD = "opd_topk_ksz"
SAMPLE_MASK_FIELD = "opd_sample_mask"


class GuardHalt(RuntimeError):
    """The guard halted the run; the message says why (the event file has the details)."""


TeacherInputs = Callable[[Any], "tuple[list[int], int]"]
"""``sample -> (token ids the teacher scores, logprob_start_len)``, for re-scoring."""


def default_teacher_inputs(sample: Any) -> tuple[list[int], int]:
    """What Relax sends the teacher (``docs/relax.md`` §1.2): prompt + response, ``logprob_start_len = prompt_len-1``.

    OPSD/SDPO score a teacher prompt plus the response instead; a sample carrying
    ``teacher_input_ids`` (inferred name, from ``OpsdWorker.teacher_input_ids``) uses those.
    """
    ids = getattr(sample, "teacher_input_ids", None)
    if ids is None:
        ids = getattr(sample, "rollout_tokens", None) or sample.tokens
    ids = [int(t) for t in ids]
    return ids, len(ids) - int(sample.response_length) - 1


# ---------------------------------------------------------------------------------- the state


@dataclasses.dataclass
class RelaxGuard:
    """The guard and the teacher behind Relax's hooks, one per rollout process."""

    guard: DistillGuard
    teacher: Any = None
    """The teacher to re-score with (it is also ``guard.teacher`` when repair is on)."""
    token_selection: str = "student_sampled"
    """Relax's ``--opd-token-selection``: which teacher channel the samples carry."""
    top_k: int = 0
    """Relax's ``--opd-log-prob-top-k``."""
    halt_mode: str = "raise"
    """``raise``: raise :class:`GuardHalt` from the rollout hook; ``mark``: only write the marker."""
    halt_marker: Path | None = None
    """File written on halt, read by :func:`before_train_step_hook` on every trainer rank."""
    teacher_inputs: TeacherInputs = default_teacher_inputs
    privileged_prompt: bool = False
    """OPSD/SDPO: the teacher saw its own prompt (``--opd-teacher-prompt-key``, a feedback
    class), so a sample without ``teacher_input_ids`` cannot be re-scored from its tokens."""
    step: int = 0
    """The rollout step being checked, or the next one between steps (for the wake hooks)."""

    # ---------------------------------------------------------------- rollout check

    def check_rollout(self, rollout_id: int, samples: Sequence[Any]) -> dict[str, float]:
        """Check, repair and re-score, or mask; returns the ``guard/*`` metrics.

        The ``guard/teacher_*`` metrics describe the teacher logprobs as the rollout brought
        them, before any re-scoring, so a dashboard shows the collapse where it happened.
        """
        t0 = time.perf_counter()
        self.step = rollout_id
        guard = self.guard
        batch = _collect(samples, guard.run.vocab_size)
        decision = guard.on_teacher_scores(rollout_id, batch.token, batch.topk)
        rescored = masked = 0
        if decision.repaired:
            done, unscorable = self.rescore(samples)
            rescored = len(done)
            verified = True
            if done:  # judge the new values: a repair that did not take must not train either
                again = _collect(done, guard.run.vocab_size)
                verify = guard.on_teacher_scores(rollout_id, again.token, again.topk)
                verified = not verify.acts
                if not verified:
                    decision = verify
            masked = mask_out(samples if not verified else unscorable)
            guard.events.write(
                "rescore", step=rollout_id, rescored=rescored, masked=masked, verified=verified
            )
        elif decision.acts:
            masked = mask_out(samples)
        step_metrics: dict[str, float | None] = {Metric.TRUNCATED_RATIO: _truncated_ratio(samples)}
        final = guard.on_step_metrics(rollout_id, step_metrics)
        if final.action.rank > decision.action.rank:
            decision = final
            if decision.acts and not masked:
                masked = mask_out(samples)
        self.step = rollout_id + 1
        return {
            **batch.metrics(guard.run.vocab_size),
            "guard/action": float(decision.action.rank),
            "guard/findings": float(sum(f.severity >= Severity.WARN for f in decision.reasons)),
            "guard/rescored_samples": float(rescored),
            "guard/masked_samples": float(masked),
            "guard/repairs": float(guard.repairs),
            "guard/halted": float(guard.halted),
            "guard/check_seconds": time.perf_counter() - t0,
        }

    def rescore(self, samples: Sequence[Any]) -> tuple[list[Any], list[Any]]:
        """Score the samples again with the (repaired) teacher and write the values back in place.

        Returns the samples re-scored and those that could not be: a top-K channel of the
        *student's* ids (``student_topk``, ``union``) needs the teacher's logprobs at given ids,
        which the Teacher protocol does not offer, and an OPSD/SDPO teacher prompt is not on the
        sample (unless it carries ``teacher_input_ids`` or ``teacher_inputs`` rebuilds it); those
        are taken out of the loss instead.
        """
        teacher = self.teacher
        topk_mode = self.token_selection == "teacher_topk"
        unscorable: list[Any] = []
        groups: dict[int, list[tuple[Any, list[int]]]] = {}
        for s in samples:
            has_topk = getattr(s, TOPK_FIELD, None) is not None
            own_prompt_lost = (
                self.privileged_prompt
                and self.teacher_inputs is default_teacher_inputs
                and getattr(s, "teacher_input_ids", None) is None
            )
            if (has_topk and not topk_mode) or own_prompt_lost:
                unscorable.append(s)
                continue
            try:
                ids, start = self.teacher_inputs(s)
            except Exception as exc:  # noqa: BLE001
                log.error("distill_guard: cannot rebuild the teacher input of a sample: %s", exc)
                unscorable.append(s)
                continue
            groups.setdefault(start, []).append((s, ids))
        done: list[Any] = []
        k = self.top_k if topk_mode else 0
        for start, items in groups.items():
            try:
                res = teacher.score([ids for _, ids in items], top_k=k, logprob_start_len=start)
            except Exception as exc:  # noqa: BLE001 - the teacher failed again: mask, do not crash
                log.error("distill_guard: re-scoring failed: %s", exc)
                unscorable += [s for s, _ in items]
                continue
            for j, (s, _) in enumerate(items):
                if getattr(s, TOKEN_FIELD, None) is not None:
                    setattr(s, TOKEN_FIELD, _like(getattr(s, TOKEN_FIELD), res.token_logprobs[j]))
                if k and res.topk_logprobs is not None:
                    setattr(s, TOPK_FIELD, _like(getattr(s, TOPK_FIELD), res.topk_logprobs[j]))
                    if getattr(s, TOPK_IDS_FIELD, None) is not None:
                        setattr(
                            s, TOPK_IDS_FIELD, _like(getattr(s, TOPK_IDS_FIELD), res.topk_ids[j])
                        )
                done.append(s)
        return done, unscorable

    # ---------------------------------------------------------------- halt

    def halt(self, samples: Sequence[Any] = ()) -> None:
        """Take the samples out of the loss, write the marker, and raise unless in ``mark`` mode."""
        mask_out(samples)
        halt = self.guard.halt
        if self.halt_marker is not None and halt is not None:
            self.halt_marker.parent.mkdir(parents=True, exist_ok=True)
            self.halt_marker.write_text(json.dumps({**halt.to_dict(), "time": time.time()}))
            self.guard.events.write("halt_marker", path=str(self.halt_marker))
        self.guard.close()
        if self.halt_mode == "raise":
            where, why = (halt.step, halt.message) if halt is not None else (None, "halted")
            raise GuardHalt(f"distill_guard halted the run at step {where}: {why}")

    # ---------------------------------------------------------------- sleep / wake

    def sleep(self, release: Callable[[], Any]) -> None:
        """Relax puts the teacher to sleep with ``release``: the guard fingerprints it first."""
        self.guard.sleep(self.step, release=release)

    def wake(self, resume: Callable[[], Any]) -> Decision:
        """Relax wakes the teacher with ``resume``: the guard checks it (and repairs it) after."""
        decision = self.guard.wake(self.step, resume=resume)
        if self.guard.halted:
            self.halt()
        return decision


_STATE: RelaxGuard | None = None


def configure(
    guard: GuardSpec = None,
    *,
    guard_overrides: Sequence[str] = (),
    args: Any = None,
    teacher: Any = None,
    canary: Any = None,
    repair: bool = True,
    halt_mode: str | None = None,
    halt_marker: str | os.PathLike[str] | None = None,
    teacher_inputs: TeacherInputs | None = None,
) -> RelaxGuard:
    """Set up the guard behind the hooks (else the first hook call does it from the environment).

    ``args`` is Relax's argparse namespace: ``--opd-kl-type``/``--opd-jsd-alpha`` fill the run's
    loss and β, ``--opd-token-selection``/``--opd-log-prob-top-k`` the re-scoring, and the teacher
    URL the teacher. With ``repair`` the guard gets the teacher and a canary (from the teachers
    layer), so a dead teacher is reloaded and verified before the step's samples are re-scored.
    """
    global _STATE
    g = build_guard(guard, guard_overrides)
    g.run = _run_from_args(g.run, args)
    if teacher is None and repair:
        teacher = _teacher_from(args)
    if teacher is not None and repair:
        g.attach_teacher(teacher, canary)
    elif teacher is not None and g.run.vocab_size is None:
        with contextlib.suppress(Exception):
            v = teacher.vocab_size
            if v:
                g.run = dataclasses.replace(g.run, vocab_size=int(v))
    mode = halt_mode or os.environ.get("DISTILL_GUARD_HALT", "raise")
    if mode not in ("raise", "mark"):
        raise ValueError(f"halt mode must be 'raise' or 'mark', got {mode!r}")
    marker = halt_marker or os.environ.get("DISTILL_GUARD_HALT_MARKER")
    if marker is None and g.events.path is not None:
        marker = g.events.path.with_suffix(".halt.json")
    _STATE = RelaxGuard(
        guard=g,
        teacher=teacher,
        token_selection=str(getattr(args, "opd_token_selection", None) or "student_sampled"),
        top_k=int(getattr(args, "opd_log_prob_top_k", 0) or 0),
        halt_mode=mode,
        halt_marker=Path(marker) if marker else None,
        teacher_inputs=teacher_inputs or default_teacher_inputs,
        privileged_prompt=bool(
            getattr(args, "opd_teacher_prompt_key", None)
            or getattr(args, "opd_feedback_class", None)
        ),
    )
    return _STATE


def reset() -> None:
    """Forget the configured guard (tests; a new run in the same process)."""
    global _STATE
    if _STATE is not None:
        _STATE.guard.close()
    _STATE = None


def state(args: Any = None) -> RelaxGuard:
    """The configured :class:`RelaxGuard`, set up from the environment on first use."""
    if _STATE is None:
        overrides = os.environ.get("DISTILL_GUARD_OVERRIDES", "").split()
        events = os.environ.get("DISTILL_GUARD_EVENTS")
        if events:
            overrides.append(f"events_path={events}")
        configure(
            os.environ.get("DISTILL_GUARD_PRESET", "default"), guard_overrides=overrides, args=args
        )
    assert _STATE is not None
    return _STATE


# ---------------------------------------------------------------------------------- the hooks


def rollout_log_function(
    rollout_id: int, args: Any, samples: list[Any], rollout_extra_metrics: dict, rollout_time: float
) -> bool:
    """``--custom-rollout-log-function-path``: check the step's teacher logprobs; False keeps
    Relax's own logging (which then logs the ``guard/*`` metrics added here)."""
    st = state(args)
    if st.guard.halted:  # a later step after a mark-mode halt: nothing of it may train
        st.halt(samples)
        return False
    try:
        metrics = st.check_rollout(rollout_id, samples)
    except Exception as exc:  # noqa: BLE001 - the guard's own fault must not stop the run
        log.exception("distill_guard: the rollout check failed at step %s", rollout_id)
        st.guard.events.write("guard_error", step=rollout_id, error=f"{type(exc).__name__}: {exc}")
        metrics = {"guard/error": 1.0}
    if rollout_extra_metrics is not None:
        rollout_extra_metrics.update(metrics)
    if st.guard.halted:
        st.halt(samples)
    return False


def eval_rollout_log_function(rollout_id: int, args: Any, data: dict, extra_metrics: dict) -> bool:
    """``--custom-eval-rollout-log-function-path``: the eval accuracy goes to the guard (the mean
    reward of the dataset Relax logs as the ``eval/*`` key replay picks); False keeps Relax's
    own logging."""
    st = state(args)
    if st.guard.halted:
        return False
    accuracy = None
    rewards_of = {
        f"eval/{name}": [float(r) for r in (d.get("rewards") or []) if r is not None]
        for name, d in (data or {}).items()
    }
    key = resolve_key(
        RELAX_METRIC_NAMES[Metric.EVAL_ACCURACY], [k for k, r in rewards_of.items() if r]
    )
    if key is not None:
        accuracy = sum(rewards_of[key]) / len(rewards_of[key])
    decision = st.guard.on_step_metrics(rollout_id, {Metric.EVAL_ACCURACY: accuracy})
    if extra_metrics is not None:
        extra_metrics["guard/eval_action"] = float(decision.action.rank)
    if st.guard.halted:
        st.halt()
    return False


def before_train_step_hook(
    args: Any, rollout_id: int, step_id: int, model: Any, optimizer: Any, opt_param_scheduler: Any
) -> None:
    """``--custom-megatron-before-train-step-hook-path``, for ``DISTILL_GUARD_HALT=mark``: when
    the rollout side has halted, every trainer rank saves a checkpoint and stops.

    The marker is ``DISTILL_GUARD_HALT_MARKER`` (else ``<events>.halt.json``) on a file system all
    ranks see. The ranks agree on it (any rank seeing it stops all). The checkpoint is written by
    the function named in ``DISTILL_GUARD_SAVE_FUNCTION`` (``module:function``, called with this
    hook's arguments), else by Megatron's ``save_checkpoint``. Not run against Megatron here:
    check it on your Relax version before relying on it.
    """
    marker = os.environ.get("DISTILL_GUARD_HALT_MARKER")
    if marker is None:
        events = os.environ.get("DISTILL_GUARD_EVENTS")
        marker = str(Path(events).with_suffix(".halt.json")) if events else None
    seen = marker is not None and Path(marker).exists()
    from distill_guard.consensus import dist_ready

    if dist_ready():
        flag = torch.tensor([int(seen)])
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, group=_gloo())
        seen = bool(flag.item())
    if not seen:
        return
    reason = "see the guard's event file"
    with contextlib.suppress(Exception):
        reason = json.loads(Path(marker).read_text()).get("message") or reason
    save = _load_function(os.environ.get("DISTILL_GUARD_SAVE_FUNCTION")) or _megatron_save
    save(args, rollout_id, step_id, model, optimizer, opt_param_scheduler)
    raise GuardHalt(f"distill_guard halted the run before rollout {rollout_id}: {reason}")


# ---------------------------------------------------------------------------------- SDPO feedback


class TeacherCollapseError(RuntimeError):
    """Raised by the feedback hook for a sample whose teacher top-K is uniform (fail fast)."""


class TeacherCollapseFeedbackMixin:
    """Per-sample fail-fast check in Relax's feedback hook ``check_transfer_channels``.

    Relax calls it for every sample inside the teacher prefill (top-K modes; "hooks raise to
    hard-fail and return to degrade"). Keyword arguments, through ``--opd-feedback-kwargs``:
    ``guard_vocab_size`` (else ``DISTILL_GUARD_VOCAB_SIZE``, else inferred from the values),
    ``guard_atol`` and ``guard_on_collapse`` (``raise``, or ``mask``: drop the sample from the
    SDPO loss with ``opd_sample_mask = False`` and go on).
    """

    def __init__(
        self,
        *args: Any,
        guard_vocab_size: int | None = None,
        guard_atol: float = 1e-3,
        guard_on_collapse: str = "raise",
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        env_v = os.environ.get("DISTILL_GUARD_VOCAB_SIZE")
        vocab = guard_vocab_size or (int(env_v) if env_v else None)
        if guard_on_collapse not in ("raise", "mask"):
            raise ValueError(
                f"guard_on_collapse must be 'raise' or 'mask', got {guard_on_collapse!r}"
            )
        self.guard_run = RunSpec(vocab_size=vocab)
        self.guard_check = TeacherCollapseCheck(atol=guard_atol)
        self.guard_on_collapse = guard_on_collapse
        self.guard_collapsed = 0

    def check_transfer_channels(self, sample: Any, channels: Any, top_k: int) -> Any:
        bad = self._guard_judge(sample, channels)
        if bad is not None:
            self.guard_collapsed += 1
            if self.guard_on_collapse == "raise":
                raise TeacherCollapseError(bad.message)
            if hasattr(sample, SAMPLE_MASK_FIELD):
                setattr(sample, SAMPLE_MASK_FIELD, False)
            log.error("distill_guard: sample dropped from the SDPO loss: %s", bad.message)
        parent = getattr(super(), "check_transfer_channels", None)
        return parent(sample, channels, top_k) if parent is not None else None

    def _guard_judge(self, sample: Any, channels: Any) -> Any:
        """The first critical finding on the sample's teacher top-K, or None (also on bad data)."""
        try:
            values = channels.get(TOPK_FIELD) if hasattr(channels, "get") else None
            if values is None:
                return None
            rows = _as_rows(values, getattr(sample, TOPK_LEN_FIELD, None))
            scores = TeacherScores(getattr(sample, "index", 0) or 0, topk_logprobs=rows)
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


_FEEDBACK_BASES = {
    "GuardedGoldenAnswerSDPOFeedback": (
        "relax.utils.opd.sdpo.feedback",
        "GoldenAnswerSDPOFeedback",
    ),
    "GuardedSDPOFeedback": ("relax.utils.opd.sdpo.feedback", "SDPOFeedback"),
    "GuardedOPDFeedback": ("relax.utils.opd.feedback", "OPDFeedback"),
}


@functools.cache
def _feedback_class(name: str) -> type:
    module, base_name = _FEEDBACK_BASES[name]
    try:
        base = getattr(__import__(module, fromlist=[base_name]), base_name)
    except (ImportError, AttributeError):
        base = _NoRelaxFeedback
    return type(name, (TeacherCollapseFeedbackMixin, base), {"__module__": __name__})


def __getattr__(name: str) -> Any:
    """``GuardedGoldenAnswerSDPOFeedback`` & co. subclass Relax's class, built on first access
    (so this module imports without Relax)."""
    if name in _FEEDBACK_BASES:
        return _feedback_class(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------------------------- lifecycle


def wrap_teacher_manager(manager: Any, relax_guard: RelaxGuard | None = None) -> Any:
    """Make a TeacherManager-like object (or class) call the guard around its sleep and wake.

    ``offload()`` runs inside :meth:`RelaxGuard.sleep` (fingerprint, then offload) and
    ``onload()`` inside :meth:`RelaxGuard.wake` (onload, then canary, repair, or halt): the
    guard's one colocated step, with Relax doing the release and resume. Relax's TeacherManager
    is a Ray actor: wrap it in the process that owns it (its class before the actor starts, from a
    module imported there). Returns ``manager``.
    """

    def st() -> RelaxGuard:
        return relax_guard if relax_guard is not None else state()

    def wrap(fn: Callable[..., Any], before: bool) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapped(*a: Any, **k: Any) -> Any:
            out: list[Any] = []

            def host_call() -> None:  # Relax's own offload/onload, run inside the guard's step
                out.append(fn(*a, **k))

            (st().sleep if before else st().wake)(host_call)
            return out[0] if out else None

        wrapped.__distill_guard__ = True  # type: ignore[attr-defined]
        return wrapped

    for name, before in (("offload", True), ("onload", False)):
        fn = getattr(manager, name)
        if getattr(fn, "__distill_guard__", False):
            continue
        setattr(manager, name, wrap(fn, before))
    return manager


# ---------------------------------------------------------------------------------- internals


@dataclasses.dataclass
class _Batch:
    token: torch.Tensor | None
    topk: torch.Tensor | None
    per_sample: list[torch.Tensor]
    """Per sample: its token logprobs, else its top-1 row values (for the per-sample metrics)."""

    def metrics(self, vocab_size: int | None) -> dict[str, float]:
        vals = (
            self.token
            if self.token is not None
            else (
                self.topk.max(dim=1).values if self.topk is not None and self.topk.numel() else None
            )
        )
        out: dict[str, float] = {"guard/samples": float(len(self.per_sample))}
        if vals is not None and vals.numel():
            finite = vals[torch.isfinite(vals)].double()
            if finite.numel():
                out["guard/teacher_logprob_mean"] = float(finite.mean())
                out["guard/teacher_logprob_std"] = float(finite.std(unbiased=False))
        if vocab_size and self.per_sample:
            target = -math.log(vocab_size)
            uniform = [
                bool(v.numel()) and bool(((v.double() - target).abs() <= 1e-3).all())
                for v in self.per_sample
            ]
            out["guard/teacher_uniform_sample_frac"] = sum(uniform) / len(uniform)
        return out


def _collect(samples: Iterable[Any], vocab_size: int | None) -> _Batch:
    tokens: list[torch.Tensor] = []
    topks: list[torch.Tensor] = []
    per_sample: list[torch.Tensor] = []
    for s in samples:
        mask = _token_mask(s)
        tok = getattr(s, TOKEN_FIELD, None)
        t = None
        if tok is not None:
            t = torch.as_tensor(_numeric(tok), dtype=torch.float32).reshape(-1)
            if mask is not None and mask.numel() == t.numel():
                t = t[mask]
            tokens.append(t)
        top = getattr(s, TOPK_FIELD, None)
        rows = None
        if top is not None:
            rows = _as_rows(top, getattr(s, TOPK_LEN_FIELD, None))
            if mask is not None and mask.numel() == rows.shape[0]:
                rows = rows[mask]
            topks.append(rows)
        if t is not None:
            per_sample.append(t)
        elif rows is not None:
            per_sample.append(rows.max(dim=1).values if rows.numel() else rows.reshape(-1))
    token = torch.cat(tokens) if tokens else None
    topk = None
    if topks:
        k = max(r.shape[1] for r in topks)
        topk = torch.cat(
            [torch.nn.functional.pad(r, (0, k - r.shape[1]), value=-math.inf) for r in topks]
        )
    return _Batch(token, topk, per_sample)


def _numeric(values: Any) -> Any:
    if isinstance(values, torch.Tensor):
        return values.detach().float()
    try:
        import numpy as np

        return np.asarray(values, dtype=np.float32)
    except (TypeError, ValueError):
        return [float("nan") if v is None else float(v) for v in values]


def _as_rows(values: Any, ksz: Any = None) -> torch.Tensor:
    """``[R, K]`` float32 top-K rows; entries past a row's valid length (union mode) become -inf."""
    rows = torch.as_tensor(_numeric(values), dtype=torch.float32)
    if rows.dim() == 1:
        rows = rows.reshape(1, -1) if rows.numel() else rows.reshape(0, 0)
    if ksz is not None:
        valid = torch.as_tensor(_numeric(ksz)).reshape(-1, 1)
        cols = torch.arange(rows.shape[1]).reshape(1, -1)
        if valid.shape[0] == rows.shape[0]:
            rows = torch.where(cols < valid, rows, torch.full_like(rows, -math.inf))
    return rows


def _token_mask(sample: Any) -> torch.Tensor | None:
    m = getattr(sample, "loss_mask", None)
    if m is None:
        return None
    try:
        return torch.as_tensor(_numeric(m)).reshape(-1) > 0
    except (TypeError, ValueError):
        return None


def _truncated_ratio(samples: Sequence[Any]) -> float | None:
    flags = []
    for s in samples:
        status = getattr(s, "status", None)
        if status is None:
            continue
        name = getattr(status, "name", None) or getattr(status, "value", None) or str(status)
        flags.append("truncat" in str(name).lower())
    return sum(flags) / len(flags) if flags else None


def mask_out(samples: Iterable[Any]) -> int:
    """Take samples out of the distillation loss: ``opd_sample_mask = False`` where the sample
    has one (SDPO), else a zero ``loss_mask``. Returns how many were masked."""
    n = 0
    for s in samples:
        if hasattr(s, SAMPLE_MASK_FIELD):
            setattr(s, SAMPLE_MASK_FIELD, False)
        elif getattr(s, "loss_mask", None) is not None:
            lm = s.loss_mask
            s.loss_mask = lm * 0 if isinstance(lm, torch.Tensor) else [0] * len(lm)
        else:
            continue
        n += 1
    return n


def _like(original: Any, values: torch.Tensor) -> Any:
    """``values`` in the container type of ``original`` (list, numpy array or tensor)."""
    if isinstance(original, torch.Tensor):
        return values.to(dtype=original.dtype, device=original.device)
    try:
        import numpy as np

        if isinstance(original, np.ndarray):
            return values.cpu().numpy().astype(original.dtype, copy=False)
    except ImportError:
        pass
    return values.tolist()


def _run_from_args(run: RunSpec, args: Any) -> RunSpec:
    if args is None:
        return run
    kl = getattr(args, "opd_kl_type", None)
    loss = {
        "jsd": LossKind.JSD,
        "reverse_kl": LossKind.REVERSE_KL,
        "forward_kl": LossKind.FORWARD_KL,
    }
    changes: dict[str, Any] = {}
    if kl in loss:
        changes["loss"] = loss[kl]
    alpha = getattr(args, "opd_jsd_alpha", None)
    if alpha is not None:
        changes["beta"] = float(alpha)
    return dataclasses.replace(run, **changes) if changes else run


def _teacher_from(args: Any) -> Any:
    url = os.environ.get("DISTILL_GUARD_TEACHER_URL")
    if url is None and args is not None:
        url = getattr(args, "opd_teacher_url", None)
        urls = getattr(args, "opd_teacher_urls", None)
        if not url and urls:
            url = urls[0]
    if not url or url.lower() == "none":
        return None
    from distill_guard.teachers import SGLangHTTPTeacher

    timeout = float(getattr(args, "opd_teacher_timeout_s", 30.0) or 30.0)
    return SGLangHTTPTeacher(url, timeout_s=timeout)


def _load_function(path: str | None) -> Callable[..., Any] | None:
    if not path:
        return None
    module, _, name = path.replace(":", ".").rpartition(".")
    return getattr(__import__(module, fromlist=[name]), name)


def _megatron_save(
    args: Any, rollout_id: int, step_id: int, model: Any, optimizer: Any, scheduler: Any
) -> None:
    try:
        from megatron.training.checkpointing import save_checkpoint
    except ImportError:
        log.error("distill_guard: Megatron is not importable; no checkpoint written at halt")
        return
    save_checkpoint(rollout_id, model, optimizer, scheduler, 0)


@functools.cache
def _gloo() -> Any:
    return torch.distributed.new_group(backend="gloo")
