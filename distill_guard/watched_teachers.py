"""The teachers a guard checks, and what their checks are held against across a resume.

A live teacher (:class:`~distill_guard.live.colocate.ColocatedTeacher`: slept, woken, verified,
repaired), an in-process teacher module (:class:`~distill_guard.live.module_canary.ModuleCanary`:
scored before each update), and the teacher's reference from outside the run that both are held
against (:mod:`distill_guard.live.teacher_reference`). Each is restored from a loaded state
whenever it is created, before or after ``load_state_dict`` (the HF mixin watches its teacher at
the first ``compute_loss``, after the Trainer loaded the state): ``docs/invariants.md`` §3.4.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from distill_guard.checks.canary import CanaryCheck
from distill_guard.findings import Finding
from distill_guard.live.canary import Canary
from distill_guard.live.colocate import ColocatedTeacher
from distill_guard.live.module_canary import ModuleCanary
from distill_guard.live.repair import Reloader
from distill_guard.live.teacher_reference import (
    TeacherReference,
    make_reference,
    module_checkpoint,
    server_checkpoint,
)
from distill_guard.teachers.base import Teacher

if TYPE_CHECKING:
    from distill_guard.live.replicas import ReplicatedTeacher

LIVE_STATE_KEYS = ("canary", "incidents")
"""The keys of a live teacher's state in the guard's state (:meth:`ColocatedTeacher.state_dict`)."""

TEACHER_STATE_KEYS = (*LIVE_STATE_KEYS, "module_canary", "teacher_reference", "replicas")
"""Every key :meth:`WatchedTeachers.state_dict` adds to the guard's state (the guard refuses a
state with a top-level key that is neither one of these nor one of its own)."""


class WatchedTeachers:
    """The guard's teachers, their canaries and the reference they are held against.

    Args:
        canary_spec: the canary a teacher gets (the configured ``checks.canary``).
        reloader, repair_attempts, repair_backoff_s: a live teacher's repair.
        reference_spec: where the teacher's reference comes from (a
            :class:`TeacherReference`, a file, a checkpoint directory, ``auto``, or None).
    """

    def __init__(
        self,
        canary_spec: Canary | CanaryCheck | None,
        *,
        reloader: Reloader | None,
        repair_attempts: int,
        repair_backoff_s: float,
        reference_spec: TeacherReference | str | os.PathLike[str] | None,
    ) -> None:
        self.canary_spec = canary_spec
        self.reloader = reloader
        self.repair_attempts = repair_attempts
        self.repair_backoff_s = repair_backoff_s
        self.reference_spec = (
            None if isinstance(reference_spec, TeacherReference) else reference_spec
        )
        self.reference: TeacherReference | None = (
            reference_spec if isinstance(reference_spec, TeacherReference) else None
        )
        """The teacher's reference from outside the run, once made (kept in the state)."""
        self.colocated: ColocatedTeacher | None = None
        self.module_canary: ModuleCanary | None = None
        self.replicated: ReplicatedTeacher | None = None
        """A live teacher made of replicas (:meth:`attach_replicas`), in place of
        :attr:`colocated`."""
        self._replicas_state: dict[str, Any] | None = None
        self.pending: list[Finding] = []
        """Findings made outside a hook (a reference that could not be had), said at the next."""
        self._live_state: dict[str, Any] | None = None
        self._module_state: dict[str, Any] | None = None

    def attach(
        self,
        teacher: Teacher,
        canary: Canary | CanaryCheck | None,
        reloader: Reloader | None,
        *,
        temperature: float,
    ) -> ColocatedTeacher:
        """The live teacher, with a loaded state's fingerprint and the reference."""
        canary = canary if canary is not None else self.canary_spec
        if isinstance(canary, CanaryCheck):
            canary = Canary(canary)
        self.colocated = ColocatedTeacher(
            teacher,
            canary,
            reloader=reloader if reloader is not None else self.reloader,
            repair_attempts=self.repair_attempts,
            repair_backoff_s=self.repair_backoff_s,
        )
        if self._live_state is not None:  # a resumed run's fingerprint, saved before
            self.colocated.load_state_dict(self._live_state)
        self._install(self.colocated.canary, temperature, lambda: server_checkpoint(teacher))
        return self.colocated

    def attach_replicas(self, replicated: ReplicatedTeacher) -> ReplicatedTeacher:
        """The live teacher made of replicas, with a loaded state's fleet (each replica is held
        against ``replicated.reference``, which it was made with)."""
        self.replicated = replicated
        if self.reference is None:
            self.reference = replicated.reference
        if self._replicas_state is not None:
            replicated.load_state_dict(self._replicas_state)
        return replicated

    def watch_module(
        self,
        module: torch.nn.Module,
        *,
        vocab_size: int | None,
        consumed_temperature: float,
        temperature: float,
    ) -> ModuleCanary:
        """The in-process teacher's canary, scored at ``consumed_temperature`` (the loss's),
        with a loaded state and the reference (taken at the run's ``temperature``)."""
        spec = self.canary_spec
        self.module_canary = ModuleCanary(
            module,
            spec.check if isinstance(spec, Canary) else spec,
            vocab_size=vocab_size,
            temperature=consumed_temperature,
        )
        if self._module_state is not None:  # a resumed run's reference, saved before
            self.module_canary.load_state_dict(self._module_state)
        self._install(self.module_canary.canary, temperature, lambda: module_checkpoint(module))
        return self.module_canary

    def _install(
        self, canary: Canary, temperature: float, own_checkpoint: Callable[[], str | None]
    ) -> None:
        """Give ``canary`` the reference, making it first if needed; one that cannot be had is
        a finding (:attr:`pending`), and the canary goes on against the fingerprint."""
        if self.reference is None and self.reference_spec is not None:
            self.reference, unavailable = make_reference(
                self.reference_spec,
                canary.check,
                temperature=temperature,
                own_checkpoint=own_checkpoint,
            )
            if unavailable is not None:
                self.pending.append(unavailable)
            self.reference_spec = None  # made or said once; the state keeps the reference
        if self.reference is not None:
            canary.use_reference(self.reference)

    def canaries(self) -> list[Canary]:
        out = [self.colocated.canary] if self.colocated is not None else []
        return out + ([self.module_canary.canary] if self.module_canary is not None else [])

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {}
        if self.colocated is not None:
            state |= self.colocated.state_dict()
        if self.module_canary is not None:
            state["module_canary"] = self.module_canary.state_dict()
        if self.replicated is not None:
            state["replicas"] = self.replicated.state_dict()
        if self.reference is not None:
            state["teacher_reference"] = self.reference.to_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what exists now; keep the rest for the teacher created later."""
        if state.get("teacher_reference"):  # the reference the run was judged against, kept
            self.reference = TeacherReference.from_dict(state["teacher_reference"])
            self.reference_spec = None
        self._live_state = {k: state[k] for k in LIVE_STATE_KEYS if k in state}
        if self.colocated is not None:
            self.colocated.load_state_dict(self._live_state)
        self._replicas_state = state.get("replicas")
        if self.replicated is not None and self._replicas_state is not None:
            self.replicated.load_state_dict(self._replicas_state)
        self._module_state = state.get("module_canary")
        if self.module_canary is not None and self._module_state is not None:
            self.module_canary.load_state_dict(self._module_state)
        for canary in self.canaries():
            if self.reference is not None:
                canary.use_reference(self.reference)
