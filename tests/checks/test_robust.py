"""The shared robust statistics: a warm-up spike moves no reference, one value no median."""

from __future__ import annotations

import math

import pytest

from distill_guard.checks.robust import Episode, Reference, RollingMedian


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
