"""Hydra presets: each composes against the schema and builds a guard; typos fail early."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

import distill_guard
from distill_guard.checks import EntropyDriftCheck, TruncationCheck
from distill_guard.config import (
    PRESETS,
    GuardConfig,
    build_guard,
    compose_guard_config,
)
from distill_guard.guard import DistillGuard
from distill_guard.observations import LossKind
from distill_guard.policy import Action

PKG_CONF = Path(next(iter(distill_guard.__path__))) / "conf"


def leaves(node, prefix=""):
    """(dotted key, value) of every leaf of a YAML preset, skipping its defaults list."""
    for k, v in node.items():
        if k == "defaults":
            continue
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            yield from leaves(v, key + ".")
        else:
            yield key, v


def test_every_preset_file_is_listed_and_vice_versa():
    files = {p.stem for p in (PKG_CONF / "guard").glob("*.yaml")}
    assert files == set(PRESETS)


@pytest.mark.parametrize("preset", PRESETS)
def test_each_preset_composes_builds_and_carries_its_own_values(preset):
    cfg = compose_guard_config(preset)
    guard = build_guard(cfg)
    assert isinstance(guard, DistillGuard)
    assert {c.name for c in guard.checks} >= {"teacher_collapse", "jsd_ceiling", "entropy_drift"}
    # every value the preset file sets is what the composed config and the built guard hold
    raw = OmegaConf.to_container(OmegaConf.load(PKG_CONF / "guard" / f"{preset}.yaml"))
    built = {c.name: c for c in guard.checks}
    for key, value in leaves(raw):
        composed = OmegaConf.select(cfg, key)
        if hasattr(composed, "name"):  # an enum node: the file names it
            composed = composed.name
        assert composed == value, key
        section, *rest = key.split(".")
        if section == "policy":
            got = getattr(guard.policy, rest[0])
            assert (got.name if hasattr(got, "name") else got) == value, key
        elif section == "checks":
            assert getattr(built[rest[0]], rest[1]) == value, key


def test_presets_differ_where_they_say_they_do():
    default = build_guard(compose_guard_config("default"))
    monitor = build_guard(compose_guard_config("monitor_only"))
    strict = build_guard(compose_guard_config("strict"))
    assert not default.policy.monitor_only and monitor.policy.monitor_only
    assert strict.policy.halt_after_critical_steps < default.policy.halt_after_critical_steps
    assert strict.policy.warn_patience is not None and default.policy.warn_patience is None
    truncation = {
        g: next(c for c in g.checks if isinstance(c, TruncationCheck)) for g in (default, strict)
    }
    assert truncation[strict].max_ratio < truncation[default].max_ratio


@pytest.mark.parametrize(
    "override",
    ["checks.entropy_drift.hh=3", "policy.halt_after_critical_step=2", "run.vocab=5", "nonsense=1"],
)
def test_a_misspelt_key_fails_at_compose_time(override):
    with pytest.raises(ConfigCompositionException):
        compose_guard_config("default", [override])


def test_a_misspelt_key_in_a_preset_file_fails_at_compose_time(tmp_path):
    (tmp_path / "guard").mkdir()
    (tmp_path / "app.yaml").write_text("defaults:\n  - guard: typo\n  - _self_\n")
    (tmp_path / "guard" / "typo.yaml").write_text(
        "defaults:\n  - base_guard\n  - _self_\n\ncheks:\n  truncation:\n    max_ratio: 0.3\n"
    )
    with (
        initialize_config_dir(config_dir=str(tmp_path), version_base="1.3"),
        pytest.raises(ConfigCompositionException),
    ):
        compose(config_name="app")


def test_a_wrong_type_fails_at_compose_time():
    with pytest.raises(ConfigCompositionException):
        compose_guard_config("default", ["checks.truncation.window=three"])


def test_enum_values_by_name():
    cfg = compose_guard_config(
        "default",
        ["policy.critical_action=HALT", "policy.warn_escalation=SKIP_BATCH", "run.loss=REVERSE_KL"],
    )
    guard = build_guard(cfg)
    assert guard.policy.critical_action is Action.HALT
    assert guard.policy.warn_escalation is Action.SKIP_BATCH
    assert guard.run.loss is LossKind.REVERSE_KL
    with pytest.raises(ConfigCompositionException):
        compose_guard_config("default", ["policy.critical_action=EXPLODE"])


def test_overrides_reach_the_built_guard(tmp_path):
    cfg = compose_guard_config(
        "default",
        [
            "run.vocab_size=151936",
            "run.beta=0.1",
            "run.loss_scale=2.0",
            "checks.truncation.enabled=false",
            "checks.entropy_drift.threshold_sigma=5.5",
            "alerts.use_wandb=false",
            "alerts.min_interval_s=30",
            "repair.max_attempts=5",
            f"events_path={tmp_path / 'ev.jsonl'}",
        ],
    )
    guard = build_guard(cfg, rank=2)
    assert (guard.run.vocab_size, guard.run.beta, guard.run.loss_scale) == (151936, 0.1, 2.0)
    assert not any(isinstance(c, TruncationCheck) for c in guard.checks)
    assert next(c for c in guard.checks if isinstance(c, EntropyDriftCheck)).threshold_sigma == 5.5
    assert guard.alerter.use_wandb is False and guard.alerter.min_interval_s == 30
    assert guard.alerter.rank == 2 and guard.rank == 2
    assert guard.repair_attempts == 5
    assert guard.events.path == tmp_path / "ev.jsonl"


def test_bad_values_are_caught_when_building():
    with pytest.raises(ValueError, match="halt_after_critical_steps"):
        build_guard(compose_guard_config("default", ["policy.halt_after_critical_steps=0"]))
    with pytest.raises(ValueError, match="beta"):
        build_guard(compose_guard_config("default", ["run.beta=1.5"]))


def test_unknown_preset():
    with pytest.raises(ValueError, match="unknown preset"):
        compose_guard_config("paranoid")


def test_build_from_the_dataclass_directly():
    guard = build_guard(GuardConfig())
    assert len(guard.checks) == 12 and guard.policy.critical_action is Action.REWAKE


def test_two_guards_from_one_config_share_no_state():
    cfg = compose_guard_config("default")
    a, b = build_guard(cfg), build_guard(cfg)
    assert all(x is not y for x, y in zip(a.checks, b.checks))
    assert a.policy is not b.policy


def test_compose_guard_config_works_inside_a_running_hydra_app(tmp_path):
    """A user's Hydra app that builds a guard by preset name (StepGuard("default") does) must not
    trip over Hydra's global state, and must find its own state intact afterwards."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    (tmp_path / "app.yaml").write_text("answer: 42\n")
    with initialize_config_dir(config_dir=str(tmp_path), version_base="1.3"):
        guard_cfg = compose_guard_config("strict", ["run.vocab_size=7"])
        assert guard_cfg.run.vocab_size == 7 and guard_cfg.policy.halt_after_critical_steps == 2
        assert GlobalHydra.instance().is_initialized()
        assert compose(config_name="app").answer == 42  # the app's search path is back
