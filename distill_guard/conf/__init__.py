"""The guard's Hydra configs (``pkg://distill_guard.conf``): the presets in ``guard/``.

Hydra imports this package when an app puts it on its search path, before it loads a preset;
registering the presets' schema (``guard/base_guard``) here makes the README's recipe work
without importing :mod:`distill_guard.config` first.
"""

from distill_guard.config import register_configs

register_configs()
