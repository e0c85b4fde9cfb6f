"""conf/callbacks composes as a dict of named nodes; instantiate_callbacks builds the callbacks."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

import distill_guard.conf
from distill_guard.integrations.hydra import instantiate_callbacks

CONF = Path(distill_guard.conf.__file__).parent  # pkg://distill_guard.conf, as installed


def _compose(*overrides):
    with initialize_config_module(config_module="distill_guard.conf", version_base="1.3"):
        return compose(overrides=list(overrides))


def test_every_callback_file_is_one_named_target_node_with_every_argument_commented():
    files = sorted(p for p in (CONF / "callbacks").glob("*.yaml"))
    nodes = [p for p in files if p.stem not in ("default", "hf", "none")]
    assert {p.stem for p in nodes} == {"distill_guard", "distill_guard_hf"}
    for path in nodes:
        cfg = OmegaConf.load(path)
        assert list(cfg) == [path.stem]
        node = cfg[path.stem]
        assert "_target_" in node
        lines = path.read_text().splitlines()
        for key in node:
            if key == "_target_":
                continue
            i = next(i for i, line in enumerate(lines) if line.strip().startswith(f"{key}:"))
            assert lines[i - 1].strip().startswith("#"), f"{path.name}: {key} has no comment"


def test_default_composes_and_instantiates_the_lightning_callback():
    pytest.importorskip("lightning")
    from distill_guard.integrations.lightning import DistillGuardCallback

    cfg = _compose("+callbacks=default", "callbacks.distill_guard.top_k=8")
    (cb,) = instantiate_callbacks(cfg.callbacks)
    assert isinstance(cb, DistillGuardCallback) and cb.step_guard.top_k == 8
    assert cb.guard.policy.halt_after_critical_steps == 3  # the default preset


def test_a_composed_guard_group_is_picked_up():
    pytest.importorskip("lightning")
    cfg = _compose(
        "+guard=strict",
        "+callbacks=default",
        "guard.run.vocab_size=151936",
        "guard.alerts.use_wandb=false",
    )
    (cb,) = instantiate_callbacks(cfg.callbacks)
    assert cb.guard.policy.halt_after_critical_steps == 2  # strict
    assert cb.guard.run.vocab_size == 151936


def test_hf_set_and_removal_and_none():
    pytest.importorskip("transformers")
    from distill_guard.integrations.transformers import DistillGuardCallback

    cfg = _compose("+callbacks=hf", "callbacks.distill_guard_hf.guard=monitor_only")
    (cb,) = instantiate_callbacks(cfg.callbacks)
    assert isinstance(cb, DistillGuardCallback) and cb.guard.policy.monitor_only
    assert (
        instantiate_callbacks(_compose("+callbacks=default", "~callbacks.distill_guard").callbacks)
        == []
    )
    assert instantiate_callbacks(_compose("+callbacks=none").get("callbacks")) == []


def test_instantiate_callbacks_skips_untargeted_nodes_and_rejects_lists():
    cfg = OmegaConf.create({"a": {"_target_": "collections.OrderedDict"}, "b": {"x": 1}, "c": None})
    out = instantiate_callbacks(cfg)
    assert len(out) == 1 and type(out[0]).__name__ == "OrderedDict"
    with pytest.raises(TypeError, match="do not compose"):
        instantiate_callbacks(OmegaConf.create([{"_target_": "collections.OrderedDict"}]))


def test_a_typo_in_a_guard_override_fails_at_build_time():
    pytest.importorskip("lightning")
    cfg = _compose(
        "+callbacks=default", "callbacks.distill_guard.overrides=['policy.halt_afterr=2']"
    )
    with pytest.raises(Exception, match="halt_afterr"):
        instantiate_callbacks(cfg.callbacks)


APP = """
import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

ConfigStore.instance().store(
    name="app",
    node={
        "defaults": [{"guard": "strict"}, "_self_"],
        "hydra": {"searchpath": ["pkg://distill_guard.conf"]},
    },
)


@hydra.main(version_base="1.3", config_path=None, config_name="app")
def main(cfg):
    print("halt_after", cfg.guard.policy.halt_after_critical_steps)


main()
"""


def test_the_readme_recipe_works_in_an_app_that_never_imported_the_package(tmp_path):
    """`pkg://distill_guard.conf` on the search path and `guard: <preset>`, in a fresh process:
    it failed with "Could not load 'guard/base_guard'" unless distill_guard.config was imported
    first (the schema is registered when Hydra imports the conf package)."""
    import subprocess
    import sys

    script = tmp_path / "app.py"
    script.write_text(APP)
    out = subprocess.run(
        [sys.executable, str(script), f"hydra.run.dir={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "halt_after 2" in out.stdout
