"""Trainer integrations: thin translations from a framework's events to the guard's hooks.

Each submodule imports its framework itself, so ``import distill_guard`` (and this package) pull
in neither transformers nor Lightning:

- :mod:`~distill_guard.integrations.plain`: :class:`StepGuard`, for any hand-written loop; the
  base of the two below.
- :mod:`~distill_guard.integrations.transformers`: a ``TrainerCallback`` and a mixin for trainers
  that run the teacher in-process (TRL's ``GKDTrainer`` and its kin).
- :mod:`~distill_guard.integrations.lightning`: a Lightning ``Callback``.
- :mod:`~distill_guard.integrations.relax`: Relax's function-path hooks and an SDPO feedback class.
- :mod:`~distill_guard.integrations.hydra`: ``instantiate_callbacks`` for ``conf/callbacks``.
"""
