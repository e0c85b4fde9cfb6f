"""Scenario 7 of the conformance suite (``test_conformance.py``): a teacher wrong from step 0.

Garbage, at temperature 2, or a copy of the student from its first use: each scores like a
teacher (peaked, finite), and its first fingerprint would be the fault's own, so only the
teacher's reference from its checkpoint (``teacher_reference``) can tell. With it, no update is
taken on any adapter, and the default policy halts. A file of its own so that pytest-xdist
(``--dist loadfile``) runs it beside the other scenarios.

The three faults differ only in the weights the canary scores (``tests/live/
test_teacher_reference.py`` holds each to the reference on its own); what an adapter adds is
the reference's check at step 0, before the first update, the same for each. So the in-process
adapters that cost little (plain, Lightning) run all three, and each costlier one (the HF
Trainers, Relax's harness) one, every fault on some HF Trainer; the rest are marked slow
(``make test-all`` runs every pair).
"""

from __future__ import annotations

import pytest

from distill_guard.testing.standins import at_temperature, become_student

from .._tiny import garble
from .conftest import ADAPTERS

WRONG_FROM_THE_START = {
    "garbage": garble,
    "temperature 2": at_temperature,
    "student": become_student,
}
"""Teachers wrong from their first use; each scores like a teacher (peaked, finite), so only the
checkpoint's reference can tell."""


IN_MAKE_TEST = {
    "plain": set(WRONG_FROM_THE_START),
    "lightning": set(WRONG_FROM_THE_START),
    "transformers": {"temperature 2"},
    "trl_gkd": {"student"},
    "trl_distillation": {"garbage"},
    "relax": {"garbage"},
}
"""The faults each adapter runs in ``make test``; the other pairs are marked slow."""


@pytest.mark.parametrize(
    ("driver", "wrong"),
    [
        pytest.param(
            adapter,
            wrong,
            id=f"{adapter}-{wrong}",
            marks=() if wrong in IN_MAKE_TEST[adapter] else pytest.mark.slow,
        )
        for adapter in ADAPTERS
        for wrong in WRONG_FROM_THE_START
    ],
    indirect=["driver"],
)
def test_a_teacher_wrong_from_step_0_is_caught_before_the_first_update(driver, wrong, tmp_path):
    r = driver.run(tmp_path, poison=WRONG_FROM_THE_START[wrong], at=0, reference=True)
    assert r.poisoned == [] and not any(r.moved.values()), r.story()
    caught = [f for f in r.findings if f["code"] == "teacher.reference_mismatch"]
    assert caught and caught[0]["step"] == 0 and caught[0]["severity"] == "critical", r.story()
    assert r.halt_step == driver.dead_steps - 1, r.story()
