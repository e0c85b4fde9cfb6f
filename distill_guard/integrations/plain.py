"""The plain-loop adapter: the guard in any training loop that holds its teacher's logits.

:class:`StepGuard` is what the transformers and Lightning adapters are built on (the core
decides, adapters translate). It collects the teacher's top-k logprobs of every micro-batch, asks
the guard once per optimizer step whether to take the step, and feeds the step's metrics after
it::

    with StepGuard("default", ["events_path=guard.jsonl"], teacher=teacher) as sg:
        for step, batch in enumerate(loader):
            with torch.no_grad():
                t_logits = teacher(**batch).logits
            sg.observe_teacher_logits(t_logits, mask=batch["attention_mask"])
            loss = distill_loss(student(**batch).logits, t_logits)
            loss.backward()
            sg.optimizer_step(optimizer, step)  # skipped for a dead teacher, a NaN loss, a halt
            sg.after_update(step, {"loss": loss.item()})
            if sg.halted:  # guard.jsonl says why
                torch.save(student.state_dict(), "halt.pt")
                break

``optimizer_step`` is ``before_update`` (may this step be applied?), then ``optimizer.step()``
when it may, then ``optimizer.zero_grad()``; call ``before_update`` yourself where the step is
taken elsewhere.

Full-vocabulary logits are reduced in row chunks (:data:`distill_guard.signals.DEFAULT_CHUNK_ROWS`)
to the top-k logprobs (and, with labels, the sampled-token logprobs): the guard never holds an
``[N, V]`` float32 copy.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from distill_guard.config import GuardSpec, build_guard
from distill_guard.guard import DistillGuard
from distill_guard.losses import DistillLoss
from distill_guard.metric_names import as_float, pick_metrics
from distill_guard.observations import Metric
from distill_guard.policy import Action, Decision
from distill_guard.signals import DEFAULT_CHUNK_ROWS, teacher_logprobs_from_logits
from distill_guard.summary import VERDICT_SKIP, VERDICT_TRAIN

log = logging.getLogger("distill_guard")


def _logits_of(output: Any) -> torch.Tensor | None:
    """The logits of a model's forward output (a ModelOutput, a tuple, or a tensor)."""
    logits = getattr(output, "logits", None)
    if logits is None and isinstance(output, (tuple, list)) and output:
        logits = output[0]
    if logits is None and isinstance(output, torch.Tensor):
        logits = output
    return logits if isinstance(logits, torch.Tensor) else None


def vocab_width(module: torch.nn.Module) -> int | None:
    """The width of ``module``'s logits: its config's ``vocab_size`` (the text config's for a
    multimodal model), else its output embeddings' rows; None when it tells neither."""
    config = getattr(module, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()
    vocab = getattr(config, "vocab_size", None)
    if isinstance(vocab, int) and vocab > 1:
        return vocab
    head = module.get_output_embeddings() if hasattr(module, "get_output_embeddings") else None
    weight = getattr(head, "weight", None)
    return int(weight.shape[0]) if isinstance(weight, torch.Tensor) else None


def _joined(parts: list[torch.Tensor], rows: int) -> torch.Tensor | None:
    """The step's micro-batches as one tensor; None when some micro-batch did not give this
    view (the positions of the others would not line up with the logprobs)."""
    if not parts:
        return None
    joined = torch.cat(parts)
    return joined if joined.shape[0] == rows else None


def _mean_entropy(parts: list[torch.Tensor]) -> float | None:
    """The student's entropy over the step's valid positions (``[sum, count]`` per micro-batch),
    in one host transfer; None when no position was valid."""
    if not parts:
        return None
    total, count = torch.stack(parts).sum(dim=0).tolist()
    return total / count if count else None


def _worst(*decisions: Decision) -> Decision:
    return max(decisions, key=lambda d: (d.action.rank, d.intended.rank if d.intended else -1))


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
        self.metric_names = dict(metric_names or {role: role for role in Metric.ALL})
        """``{role: framework name}`` that :meth:`after_logs` reads (the roles themselves by
        default); resolved by :mod:`distill_guard.metric_names`, as replay does."""
        self.loss_before_update = False
        """Set by the first :meth:`observe_loss`: the raw loss is then judged before the update,
        and :meth:`after_update` leaves the loss out (it was already seen)."""
        self.last_decision: Decision = Decision(None, Action.CONTINUE)
        """The decision behind the last :meth:`before_update` / :meth:`after_update`."""
        self._verdict = VERDICT_TRAIN
        self._topk: list[torch.Tensor] = []
        self._token: list[torch.Tensor] = []
        self._ids: list[torch.Tensor] = []
        self._token_ids: list[torch.Tensor] = []
        self._samples: list[torch.Tensor] = []
        self._losses: list[torch.Tensor] = []
        self._entropy: list[torch.Tensor] = []
        self._step_entropy: float | None = None
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
        with (optionally) the top-k ids, the sampled token ids and each position's sample, which
        the pairing checks need (a tokenizer mismatch, a shift by one position)."""
        keep = mask.detach().reshape(-1).to(torch.bool) if mask is not None else None

        def rows(x: torch.Tensor | None, per_row: bool = False) -> torch.Tensor | None:
            """``x`` as one row per position (``[n]``, or ``[n, k]`` if ``per_row``), masked."""
            if x is None:
                return None
            x = x.detach().reshape(-1, x.shape[-1]) if per_row else x.detach().reshape(-1)
            return x[keep] if keep is not None else x

        topk_logprobs, topk_ids = rows(topk_logprobs, per_row=True), rows(topk_ids, per_row=True)
        token_logprobs, token_ids = rows(token_logprobs), rows(token_ids)
        sample_index = rows(sample_index)
        if topk_logprobs is not None:
            if self._topk and self._topk[0].shape[-1] != topk_logprobs.shape[-1]:
                raise ValueError(
                    f"top-k width changed within a step: {self._topk[0].shape[-1]} then "
                    f"{topk_logprobs.shape[-1]}"
                )
            self._topk.append(topk_logprobs)
        if token_logprobs is not None:
            self._token.append(token_logprobs)
        if topk_ids is not None:
            self._ids.append(topk_ids)
        if token_ids is not None:
            self._token_ids.append(token_ids)
        if sample_index is not None:
            # samples of later micro-batches are new samples: number them after this step's last
            offset = int(self._samples[-1].max()) + 1 if self._samples else 0
            self._samples.append(sample_index + offset)

    def observe_loss(self, loss: torch.Tensor | float) -> None:
        """Record one micro-batch's raw loss, as computed (before any NaN filtering or scaling).

        transformers' ``logging_nan_inf_filter`` replaces a NaN loss before ``on_log`` sees it;
        the raw loss observed here is judged before the update instead.
        """
        self.loss_before_update = True
        t = (
            loss.detach().float().reshape(())
            if isinstance(loss, torch.Tensor)
            else torch.tensor(float(loss))
        )
        self._losses.append(t)

    def observe_distill_loss(self, out: DistillLoss) -> None:
        """Record one micro-batch from :func:`~distill_guard.losses.distill_loss`'s output alone,
        in place of :meth:`observe_teacher_logits` and :meth:`observe_loss`: the loss already
        read the logits, so the guard's teacher and student signals cost no second pass.

        The guard gets the teacher's top-1 logprob of each valid position (as a ``[n, 1]`` top-k:
        all the uniform and near-uniform teacher checks need), each position's sample (the
        logits' leading dim), the raw loss (as :meth:`observe_loss`), and the student's mean
        entropy, which :meth:`after_update` / :meth:`after_logs` report as ``student_entropy``
        when the step's metrics lack it. When unset, ``run.vocab_size`` is learnt from the
        logits' width; the run's loss kind, β and scale are taken from ``out``.

        Not from these signals: the pairing checks (a tokenizer mismatch, logprobs shifted by
        one position) need the teacher's top-k ids and the sampled tokens, which only
        ``observe_teacher_logits(logits, labels=...)`` gives. The signals are at the loss's
        temperature: at τ > 1 a healthy teacher looks flatter than at its own.
        """
        if not isinstance(out, DistillLoss):
            raise TypeError(
                f"observe_distill_loss takes distill_loss(...)'s DistillLoss, got {type(out).__name__}"
            )
        self._learn_run(out)
        self.observe_loss(out.loss)
        valid = out.valid.reshape(-1)
        entropy = torch.where(valid, out.student_entropy.reshape(-1).double(), 0.0).sum()
        self._entropy.append(torch.stack([entropy, valid.sum().double()]))
        if self._topk and self._topk[0].shape[-1] != 1:
            # the teacher's logits were already reduced this step (a watch hook, or the caller)
            self._tell_once(
                "twice",
                "distill_guard: this step's teacher logits were reduced to top-%d logprobs "
                "besides distill_loss's signals; those are judged, the fused ones not. Use "
                "watch(teacher, logits=False) (the TRL mixin's distill_guard_fused_loss, "
                "Lightning's DistillGuardCallback(fused_loss=True)) to read the logits once",
                self._topk[0].shape[-1],
            )
            return
        self.observe_teacher_logprobs(
            topk_logprobs=out.teacher_top1_logprob.unsqueeze(-1),
            mask=out.valid,
            sample_index=out.sample_index,
        )

    def _learn_run(self, out: DistillLoss) -> None:
        """The run's facts as ``out`` states them: V when unset, and the loss the caller takes."""
        run = self.guard.run
        facts = {"loss": out.kind, "beta": out.beta, "loss_scale": out.scale}
        if self.learn_vocab_size and run.vocab_size is None:
            facts["vocab_size"] = out.vocab_size
        changed = {k: v for k, v in facts.items() if getattr(run, k) != v}
        if not changed:
            return
        said = {k: getattr(run, k) for k in changed if k != "vocab_size"}
        if said:
            log.info(
                "distill_guard: the guard's run said %s, the loss handed to observe_distill_loss "
                "is %s; the guard judges by the loss's",
                said,
                {k: changed[k] for k in said},
            )
        self.guard.run = dataclasses.replace(run, **changed)

    def _tell_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._told:
            self._told.add(key)
            log.info(message, *args)

    def watch(self, module: torch.nn.Module, *, canary: bool = True, logits: bool = True) -> Any:
        """Observe every forward of ``module`` (the teacher) while :attr:`collecting`, and (with
        ``canary``) check the module itself on the guard's canary before each update: a teacher
        whose weights turned to noise scores like any teacher, only the canary tells.

        The mask is the forward's ``attention_mask`` keyword when given. Returns the hook handle;
        :meth:`unwatch` removes all of them. ``logits=False``: no hook, only the canary (the
        loop hands :meth:`observe_distill_loss` what the loss read of the logits); returns None.
        """
        if canary and self.guard.module_canary is None:
            self.guard.watch_module_teacher(module)
        if not logits:
            return None
        module_vocab = vocab_width(module)
        told: set[int] = set()

        def hook(_mod: Any, _args: Any, kwargs: dict[str, Any], output: Any) -> None:
            module_canary = self.guard.module_canary
            if not self.collecting or (module_canary is not None and module_canary.running):
                return
            logits = _logits_of(output)
            vocab = self.guard.run.vocab_size or module_vocab
            if logits is None or (vocab is not None and logits.shape[-1] != vocab):
                width = -1 if logits is None else int(logits.shape[-1])
                if width not in told:  # once per kind of output, not on every step
                    told.add(width)
                    log.info(
                        "distill_guard: a forward of the watched teacher returned %s, not logits "
                        "over its %s-token vocabulary; such outputs are not judged (a trainer "
                        "that projects the teacher's hidden states itself must hand them to "
                        "StepGuard.observe_teacher_hidden_states)",
                        "no tensor" if logits is None else f"width {width}",
                        vocab,
                    )
                return
            mask = kwargs.get("attention_mask")
            if not isinstance(mask, torch.Tensor) or mask.shape != logits.shape[:-1]:
                mask = None
            try:
                self.observe_teacher_logits(logits, mask=mask)
            except Exception:  # noqa: BLE001 - the guard must not break the teacher's forward
                log.exception("distill_guard: could not observe the teacher's logits")

        handle = module.register_forward_hook(hook, with_kwargs=True)
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
        through ``head`` (its output embeddings), times ``logit_scale``, then
        ``softcap * tanh(z / softcap)``, as the trainer's loss does, a few samples at a time (one
        ``[~chunk_rows, V]`` block at once, never ``[B, K, V]``). ``mask`` and ``labels`` are
        ``[B, K]``."""
        if hidden.dim() == 2:
            hidden = hidden.unsqueeze(0)
            mask = None if mask is None else mask.reshape(1, -1)
            labels = None if labels is None else labels.reshape(1, -1)
        per = max(1, self.chunk_rows // max(1, hidden.shape[1]))
        with torch.no_grad():
            for a in range(0, hidden.shape[0], per):
                z = head(hidden[a : a + per].to(head.weight.dtype)) * logit_scale
                if softcap is not None:
                    z = softcap * torch.tanh(z / softcap)
                self.observe_teacher_logits(
                    z,
                    mask=None if mask is None else mask[a : a + per],
                    labels=None if labels is None else labels[a : a + per],
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
        topk_rows = sum(t.shape[0] for t in self._topk)
        token_rows = sum(t.shape[0] for t in self._token)
        topk, ids, samples = (_joined(x, topk_rows) for x in (self._topk, self._ids, self._samples))
        token, token_ids = (_joined(x, token_rows) for x in (self._token, self._token_ids))
        losses = torch.stack(self._losses) if self._losses else None
        self._step_entropy = _mean_entropy(self._entropy)
        self._topk, self._token, self._losses, self._entropy = [], [], [], []
        self._ids, self._token_ids, self._samples = [], [], []
        decision = self.guard.on_teacher_scores(
            step,
            token_logprobs=token,
            topk_logprobs=topk,
            topk_ids=ids,
            token_ids=token_ids,
            sample_index=samples,
        )
        if self.loss_before_update:
            metrics: dict[str, float] = {}
            if losses is not None:
                finite = torch.isfinite(losses)
                # a NaN anywhere in the step poisons the summed gradient: report it as such
                metrics[Metric.LOSS] = float(losses.mean()) if bool(finite.all()) else math.nan
            decision = _worst(
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
        return self._judge_metrics(step, metrics, self._take_entropy())

    def _take_entropy(self) -> float | None:
        entropy, self._step_entropy = self._step_entropy, None
        return entropy

    def _judge_metrics(
        self, step: int, metrics: Mapping[str, float | None], entropy: float | None
    ) -> Decision:
        values = {k: as_float(v) for k, v in metrics.items() if v is not None}
        if entropy is not None:
            values.setdefault(Metric.STUDENT_ENTROPY, entropy)
        if self.loss_before_update:
            values.pop(Metric.LOSS, None)
        decision = self.guard.on_step_metrics(step, values)
        self.last_decision = decision
        return decision

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
        names = self.metric_names
        if roles is not None:
            names = {role: names[role] for role in roles if role in names}
        metrics = pick_metrics(logs, names)
        wants_entropy = roles is None or Metric.STUDENT_ENTROPY in roles
        if (
            not metrics
            and skip_if_absent
            and not (wants_entropy and self._step_entropy is not None)
        ):
            return None
        return self._judge_metrics(step, metrics, self._take_entropy() if wants_entropy else None)

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


RENAMED_ARGUMENTS = {"guard_overrides": "overrides"}
"""Keyword arguments renamed before 1.0: refused with the new name rather than kept as aliases
(one name in code, yaml and docs; an alias would outlive every caller that still used it)."""


def refuse_unexpected(owner: str, unexpected: Mapping[str, Any]) -> None:
    """Raise the TypeError Python would raise for unknown keywords, naming a renamed one's new name."""
    for name in unexpected:
        new = RENAMED_ARGUMENTS.get(name)
        if new is not None:
            raise TypeError(f"{owner}() got the keyword argument {name!r}: it is now {new!r}")
        raise TypeError(f"{owner}() got an unexpected keyword argument {name!r}")


class GuardedCallback:
    """What every trainer callback shares: a :class:`StepGuard` that collects only inside
    training steps, the framework's metric names, and the halt and all-rank settings.

    Args:
        guard: a guard, a preset name (``default``/``monitor_only``/``strict``), or a guard
            config node; None composes ``default``.
        overrides: Hydra overrides for a preset or config, e.g. ``["run.vocab_size=151936"]``
            (the name :func:`~distill_guard.config.build_guard` and :class:`StepGuard` use; the
            old ``guard_overrides=`` is refused with a TypeError that names it).
        metric_keys: ``{role: logged name}``; the framework's names by default.
        top_k: teacher top-k kept per position when reducing in-process teacher logits.
        save_on_halt: save a checkpoint before stopping on a halt.
        consensus_timeout_s: per-hook timeout of the all-rank agreement under ``torch.distributed``.
    """

    default_metric_names: Mapping[str, str] = {}
    """The framework's own metric names (set by each adapter)."""

    def __init__(
        self,
        guard: GuardSpec = None,
        *,
        overrides: Sequence[str] = (),
        metric_keys: Mapping[str, str] | None = None,
        top_k: int = 16,
        save_on_halt: bool = True,
        consensus_timeout_s: float = 60.0,
        **unexpected: Any,
    ) -> None:
        refuse_unexpected(type(self).__name__, unexpected)
        names = self.default_metric_names if metric_keys is None else metric_keys
        self.step_guard = StepGuard(
            guard, overrides, top_k=top_k, collecting=False, metric_names=names
        )
        self.save_on_halt = save_on_halt
        self.consensus_timeout_s = consensus_timeout_s

    @property
    def guard(self) -> DistillGuard:
        return self.step_guard.guard

    def observe_teacher_logits(self, logits: torch.Tensor, **kwargs: Any) -> None:
        """Hand the teacher's logits of this micro-batch to the guard (``mask=``, ``labels=``);
        judged before this step's optimizer update."""
        self.step_guard.observe_teacher_logits(logits, **kwargs)

    def observe_teacher_logprobs(self, **kwargs: Any) -> None:
        """Same, with logprobs already reduced (``token_logprobs=``, ``topk_logprobs=``, ``mask=``)."""
        self.step_guard.observe_teacher_logprobs(**kwargs)

    def observe_loss(self, loss: torch.Tensor | float) -> None:
        """Hand the raw micro-batch loss to the guard (it sees a NaN a log filter would hide)."""
        self.step_guard.observe_loss(loss)

    def observe_distill_loss(self, out: DistillLoss) -> None:
        """Hand this micro-batch's :func:`~distill_guard.losses.distill_loss` output to the
        guard: teacher scores, raw loss and student entropy from the loss's own pass
        (:meth:`StepGuard.observe_distill_loss`)."""
        self.step_guard.observe_distill_loss(out)
