"""The same scenarios on every adapter, judged by what the trainer consumed.

Modelled on Composer's callback test suite: one list of drivers (``adapters.py``), and every
scenario parametrized over all of them, so an adapter is conformant by passing the same tests as
the others, not tests of its own. The scenarios:

1. a healthy run is silent (no finding, no WARNING from ``distill_guard``, no Python warning
   about the guard) and every update is applied;
2. a teacher zeroed mid-run (uniform) takes no update, and the default policy halts;
3. a teacher turned to garbage mid-run (noise at each weight's own scale: not uniform, so only
   the canary's fingerprint tells) takes no update, and halts;
4. the halt leaves the checkpoint the adapter documents, and the event file says why; the
   checkpoint holds none of the dead teacher's weights, and its ``checkpoint`` record says what
   it holds of the teacher and why (docs/after-a-halt.md);
5. resumed from the halt as docs/after-a-halt.md says, on a fixed teacher, the run goes on to
   the end with no new finding (the guard's state without its halt; the teacher the resumed run
   built, never the checkpoint's);
6. loaded onto a teacher still dead (garbage: only a reference can tell), it takes no update:
   the state's canary reference catches it at the first resumed step;
7. a teacher wrong from step 0 takes no update when the guard has the teacher's reference from
   its checkpoint (``test_wrong_from_the_start.py``; scenario 1 runs with the reference too, so
   the reference itself is silent on a healthy teacher).

The zeroed run of each adapter is made once (module scope) and read by scenarios 2, 4, 5 and 6.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from .._tiny import VOCAB, garble, kill, loud
from .adapters import Outcome, zeroed_tensors


@pytest.fixture(scope="module")
def halted(driver, tmp_path_factory) -> Outcome:
    """The adapter's run whose teacher is zeroed at ``driver.at``: scenarios 2, 4, 5, 6 read it."""
    return driver.run(tmp_path_factory.mktemp(f"{driver.name}_zeroed"), poison=kill)


def test_a_healthy_run_is_silent_and_applies_every_update(driver, tmp_path, caplog, recwarn):
    caplog.set_level("INFO", logger="distill_guard")
    r = driver.run(tmp_path, reference=True)
    assert r.findings == [] and r.count == {}, r.story()
    assert [e for e in r.events if e["kind"] in ("alert", "halt")] == [], r.story()
    assert loud(caplog.records) == []
    # e.g. Lightning warns at every self.log(logger=True) made without a logger
    assert [str(w.message) for w in recwarn if "guard" in str(w.message)] == []
    assert r.moved == dict.fromkeys(range(driver.steps), True), r.story()
    assert r.poisoned == [] and r.skipped == 0 and r.halt_step is None
    assert r.saved == [] and r.host_steps == driver.steps
    assert r.vocab_size == VOCAB
    if r.losses is not None:  # the guard judged real divergences, far below the JSD ceiling
        assert len(r.losses) == driver.steps and 0.0 < max(r.losses) < 0.3 * math.log(2)


DEAD = {"zeroed": "teacher.uniform", "garbage": "teacher.fingerprint_mismatch"}
"""The finding that must catch each dead teacher at its first step."""


@pytest.mark.parametrize("teacher", list(DEAD))
def test_a_teacher_dead_mid_run_trains_nothing_and_halts(driver, halted, teacher, tmp_path):
    r = halted if teacher == "zeroed" else driver.run(tmp_path, poison=garble)
    at, halt = driver.at, driver.at + driver.dead_steps - 1
    assert r.poisoned == [], r.story()
    # the healthy steps trained, nothing after; every dead step the host went through was dropped
    assert [s for s, m in sorted(r.moved.items()) if m] == list(range(at)), r.story()
    assert r.skipped == len([s for s in r.moved if s >= at]), r.story()
    caught = [f for f in r.findings if f["code"] == DEAD[teacher]]
    assert caught and caught[0]["step"] == at and caught[0]["severity"] == "critical", r.story()
    assert min(f["step"] for f in r.findings) == at, r.story()  # nothing before the death
    if teacher == "garbage":  # statistically a teacher: only the canary's fingerprint tells
        assert set(r.count) == {DEAD[teacher]}, r.count
    # the default policy's halt, and the host stopped there
    assert r.halt_step == halt and max(r.moved) <= halt, r.story()
    assert r.host_steps == max(r.moved) + 1 < driver.steps, r.story()


def test_a_halt_leaves_its_checkpoint_and_its_reason(driver, halted):
    assert halted.saved == driver.checkpoint(halted), halted.saved
    assert all(p.exists() for p in halted.saved)
    assert halted.state is not None  # the guard's state, as the resume reads it
    assert halted.state["summary"]["halt"]["step"] == halted.halt_step
    assert halted.state["summary"]["count"].get(DEAD["zeroed"], 0) >= driver.dead_steps
    assert len(halted.halts) == driver.halt_records, halted.halts
    for h in halted.halts:
        assert h["step"] == halted.halt_step and DEAD["zeroed"] in h["message"], h
    records = [e for e in halted.events if e["kind"] == "checkpoint"]
    assert bool(records) is driver.records_checkpoint, records
    assert all(Path(e["path"]) in halted.saved for e in records if "path" in e), records


def test_a_halt_checkpoint_holds_none_of_the_dead_teachers_weights(driver, halted):
    """Every teacher tensor of the zeroed run is all zero: none may be in its checkpoint (a
    resume would load the dead teacher as the run's). The record says so, and why."""
    assert halted.saved and zeroed_tensors(halted.saved) == [], zeroed_tensors(halted.saved)
    for e in (e for e in halted.events if e["kind"] == "checkpoint"):
        teacher = e["teacher_left_out"]
        assert teacher["in_checkpoint"] is False and teacher["why"], e


def test_resume_from_the_halt_on_a_fixed_teacher_finds_nothing_new(driver, halted, tmp_path):
    r = driver.resume(tmp_path, halted)
    first = halted.host_steps if driver.resumes_where_halted else 0
    assert r.moved == dict.fromkeys(range(first, driver.steps), True), r.story()
    assert r.findings == [] and r.halts == [] and r.halt_step is None, r.story()
    assert r.saved == [] and r.poisoned == [] and r.host_steps == driver.steps
    # the counts came back with the state (the dropped updates too), and nothing was added
    assert r.count == halted.state["summary"]["count"]
    assert r.skipped == halted.skipped == len([s for s in halted.moved if s >= driver.at])
    lifted = [e for e in r.events if e["kind"] == "halt_lifted"]
    assert [e["step"] for e in lifted] == [halted.halt_step], lifted


def test_resume_onto_a_teacher_still_dead_is_caught_at_its_first_step(driver, halted, tmp_path):
    """The canary's reference comes back with the state, also where the adapter watches the
    teacher only once training starts (the HF mixin): a teacher still garbage after the resume
    is caught at its first step, before any update."""
    r = driver.resume(tmp_path, halted, poison=garble)
    first = halted.host_steps if driver.resumes_where_halted else 0
    assert r.poisoned == [] and not any(r.moved.values()), r.story()
    caught = [f for f in r.loud if f["code"] == DEAD["garbage"]]
    assert caught and caught[0]["step"] == first, r.story()
