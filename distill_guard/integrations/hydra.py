"""``instantiate_callbacks``: build the callbacks of a ``callbacks`` config group.

The lightning-hydra-template convention: ``conf/callbacks/*.yaml`` each define one *named*
``_target_`` node and ``conf/callbacks/default.yaml`` composes them, so the callbacks form a
dict, not a list. Hydra cannot compose list elements from a config group; a dict of named nodes
composes, and each callback can be changed or dropped from the command line
(``callbacks.distill_guard.top_k=8``, ``~callbacks.distill_guard``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig

from distill_guard.errors import GuardTypeError

log = logging.getLogger("distill_guard")


def instantiate_callbacks(callbacks_cfg: DictConfig | Mapping[str, Any] | None) -> list[Any]:
    """Instantiate every node of ``callbacks_cfg`` that has a ``_target_``, in order.

    Nodes without ``_target_`` (and ``None`` values, what ``callbacks=none`` leaves) are skipped;
    anything but a mapping is an error. Pass the result to ``Trainer(callbacks=...)``.
    """
    from hydra.utils import instantiate

    if not callbacks_cfg:
        log.info("distill_guard: no callback configs; none instantiated")
        return []
    if not isinstance(callbacks_cfg, (DictConfig, Mapping)):
        raise GuardTypeError(
            f"callbacks config must be a mapping of named nodes, not {type(callbacks_cfg).__name__}"
            " (Hydra lists do not compose: see conf/callbacks/default.yaml)"
        )
    callbacks = []
    for name, node in callbacks_cfg.items():
        if isinstance(node, (DictConfig, Mapping)) and "_target_" in node:
            log.info("distill_guard: instantiating callback %s <%s>", name, node["_target_"])
            callbacks.append(instantiate(node))
        else:
            log.debug("distill_guard: callbacks.%s has no _target_; skipped", name)
    return callbacks
