"""Sleep-state tracking: the guard refuses what would kill or confuse an SGLang teacher."""

from __future__ import annotations

import pytest

from distill_guard.teachers.base import (
    ALL_TAGS,
    SleepState,
    TeacherStateError,
    check_score_args,
    normalize_tags,
)


def test_second_release_of_a_tag_is_refused_with_the_reason() -> None:
    s = SleepState()
    s.mark_released(s.check_release(["weights"]))
    with pytest.raises(TeacherStateError, match="kills SGLang's scheduler"):
        s.check_release(["weights", "kv_cache"])
    s.mark_released(s.check_release(["kv_cache"]))  # another tag is fine
    assert s.released == {"weights", "kv_cache"}


def test_scoring_while_asleep_and_resuming_awake_are_refused() -> None:
    s = SleepState()
    s.check_score()
    with pytest.raises(TeacherStateError, match="not released"):
        s.check_resume(None)
    s.mark_released(s.check_release(None))
    assert s.released == set(ALL_TAGS)
    with pytest.raises(TeacherStateError, match="asleep"):
        s.check_score()
    s.mark_resumed(s.check_resume(["weights"]))
    assert s.released == {"kv_cache", "cuda_graph"}
    with pytest.raises(TeacherStateError, match=r"refusing to resume \['weights'\]"):
        s.check_resume(["weights", "cuda_graph"])  # weights is awake again
    assert s.released == {"kv_cache", "cuda_graph"}  # a refused resume changes nothing


def test_resume_none_wakes_exactly_what_is_released() -> None:
    s = SleepState()
    s.mark_released(s.check_release(["kv_cache"]))
    assert s.check_resume(None) == ("kv_cache",)
    s.mark_resumed(None)
    assert not s.asleep


def test_old_servers_act_on_all_tags() -> None:
    s = SleepState(tags_supported=False)
    s.mark_released(s.check_release(["kv_cache"]))
    assert s.released == set(ALL_TAGS)
    with pytest.raises(TeacherStateError):
        s.check_release(["weights"])


def test_tags_are_validated() -> None:
    assert normalize_tags([]) == ALL_TAGS
    assert normalize_tags(["weights", "weights"]) == ("weights",)
    with pytest.raises(ValueError, match="unknown memory tags"):
        normalize_tags(["weight"])
    with pytest.raises(TypeError):
        normalize_tags("weights")


@pytest.mark.parametrize(
    ("seqs", "top_k", "start", "match"),
    [([[1, 2]], -1, 0, "top_k"), ([[1, 2]], 0, 2, "leaves nothing"), ([], 0, 0, "at least one"),
     ([[]], 0, 0, "empty")],
)  # fmt: skip
def test_score_arguments_are_checked(seqs, top_k, start, match) -> None:
    with pytest.raises(ValueError, match=match):
        check_score_args(seqs, top_k, start)
