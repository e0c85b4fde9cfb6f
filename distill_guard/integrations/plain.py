"""The plain-loop adapter: the guard in any training loop that holds its teacher's logits.

:class:`StepGuard` is what the transformers and Lightning adapters are built on (the core
decides, adapters translate). It collects the teacher's top-k logprobs of every micro-batch, asks
the guard once per optimizer step whether to take the step, and feeds the step's metrics after
it::

    sg = StepGuard("default", ["events_path=guard.jsonl"])
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

from distill_guard.guard import DistillGuard
from distill_guard.observations import Metric
from distill_guard.policy import Action, Decision
from distill_guard.signals import DEFAULT_CHUNK_ROWS

log = logging.getLogger("distill_guard")

GuardLike = Any
"""A :class:`DistillGuard`, a preset name, a guard config node (DictConfig / mapping), or None."""


def resolve_guard(
    guard: GuardLike = None, overrides: Sequence[str] = (), **kwargs: Any
) -> DistillGuard:
    """A guard from whatever a callback was given (Hydra nodes pass presets or config nodes).

    ``None`` or a preset name composes that preset (``default`` for None) with ``overrides``
    (relative to the guard node, e.g. ``"run.vocab_size=151936"``); a config node is built as is;
    a :class:`DistillGuard` is returned unchanged. ``kwargs`` go to :func:`build_guard`.
    """
    if isinstance(guard, DistillGuard):
        if overrides or kwargs:
            raise ValueError(
                "guard_overrides and guard kwargs need a preset or a config, not a guard"
            )
        return guard
    from omegaconf import DictConfig, OmegaConf

    from distill_guard.config import GuardConfig, build_guard, compose_guard_config

    if guard is None or isinstance(guard, str):
        cfg = compose_guard_config(guard or "default", list(overrides))
    elif isinstance(guard, (DictConfig, Mapping)):
        cfg = OmegaConf.merge(OmegaConf.structured(GuardConfig), guard)
        if overrides:
            cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(list(overrides)))
    else:
        raise TypeError(
            f"guard must be a DistillGuard, a preset name, a config node or None, not {type(guard).__name__}"
        )
    return build_guard(cfg, **kwargs)


def teacher_logprobs_from_logits(
    logits: torch.Tensor,
    *,
    top_k: int = 16,
    mask: torch.Tensor | None = None,
    labels: torch.Tensor | None = None,
    ignore_index: int = -100,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Top-k logprobs ``[n, k]`` (and logprobs of ``labels``, ``[n]``) of the kept positions.

    ``logits`` is ``[..., V]``; ``mask`` and ``labels`` have its leading shape (positions whose
    label is ``ignore_index`` are dropped). Works in float32 row chunks of ``chunk_rows``, so the
    extra memory is one ``[chunk_rows, V]`` block whatever the batch.
    """
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    v = logits.shape[-1]
    z = logits.detach().reshape(-1, v)
    keep = None if mask is None else mask.detach().reshape(-1).to(device=z.device, dtype=torch.bool)
    lab = None
    if labels is not None:
        lab = labels.detach().reshape(-1).to(z.device)
        valid = lab != ignore_index
        keep = valid if keep is None else keep & valid
    if keep is not None and keep.numel() != z.shape[0]:
        raise ValueError(f"mask/labels have {keep.numel()} positions for {z.shape[0]} logit rows")
    k = min(top_k, v)
    tops: list[torch.Tensor] = []
    toks: list[torch.Tensor] = []
    for a in range(0, z.shape[0], chunk_rows):
        b = min(a + chunk_rows, z.shape[0])
        c = z[a:b]
        if keep is not None:
            c = c[keep[a:b]]
        if c.shape[0] == 0:
            continue
        c = c.float()
        lse = torch.logsumexp(c, dim=-1, keepdim=True)
        tops.append(c.topk(k, dim=-1).values - lse)
        if lab is not None:
            ids = lab[a:b][keep[a:b]] if keep is not None else lab[a:b]
            toks.append((c.gather(-1, ids.long().unsqueeze(-1)) - lse).squeeze(-1))
    topk = torch.cat(tops) if tops else z.new_empty((0, k), dtype=torch.float32)
    token = None
    if lab is not None:
        token = torch.cat(toks) if toks else z.new_empty((0,), dtype=torch.float32)
    return topk, token


def _logits_of(output: Any) -> torch.Tensor | None:
    """The logits of a model's forward output (a ModelOutput, a tuple, or a tensor)."""
    logits = getattr(output, "logits", None)
    if logits is None and isinstance(output, (tuple, list)) and output:
        logits = output[0]
    if logits is None and isinstance(output, torch.Tensor):
        logits = output
    return logits if isinstance(logits, torch.Tensor) else None


def _worst(*decisions: Decision) -> Decision:
    return max(decisions, key=lambda d: (d.action.rank, d.intended.rank if d.intended else -1))


class StepGuard:
    """One optimizer step at a time: collect the teacher's scores, decide, then watch metrics.

    Per optimizer step, on every rank alike: ``observe_*`` any number of times (micro-batches),
    then :meth:`before_update` (one ``on_teacher_scores``, plus one ``on_step_metrics`` with the
    raw loss once :meth:`observe_loss` has been used), then :meth:`after_update`. With a reducer
    on the guard each of these is one collective, so the call pattern must match across ranks.

    Args:
        guard: the guard (or a preset name / config node, see :func:`resolve_guard`).
        overrides: Hydra overrides of a preset or config node (``"events_path=guard.jsonl"``).
        top_k: teacher top-k kept per position when reducing full logits.
        chunk_rows: rows per float32 chunk when reducing full logits.
        learn_vocab_size: when the guard's ``run.vocab_size`` is unset, take it from the logits'
            width (exact for in-process teachers: the width is the distribution's support).
    """

    def __init__(
        self,
        guard: GuardLike = None,
        overrides: Sequence[str] = (),
        *,
        top_k: int = 16,
        chunk_rows: int = DEFAULT_CHUNK_ROWS,
        learn_vocab_size: bool = True,
    ) -> None:
        self.guard = resolve_guard(guard, overrides)
        self.top_k = top_k
        self.chunk_rows = chunk_rows
        self.learn_vocab_size = learn_vocab_size
        self.collecting = True
        """Hooks installed by :meth:`watch` record only while this is True (adapters switch it
        off outside training steps, so evaluation forwards are not counted)."""
        self.loss_before_update = False
        """Set by the first :meth:`observe_loss`: the raw loss is then judged before the update,
        and :meth:`after_update` leaves the loss out (it was already seen)."""
        self.last_decision: Decision = Decision(None, Action.CONTINUE)
        """The decision behind the last :meth:`before_update` / :meth:`after_update`."""
        self.skipped_updates = 0
        self._topk: list[torch.Tensor] = []
        self._token: list[torch.Tensor] = []
        self._losses: list[torch.Tensor] = []
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
        topk, token = teacher_logprobs_from_logits(
            logits,
            top_k=self.top_k,
            mask=mask,
            labels=labels,
            ignore_index=ignore_index,
            chunk_rows=self.chunk_rows,
        )
        self.observe_teacher_logprobs(topk_logprobs=topk, token_logprobs=token)

    def observe_teacher_logprobs(
        self,
        *,
        token_logprobs: torch.Tensor | None = None,
        topk_logprobs: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
    ) -> None:
        """Record teacher logprobs already reduced: sampled tokens ``[n]`` and/or top-k ``[n, k]``."""
        if mask is not None:
            m = mask.detach().reshape(-1).to(torch.bool)
            token_logprobs = token_logprobs.reshape(-1)[m] if token_logprobs is not None else None
            topk_logprobs = (
                topk_logprobs.reshape(-1, topk_logprobs.shape[-1])[m]
                if topk_logprobs is not None
                else None
            )
        if topk_logprobs is not None:
            if self._topk and self._topk[0].shape[-1] != topk_logprobs.shape[-1]:
                raise ValueError(
                    f"top-k width changed within a step: {self._topk[0].shape[-1]} then "
                    f"{topk_logprobs.shape[-1]}"
                )
            self._topk.append(topk_logprobs.detach().reshape(-1, topk_logprobs.shape[-1]))
        if token_logprobs is not None:
            self._token.append(token_logprobs.detach().reshape(-1))

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

    def watch(self, module: torch.nn.Module) -> Any:
        """Observe every forward of ``module`` (the teacher) while :attr:`collecting`.

        The mask is the forward's ``attention_mask`` keyword when given. Returns the hook handle;
        :meth:`unwatch` removes all of them.
        """

        def hook(_mod: Any, _args: Any, kwargs: dict[str, Any], output: Any) -> None:
            if not self.collecting:
                return
            logits = _logits_of(output)
            if logits is None:
                log.debug("distill_guard: teacher forward returned no logits; not observed")
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
        topk = torch.cat(self._topk) if self._topk else None
        token = torch.cat(self._token) if self._token else None
        losses = torch.stack(self._losses) if self._losses else None
        self._topk, self._token, self._losses = [], [], []
        decision = self.guard.on_teacher_scores(step, token_logprobs=token, topk_logprobs=topk)
        if self.loss_before_update:
            metrics: dict[str, float] = {}
            if losses is not None:
                finite = torch.isfinite(losses)
                # a NaN anywhere in the step poisons the summed gradient: report it as such
                metrics[Metric.LOSS] = float(losses.mean()) if bool(finite.all()) else math.nan
            decision = _worst(decision, self.guard.on_step_metrics(step, metrics))
        self.last_decision = decision
        update = not (decision.acts or self.guard.halted)
        if not update:
            self.skipped_updates += 1
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

        The loss is left out when it was already judged raw in :meth:`before_update`.
        """
        values = {k: _scalar(v) for k, v in metrics.items() if v is not None}
        if self.loss_before_update:
            values.pop(Metric.LOSS, None)
        decision = self.guard.on_step_metrics(step, values)
        self.last_decision = decision
        return decision

    # ------------------------------------------------------------------ colocated teachers

    def after_wake(self, step: int) -> Decision:
        """Right after waking a colocated teacher: the guard's canary (and repair, if it holds
        the teacher). Score with the teacher only if the decision does not act or it was repaired."""
        self.last_decision = self.guard.after_wake(step)
        return self.last_decision

    def before_sleep(self, step: int) -> None:
        """Just before putting a colocated teacher to sleep: the canary's fingerprint."""
        self.guard.before_sleep(step)

    # ------------------------------------------------------------------ state

    @property
    def halted(self) -> bool:
        return self.guard.halted

    @property
    def halt_reason(self) -> str | None:
        halt = self.guard.summary.halt
        return halt["message"] if halt else None


def _scalar(value: Any) -> float:
    if isinstance(value, torch.Tensor):
        return float(value.detach().float().mean())
    return float(value)


def map_metrics(logs: Mapping[str, Any], metric_keys: Mapping[str, str]) -> dict[str, float | None]:
    """Pick the roles' values out of a framework's metrics by ``{role: framework key}``.

    A key ending in ``*`` takes the first matching key (``"eval/*"``), skipping truncation
    ratios and sub-metrics, as :data:`~distill_guard.observations.RELAX_METRIC_NAMES` describes.
    """
    out: dict[str, float | None] = {}
    for role, key in metric_keys.items():
        if not key:
            continue
        if key.endswith("*"):
            prefix = key[:-1]
            key = next(
                (
                    k
                    for k in logs
                    if k.startswith(prefix) and "truncated" not in k and "/" not in k[len(prefix) :]
                ),
                "",
            )
        if key in logs and logs[key] is not None:
            try:
                out[role] = _scalar(logs[key])
            except (TypeError, ValueError):
                continue
    return out
