"""The in-process teacher's canary: the forward skipped while the weights fingerprint says the
module is bit for bit the one last scored clean, run on its schedule, and run (finding the fault
at that very step) whenever the weights changed."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

pytest.importorskip("transformers")

from distill_guard.checks.canary import CanaryCheck  # noqa: E402
from distill_guard.config import build_guard  # noqa: E402
from distill_guard.errors import GuardValueError  # noqa: E402
from distill_guard.findings import Code  # noqa: E402
from distill_guard.live import module_canary as module_canary_mod  # noqa: E402
from distill_guard.live import weights_fingerprint  # noqa: E402
from distill_guard.live.module_canary import ModuleCanary  # noqa: E402
from distill_guard.live.weights_fingerprint import take_fingerprint  # noqa: E402
from distill_guard.testing.standins import tiny_random_qwen3, zero_weights  # noqa: E402

from ..integrations._tiny import garble  # noqa: E402


def counted(teacher: torch.nn.Module) -> list[int]:
    """The teacher's forward calls (one per canary forward: nothing else runs it here)."""
    calls: list[int] = []
    teacher.register_forward_pre_hook(lambda *_: calls.append(1))
    return calls


def canary_of(teacher: torch.nn.Module, every: int = 16) -> ModuleCanary:
    # CPU is bit-exact: any change the forward sees is a finding
    return ModuleCanary(teacher, CanaryCheck(deterministic=True, module_every_steps=every))


def run(canary: ModuleCanary, steps: range) -> list[list[Code]]:
    return [[f.code for f in canary.check(s)] for s in steps]


def test_an_unchanged_teacher_is_checked_by_fingerprint_between_scheduled_forwards():
    teacher = tiny_random_qwen3()
    calls = counted(teacher)
    canary = canary_of(teacher, every=4)
    assert run(canary, range(12)) == [[]] * 12
    assert len(calls) == canary.forwards == 3  # steps 0, 4, 8
    assert canary.checked_by_fingerprint == 9 and canary.last_checked_by == "fingerprint"
    assert canary.canary.last_fingerprint.step == 8  # the reference moved with the forwards


def test_a_repeated_step_is_checked_once_by_forward():
    """Gradient accumulation: several checks in one step; the forward runs at the first only."""
    teacher = tiny_random_qwen3()
    calls = counted(teacher)
    canary = canary_of(teacher, every=2)
    for step in (0, 0, 0, 1, 1, 2):
        assert canary.check(step) == []
    assert len(calls) == 2  # steps 0 and 2


def test_every_step_is_the_old_behaviour_without_a_fingerprint(monkeypatch):
    def no_fingerprint(module):
        raise AssertionError("module_every_steps=1 takes no fingerprint")

    monkeypatch.setattr(module_canary_mod, "take_fingerprint", no_fingerprint)
    teacher = tiny_random_qwen3()
    calls = counted(teacher)
    canary = canary_of(teacher, every=1)
    assert run(canary, range(5)) == [[]] * 5
    assert len(calls) == 5 and canary.checked_by_fingerprint == 0


def noised(t: torch.nn.Module) -> None:
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in t.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)


def ema_towards_another(t: torch.nn.Module) -> None:
    """``p.data.mul_``: an in-place write through ``.data``, which bumps no version counter."""
    other = tiny_random_qwen3(seed=7)
    for p, q in zip(t.parameters(), other.parameters()):
        version = p._version
        p.data.mul_(0.9).add_(q.data, alpha=0.1)
        assert p._version == version


def partly_reloaded(t: torch.nn.Module) -> None:
    """Layer 1 reloaded from another checkpoint, the rest kept (a half-applied reload)."""
    other = tiny_random_qwen3(seed=7).state_dict()
    t.load_state_dict({k: v for k, v in other.items() if ".layers.1." in k}, strict=False)


def buffer_changed(t: torch.nn.Module) -> None:
    t.model.rotary_emb.inv_freq.mul_(3.0)


def values_swapped(t: torch.nn.Module) -> None:
    """Two same-shaped tensors' values exchanged in place: same objects, same data_ptrs."""
    a, b = (t.model.layers[i].mlp.down_proj.weight for i in (0, 1))
    with torch.no_grad():
        keep = a.clone()
        a.copy_(b)
        b.copy_(keep)


def parameters_swapped(t: torch.nn.Module) -> None:
    """The two Parameter objects exchanged between layers: the same values, other places."""
    m0, m1 = (t.model.layers[i].mlp.down_proj for i in (0, 1))
    m0.weight, m1.weight = m1.weight, m0.weight


FAULTS: dict[str, tuple[Callable[[torch.nn.Module], None], Code]] = {
    "zeroed": (zero_weights, Code.TEACHER_UNIFORM),
    "garbage": (garble, Code.TEACHER_FINGERPRINT_MISMATCH),
    "noised": (noised, Code.TEACHER_FINGERPRINT_MISMATCH),
    "EMA towards another model": (ema_towards_another, Code.TEACHER_FINGERPRINT_MISMATCH),
    "partly reloaded": (partly_reloaded, Code.TEACHER_FINGERPRINT_MISMATCH),
    "buffer changed": (buffer_changed, Code.TEACHER_FINGERPRINT_MISMATCH),
    "values swapped": (values_swapped, Code.TEACHER_FINGERPRINT_MISMATCH),
    "parameters swapped": (parameters_swapped, Code.TEACHER_FINGERPRINT_MISMATCH),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_a_changed_teacher_is_scored_and_caught_at_that_very_step(fault):
    poison, code = FAULTS[fault]
    teacher = tiny_random_qwen3()
    calls = counted(teacher)
    canary = canary_of(teacher, every=16)
    assert run(canary, range(5)) == [[]] * 5 and len(calls) == 1
    before = take_fingerprint(teacher)
    poison(teacher)
    assert take_fingerprint(teacher) != before
    assert run(canary, range(5, 7)) == [[code], [code]]  # found at 5; no clean one to skip on
    assert len(calls) == 3 and canary.checked_by_fingerprint == 4


def test_the_schedule_catches_what_the_fingerprint_cannot_see():
    """A tensor's signs flipped keep its norms bit for bit (a permutation keeps them up to
    rounding): seen at the next scheduled forward."""
    teacher = tiny_random_qwen3()
    canary = canary_of(teacher, every=4)
    assert run(canary, range(2)) == [[], []]
    before = take_fingerprint(teacher)
    w = teacher.model.layers[0].mlp.down_proj.weight
    with torch.no_grad():
        w.neg_()
    assert take_fingerprint(teacher) == before  # the blind spot, as documented
    mismatch = [Code.TEACHER_FINGERPRINT_MISMATCH]
    assert run(canary, range(2, 5)) == [[], [], mismatch]  # step 4: the scheduled forward


def test_a_fingerprint_that_cannot_be_taken_runs_the_forward(monkeypatch):
    teacher = tiny_random_qwen3()
    calls = counted(teacher)
    canary = canary_of(teacher)

    def broken(tensors):
        raise RuntimeError("no norms today")

    monkeypatch.setattr(weights_fingerprint, "_stats", broken)
    assert take_fingerprint(teacher) is None
    assert run(canary, range(4)) == [[]] * 4
    assert len(calls) == 4 and canary.checked_by_fingerprint == 0


def test_a_failed_forward_leaves_nothing_to_skip_against(monkeypatch):
    teacher = tiny_random_qwen3()
    calls = counted(teacher)
    canary = canary_of(teacher)
    real = canary.scorer.score

    def fails_once(*args, **kwargs):
        monkeypatch.setattr(canary.scorer, "score", real)
        raise module_canary_mod.TeacherError("the device is busy")

    monkeypatch.setattr(canary.scorer, "score", fails_once)
    assert run(canary, range(3)) == [[Code.TEACHER_UNREACHABLE], [], []]
    assert canary.forwards == 2 and len(calls) == 1  # the failed one, then step 1's


@pytest.mark.parametrize(
    "odd, why",
    [
        ("meta", "a meta buffer has no values"),
        ("nan", "a NaN norm hides later changes to its tensor"),
        ("subclass", "a Parameter subclass may keep its values elsewhere"),
        ("zero3", "a ZeRO-3 placeholder holds another rank's shard"),
    ],
)
def test_no_fingerprint_of_a_tensor_it_cannot_vouch_for(odd, why):
    teacher = tiny_random_qwen3()
    layer = teacher.model.layers[0].mlp.down_proj
    if odd == "meta":
        layer.register_buffer("ghost", torch.empty(3, device="meta"))
    elif odd == "nan":
        with torch.no_grad():
            layer.weight[0, 0] = float("nan")
    elif odd == "subclass":

        class Packed(torch.nn.Parameter):
            pass

        layer.weight = Packed(layer.weight.detach().clone())
    else:
        layer.weight.ds_id = 3
    assert take_fingerprint(teacher) is None, why


def test_integer_bool_and_complex_buffers_are_in_the_fingerprint():
    teacher = tiny_random_qwen3()
    teacher.register_buffer("ids", torch.arange(10))
    teacher.register_buffer("flags", torch.zeros(4, dtype=torch.bool))
    teacher.register_buffer("phases", torch.ones(3, dtype=torch.complex64))
    before = take_fingerprint(teacher)
    assert before is not None and take_fingerprint(teacher) == before
    for change in (
        lambda: teacher.ids[3].add_(1),
        lambda: teacher.flags[1].fill_(True),
        lambda: teacher.phases[0].add_(0.5j),
    ):
        change()
        assert take_fingerprint(teacher) != before
        before = take_fingerprint(teacher)


def test_the_forward_runs_after_load_state_dict_and_the_state_carries_the_reference():
    teacher = tiny_random_qwen3()
    calls = counted(teacher)
    saved = canary_of(teacher)
    assert run(saved, range(3)) == [[]] * 3 and len(calls) == 1
    state = saved.state_dict()
    saved.load_state_dict(state)  # the same canary, reloaded: scored again
    assert saved.check(3) == [] and len(calls) == 2
    assert saved.check(4) == [] and len(calls) == 2
    resumed = canary_of(teacher)  # a resumed run: its first check scores, against the saved
    resumed.load_state_dict(state)
    assert resumed.check(5) == [] and len(calls) == 3
    assert resumed.canary.last_comparison.max_abs_delta == 0.0
    assert resumed.check(6) == [] and len(calls) == 3
    garble(teacher)  # changed between the save and the resume: caught at the resumed first step
    again = canary_of(teacher)
    again.load_state_dict(state)
    assert [f.code for f in again.check(7)] == [Code.TEACHER_FINGERPRINT_MISMATCH]


def test_a_host_that_says_the_weights_changed_gets_a_forward():
    teacher = tiny_random_qwen3()
    calls = counted(teacher)
    canary = canary_of(teacher)
    assert run(canary, range(2)) == [[], []] and len(calls) == 1
    canary.weights_changed()
    assert canary.check(2) == [] and len(calls) == 2


def test_another_temperature_is_scored_again():
    teacher = tiny_random_qwen3()
    calls = counted(teacher)
    canary = canary_of(teacher)
    assert run(canary, range(2)) == [[], []]
    canary.scorer.temperature = 2.0
    assert [f.code for f in canary.check(2)] == [Code.TEACHER_FINGERPRINT_MISMATCH]
    assert len(calls) == 2


def test_the_schedule_is_a_config_field_of_at_least_one():
    with pytest.raises(GuardValueError, match="module_every_steps must be at least 1"):
        CanaryCheck(module_every_steps=0)
    assert CanaryCheck().module_every_steps == 16
    guard = build_guard("default", ["alerts.use_wandb=false", "checks.canary.module_every_steps=1"])
    teacher = tiny_random_qwen3()
    calls = counted(teacher)
    canary = guard.watch_module_teacher(teacher)
    assert canary.every_steps == 1
    for step in range(3):
        guard.on_teacher_scores(step)
    assert len(calls) == 3


def test_a_guarded_frozen_teacher_gets_the_forward_every_16_steps_by_default():
    guard = build_guard("default", ["alerts.use_wandb=false"])
    teacher = tiny_random_qwen3()
    calls = counted(teacher)
    guard.watch_module_teacher(teacher)
    for step in range(18):
        assert guard.on_teacher_scores(step).action.value == "continue"
    assert len(calls) == 2 and guard.module_canary.checked_by_fingerprint == 16
    zero_weights(teacher)
    assert guard.on_teacher_scores(18).action.value != "continue"
    assert len(calls) == 3 and guard.summary.first == {Code.TEACHER_UNIFORM: 18}
