"""The shared robust statistics: a warm-up spike moves no reference, one value no median; the
anchor is the first value; a follow-up judges what came after an open incident."""

from __future__ import annotations

import json
import math

import pytest

from distill_guard.checks.robust import Episode, FollowUp, Reference, RollingMedian


def test_reference_ignores_a_spike_in_the_warm_up():
    ref = Reference(5)
    for x in (1.0, 1.1, 1e9, 0.9, 1.0):
        ref.add(x)
    assert ref.median == 1.0 and ref.sigma == pytest.approx(1.4826 * 0.1)
    ref.add(50.0)  # frozen
    assert ref.median == 1.0


def test_reference_sigma_has_its_floors():
    ref = Reference(3, min_sigma_rel=0.05, min_sigma_abs=0.01)
    for _ in range(3):
        ref.add(2.0)
    assert ref.sigma == pytest.approx(0.1)


def test_rolling_median_waits_for_a_full_window_and_skips_nonfinite():
    m = RollingMedian(3)
    assert m.add(1.0) is None and m.add(math.nan) is None and m.add(100.0) is None
    assert m.add(2.0) == 2.0
    state = m.state_dict()
    n = RollingMedian(3)
    n.load_state_dict(state)
    assert n.value == 2.0
    with pytest.raises(ValueError, match="window"):
        RollingMedian(0)


def test_episode_starts_once():
    e = Episode()
    assert [e.update(x) for x in (False, True, True, False, True)] == [
        False,
        True,
        False,
        False,
        True,
    ]


def test_the_anchor_is_the_first_finite_value_and_nothing_moves_it():
    ref = Reference(3)
    ref.add(math.nan)
    assert ref.anchor is None and not ref._pending  # a NaN is no value, nor the anchor
    for x in (0.42, 0.9, 1.5, 2.0, 3.0):
        ref.add(x)
    assert ref.anchor == 0.42  # the student before any update, not the warm-up's 0.9
    assert ref.median == 0.9


def test_floor_sigma_is_the_floors_at_a_level():
    ref = Reference(50, min_sigma_rel=0.05, min_sigma_abs=0.01)
    assert ref.floor_sigma(0.42) == pytest.approx(0.021)
    assert ref.floor_sigma(0.1) == pytest.approx(0.01)


@pytest.mark.parametrize("n", [1, 2, 5])
def test_the_anchor_survives_a_resume(n):
    ref = Reference(3)
    for x in (0.42, 0.5, 0.6, 0.7, 0.8)[:n]:
        ref.add(x)
    state = json.loads(json.dumps(ref.state_dict()))
    fresh = Reference(3)
    fresh.load_state_dict(state)
    assert fresh.anchor == 0.42 and fresh.state_dict() == ref.state_dict()
    fresh.add(9.0)
    assert fresh.anchor == 0.42


def test_an_old_state_without_an_anchor_loads():
    pending = Reference(3)
    pending.load_state_dict({"median": None, "sigma": None, "pending": [0.4, 0.5]})
    assert pending.anchor == 0.4  # its first value
    frozen = Reference(3)
    frozen.load_state_dict({"median": 0.5, "sigma": 0.1, "pending": []})
    assert frozen.anchor == 0.5  # the warm-up median stands in
    fresh = Reference(3)
    fresh.load_state_dict({})
    assert fresh.anchor is None and fresh.state_dict() == Reference(3).state_dict()


def feed_follow(follow, values, incident_from=None, incident=0):
    return [
        follow.add(t, v, incident if incident_from is not None and t >= incident_from else None)
        for t, v in enumerate(values)
    ]


def test_follow_up_is_nothing_without_an_open_incident():
    follow = FollowUp(3)
    assert feed_follow(follow, [0.4, 0.9, 1.5, 2.0, 3.0]) == [None] * 5
    assert follow.baseline is None and follow.incident is None


def test_follow_up_judges_the_values_after_the_incident_against_those_before():
    follow = FollowUp(3)
    out = feed_follow(follow, [0.42, 0.5, 0.6, 0.7, 0.8], incident_from=1, incident=0)
    assert follow.baseline == 0.42  # step 0: the student before any update
    assert out == [None, None, None, 0.6, 0.7]  # medians of steps 1-3 and 2-4
    mid = FollowUp(3)
    feed_follow(mid, [1.0, 2.0, 1.1, 1.2, 1.3, 5.0], incident_from=5, incident=4)
    assert mid.baseline == 1.2  # the median of the last three at steps <= 4


def test_follow_up_starts_over_for_a_new_incident_and_after_a_close():
    follow = FollowUp(1)
    assert follow.add(0, 0.4, 0) is None and follow.add(1, 0.5, 0) == 0.5
    follow.said = True
    assert follow.add(2, 0.6, None) is None and not follow.said and follow.baseline is None
    assert follow.add(3, 0.7, 2) == 0.7 and follow.baseline == 0.6


def test_follow_up_falls_back_when_nothing_before_the_incident_was_kept():
    follow = FollowUp(3, keep=4)
    for t in range(10):
        follow.add(t, 1.0 + t, None)
    assert follow.add(10, 20.0, 2, fallback=0.5) == 10.0  # the kept values since: 9, 10, 20
    assert follow.baseline == 0.5
    other = FollowUp(3, keep=4)
    for t in range(10):
        other.add(t, 1.0 + t, None)
    other.add(10, 20.0, 2)
    assert other.baseline == 1.0  # its first value


def test_follow_up_state_round_trips():
    follow = FollowUp(3)
    feed_follow(follow, [0.42, 0.5, 0.6, 0.7], incident_from=1, incident=0)
    state = json.loads(json.dumps(follow.state_dict()))
    fresh = FollowUp(3)
    fresh.load_state_dict(state)
    assert fresh.state_dict() == follow.state_dict()
    assert fresh.add(4, 0.8, 0) == follow.add(4, 0.8, 0) == 0.7
