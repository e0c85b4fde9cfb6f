"""StepGuard: the guard in any training loop that holds its teacher's logits.

It collects the teacher's scores of every micro-batch (full logits are reduced at once, in row
chunks, to top-k logprobs: no ``[N, V]`` float32 copy is kept), asks the guard once per optimizer
step whether to take the step (:meth:`StepGuard.optimizer_step`), and feeds the step's metrics
after it. The README's plain loop shows it in use; the trainer callbacks are built on it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from distill_guard.config import GuardSpec, build_guard
from distill_guard.errors import GuardTypeError
from distill_guard.integrations.metric_feed import MetricFeed
from distill_guard.integrations.step_buffer import StepBuffer
from distill_guard.integrations.teacher_taps import project_hidden_states, tap_logits
from distill_guard.losses import DistillLoss, run_stated_by
from distill_guard.observations import Metric
from distill_guard.policy import Action, Decision, worst
from distill_guard.signals import DEFAULT_CHUNK_ROWS, teacher_logprobs_from_logits
from distill_guard.summary import VERDICT_SKIP, VERDICT_TRAIN

log = logging.getLogger("distill_guard")


class StepGuard:
    """One optimizer step at a time: collect the teacher's scores, decide, then watch metrics.

    Per optimizer step, on every rank alike: ``observe_*`` any number of times (micro-batches),
    then :meth:`before_update` (one ``on_teacher_scores``, plus one ``on_step_metrics`` with the
    raw loss once :meth:`observe_loss` has been used), then :meth:`after_update`. With a reducer
    on the guard each of these is one collective, so the call pattern must match across ranks.

    Args:
        guard: the guard, or a preset name or config node (see
            :func:`~distill_guard.config.build_guard`).
        overrides: Hydra overrides of a preset or config node (``"events_path=guard.jsonl"``).
        top_k: teacher top-k kept per position when reducing full logits.
        chunk_rows: rows per float32 chunk when reducing full logits.
        learn_vocab_size: when the guard's ``run.vocab_size`` is unset, take it from the logits'
            width (exact for in-process teachers: the width is the distribution's support).
        teacher: the in-process teacher module, checked on the guard's canary before each
            update (one short forward): weights turned to noise score like any teacher, only a
            comparison with its own earlier output tells. :meth:`watch` does the same.
        collecting: whether :meth:`watch` hooks record from the start.
        metric_names: ``{role: framework metric name}`` for :meth:`after_logs`.
    """

    def __init__(
        self,
        guard: GuardSpec = None,
        overrides: Sequence[str] = (),
        *,
        top_k: int = 16,
        chunk_rows: int = DEFAULT_CHUNK_ROWS,
        learn_vocab_size: bool = True,
        collecting: bool = True,
        metric_names: Mapping[str, str] | None = None,
        teacher: torch.nn.Module | None = None,
    ) -> None:
        self.guard = build_guard(guard, overrides)
        if teacher is not None:
            self.guard.watch_module_teacher(teacher)
        self.top_k = top_k
        self.chunk_rows = chunk_rows
        self.learn_vocab_size = learn_vocab_size
        self.collecting = collecting
        """Hooks installed by :meth:`watch` record only while this is True (adapters switch it
        off outside training steps, so evaluation forwards are not counted)."""
        self._feed = MetricFeed(
            self.guard, dict(metric_names or {role: role for role in Metric.ALL})
        )
        self.last_decision: Decision = Decision(None, Action.CONTINUE)
        """The decision behind the last :meth:`before_update` / :meth:`after_update`."""
        self._verdict = VERDICT_TRAIN
        self._buffer = StepBuffer()
        self._told: set[str] = set()
        self._handles: list[Any] = []

    # ------------------------------------------------------------------ observe (micro-batches)

    def observe_teacher_logits(
        self,
        logits: torch.Tensor,
        *,
        mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        ignore_index: int = -100,
    ) -> None:
        """Record the teacher's full logits ``[..., V]`` of one micro-batch (reduced at once to
        top-k logprobs; nothing of ``[..., V]`` size is kept)."""
        if self.learn_vocab_size and self.guard.run.vocab_size is None and logits.shape[-1] > 1:
            self.guard.run = dataclasses.replace(self.guard.run, vocab_size=int(logits.shape[-1]))
        reduced = teacher_logprobs_from_logits(
            logits,
            top_k=self.top_k,
            mask=mask,
            labels=labels,
            ignore_index=ignore_index,
            chunk_rows=self.chunk_rows,
        )
        self.observe_teacher_logprobs(
            topk_logprobs=reduced.topk,
            token_logprobs=reduced.token,
            topk_ids=reduced.topk_ids,
            token_ids=reduced.token_ids,
            sample_index=reduced.sample_index,
        )

    def observe_teacher_logprobs(
        self,
        *,
        token_logprobs: torch.Tensor | None = None,
        topk_logprobs: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        topk_ids: torch.Tensor | None = None,
        token_ids: torch.Tensor | None = None,
        sample_index: torch.Tensor | None = None,
    ) -> None:
        """Record teacher logprobs already reduced: sampled tokens ``[n]`` and/or top-k ``[n, k]``,
        optionally with the ids and each position's sample the pairing checks need."""
        keep = mask.detach().reshape(-1).to(torch.bool) if mask is not None else None

        def rows(x: torch.Tensor | None, per_row: bool = False) -> torch.Tensor | None:
            """``x`` as one row per position (``[n]``, or ``[n, k]`` if ``per_row``), masked."""
            if x is None:
                return None
            x = x.detach().reshape(-1, x.shape[-1]) if per_row else x.detach().reshape(-1)
            return x[keep] if keep is not None else x

        self._buffer.add_scores(
            topk=rows(topk_logprobs, per_row=True),
            topk_ids=rows(topk_ids, per_row=True),
            token=rows(token_logprobs),
            token_ids=rows(token_ids),
            sample_index=rows(sample_index),
        )

    def observe_loss(self, loss: torch.Tensor | float) -> None:
        """Record one micro-batch's raw loss, as computed (before any NaN filtering or scaling).

        transformers' ``logging_nan_inf_filter`` replaces a NaN loss before ``on_log`` sees it;
        the raw loss observed here is judged before the update instead.
        """
        self._feed.loss_judged_before_update = True
        t = (
            loss.detach().float().reshape(())
            if isinstance(loss, torch.Tensor)
            else torch.tensor(float(loss))
        )
        self._buffer.add_loss(t)

    def observe_distill_loss(self, out: DistillLoss) -> None:
        """Record one micro-batch from :func:`~distill_guard.losses.distill_loss`'s output, in
        place of :meth:`observe_teacher_logits` and :meth:`observe_loss`: the loss already read
        the logits, so the guard's signals cost no second pass.

        The guard gets each valid position's teacher top-1 logprob (a ``[n, 1]`` top-k: all the
        uniform-teacher checks need) and sample, the raw loss, and the student's mean entropy
        (reported as ``student_entropy`` when the step's metrics lack it); the run's V (when
        unset), loss kind, β and scale are taken from ``out``. Not from these signals: the
        pairing checks need top-k ids and sampled tokens (``observe_teacher_logits(logits,
        labels=...)``), and at τ > 1 a healthy teacher looks flatter than at its own τ.
        """
        if not isinstance(out, DistillLoss):
            raise GuardTypeError(
                f"observe_distill_loss takes distill_loss(...)'s DistillLoss, got {type(out).__name__}"
            )
        self.guard.run = run_stated_by(out, self.guard.run, learn_vocab_size=self.learn_vocab_size)
        self.observe_loss(out.loss)
        valid = out.valid.reshape(-1)
        entropy = torch.where(valid, out.student_entropy.reshape(-1).double(), 0.0).sum()
        self._buffer.add_entropy(entropy, valid.sum().double())
        width = self._buffer.topk_width
        if width is not None and width != 1:
            # the teacher's logits were already reduced this step (a watch hook, or the caller)
            self._tell_once(
                "twice",
                "distill_guard: this step's teacher logits were reduced to top-%d logprobs "
                "besides distill_loss's signals; those are judged, the fused ones not. Use "
                "watch(teacher, logits=False) (the TRL mixin's distill_guard_fused_loss, "
                "Lightning's DistillGuardCallback(fused_loss=True)) to read the logits once",
                width,
            )
            return
        self.observe_teacher_logprobs(
            topk_logprobs=out.teacher_top1_logprob.unsqueeze(-1),
            mask=out.valid,
            sample_index=out.sample_index,
        )

    def _tell_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._told:
            self._told.add(key)
            log.info(message, *args)

    def watch(
        self,
        module: torch.nn.Module,
        *,
        canary: bool = True,
        logits: bool = True,
        temperature: float | None = None,
    ) -> Any:
        """Observe every forward of ``module`` (the teacher) while :attr:`collecting` (masked by
        its ``attention_mask`` keyword), and with ``canary`` check the module on the guard's
        canary before each update: weights turned to noise score like any teacher, only the
        canary tells. Returns the hook handle (:meth:`unwatch` removes them all); with
        ``logits=False`` only the canary, for a loop that hands :meth:`observe_distill_loss`
        what the loss read, and None. ``temperature``: the one the loss consumes the teacher's
        logits at, when it divides them (the canary is scored so; the run's
        ``teacher_temperature`` if None)."""
        if canary and self.guard.module_canary is None:
            self.guard.watch_module_teacher(module, temperature=temperature)
        if not logits:
            return None

        def recording() -> bool:
            module_canary = self.guard.module_canary
            return self.collecting and not (module_canary is not None and module_canary.running)

        handle = tap_logits(
            module,
            self.observe_teacher_logits,
            recording=recording,
            vocab=lambda: self.guard.run.vocab_size,
        )
        self._handles.append(handle)
        return handle

    def observe_teacher_hidden_states(
        self,
        hidden: torch.Tensor,
        head: torch.nn.Module,
        *,
        mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        logit_scale: float = 1.0,
        softcap: float | None = None,
    ) -> None:
        """Record a teacher whose trainer never forms its logits: ``hidden`` ``[B, K, H]`` goes
        through ``head`` (its output embeddings) as the trainer's loss does
        (:func:`~distill_guard.integrations.teacher_taps.project_hidden_states`), a few samples
        at a time. ``mask`` and ``labels`` are ``[B, K]``."""
        project_hidden_states(
            hidden,
            head,
            self.observe_teacher_logits,
            chunk_rows=self.chunk_rows,
            mask=mask,
            labels=labels,
            logit_scale=logit_scale,
            softcap=softcap,
        )

    @property
    def watching(self) -> bool:
        """True while a hook installed by :meth:`watch` is in place."""
        return bool(self._handles)

    def unwatch(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    # ------------------------------------------------------------------ decide (optimizer steps)

    def before_update(self, step: int) -> bool:
        """Judge what was observed since the last update; True means take the optimizer step.

        False after a critical finding (the step would train on a dead teacher or a NaN loss), a
        rewake (the scores were taken before the repair), or a halt.
        """
        buffer, self._buffer = self._buffer, StepBuffer()
        scores = buffer.joined(step)
        self._feed.step_entropy = scores.student_entropy
        teacher = scores.teacher
        decision = self.guard.on_teacher_scores(
            step,
            token_logprobs=teacher.token_logprobs,
            topk_logprobs=teacher.topk_logprobs,
            topk_ids=teacher.topk_ids,
            token_ids=teacher.token_ids,
            sample_index=teacher.sample_index,
        )
        if self._feed.loss_judged_before_update:
            metrics: dict[str, float] = {}
            if scores.losses is not None:
                losses = scores.losses
                # a NaN anywhere in the step poisons the summed gradient: report it as such
                finite = bool(torch.isfinite(losses).all())
                metrics[Metric.LOSS] = float(losses.mean()) if finite else math.nan
            decision = worst(
                decision, self.guard.on_step_metrics(step, metrics, before_update=True)
            )
        self.last_decision = decision
        update = not (decision.acts or self.guard.halted)
        self._verdict = VERDICT_TRAIN if update else VERDICT_SKIP
        if not update:
            self.guard.summary.add_skipped_update()
            log.info(
                "distill_guard: step %s update skipped (%s)", step, decision.message or "halted"
            )
        return update

    def optimizer_step(self, optimizer: Any, step: int, *, zero_grad: bool = True) -> bool:
        """:meth:`before_update`, then ``optimizer.step()`` only if allowed, then
        ``optimizer.zero_grad()``. Returns whether the update was applied."""
        apply = self.before_update(step)
        if apply:
            optimizer.step()
        if zero_grad:
            optimizer.zero_grad()
        return apply

    def after_update(self, step: int, metrics: Mapping[str, float | None]) -> Decision:
        """Feed the step's metrics (keyed by :class:`~distill_guard.observations.Metric` roles).

        The loss is left out when it was already judged raw in :meth:`before_update`; the
        student's entropy from :meth:`observe_distill_loss` is added when ``metrics`` lack it.
        """
        self.last_decision = self._feed.after_update(step, metrics)
        return self.last_decision

    def after_logs(
        self,
        step: int,
        logs: Mapping[str, Any],
        roles: Sequence[str] | None = None,
        *,
        skip_if_absent: bool = True,
    ) -> Decision | None:
        """Feed a framework's logged metrics, read through :attr:`metric_names` (only ``roles``
        if given). None, and nothing judged, when none of them was logged and
        ``skip_if_absent``; a host that calls this once per update on every rank passes False,
        so each rank makes the same guard calls."""
        decision = self._feed.after_logs(step, logs, roles, skip_if_absent=skip_if_absent)
        if decision is not None:
            self.last_decision = decision
        return decision

    @property
    def metric_names(self) -> dict[str, str]:
        """``{role: framework name}`` that :meth:`after_logs` reads (the roles themselves by
        default); resolved by :mod:`distill_guard.metric_names`, as replay does."""
        return self._feed.names

    @property
    def loss_before_update(self) -> bool:
        """Set by the first :meth:`observe_loss`: the raw loss is then judged before the update,
        and :meth:`after_update` leaves the loss out (it was already seen)."""
        return self._feed.loss_judged_before_update

    # ------------------------------------------------------------------ colocated teachers

    def wake(self, step: int, *, resume: Any = None) -> Decision:
        """Wake the guard's colocated teacher and check it (:meth:`DistillGuard.wake`). Score
        with it only if the decision does not act, or ``decision.repaired``."""
        self.last_decision = self.guard.wake(step, resume=resume)
        return self.last_decision

    def sleep(self, step: int, *, release: Any = None) -> Decision:
        """Fingerprint the guard's colocated teacher, then release it (:meth:`DistillGuard.sleep`)."""
        self.last_decision = self.guard.sleep(step, release=release)
        return self.last_decision

    # ------------------------------------------------------------------ state

    @property
    def skipped_updates(self) -> int:
        """Updates :meth:`before_update` dropped over the run (kept in the guard's state)."""
        return self.guard.summary.skipped_updates

    @property
    def metrics(self) -> dict[str, float]:
        """The ``guard/*`` metrics of the last step (:data:`distill_guard.summary.GUARD_METRICS`),
        to log with the step's own metrics: ``wandb.log({**logs, **sg.metrics})``."""
        return self.guard.summary.metrics(repairs=self.guard.repairs, verdict=self._verdict)

    @property
    def halted(self) -> bool:
        return self.guard.halted

    @property
    def halt_reason(self) -> str | None:
        return self.guard.halt.message if self.guard.halt else None

    def close(self) -> None:
        """End of training: remove the teacher hooks, deliver pending alerts, write the event
        file's ``closed`` record. ``with StepGuard(...) as sg:`` does it on leaving the block,
        also when the loop raises."""
        self.unwatch()
        self.guard.close()

    def __enter__(self) -> StepGuard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
