"""Short ids: 4 hex digits of the process prefix and 4 of the counter, so jobs of one
process and jobs of different processes both stay apart; matching is exact or unique."""

from __future__ import annotations

import pytest
from haze import AmbiguousIdError
from haze._base.ids import match_id, short_id
from haze._base.message import new_id


def test_short_ids_of_one_process_differ() -> None:
    ids = [new_id() for _ in range(1000)]
    assert len({short_id(i) for i in ids}) == 1000
    assert all(len(short_id(i)) == 8 for i in ids)


def test_short_ids_keep_prefix_and_counter_bits() -> None:
    assert short_id("a1b2c3d4e5f6a7b8000000000000002a") == "a1b2002a"
    # two processes' first jobs: same counter, different prefixes
    assert short_id("1111" + "0" * 28) != short_id("2222" + "0" * 28)


def test_foreign_ids_are_shown_whole_or_by_their_end() -> None:
    assert short_id("bullmq:default:7") == "bullmq:default:7"
    assert short_id("3f2c1a52-94a1-4a34-8f0e-7c2b3b6e9d10") == "7c2b3b6e9d10"[-8:]


def test_match_id() -> None:
    a, b = "a1b2c3d4e5f6a7b8000000000000002a", "ffff00000000000000000000000000aa"
    assert match_id(a, [a, b]) == a
    assert match_id("a1b2002a", [a, b]) == a
    assert match_id("a1b2c3", [a, b]) == a  # a beginning
    assert match_id("00aa", [a, b]) == b  # an end
    assert match_id("abc", [a, b]) is None  # too short to be a beginning or an end
    assert match_id("deadbeef", [a, b]) is None
    twins = ["abcd" + "1" * 24 + "0001", "abcd" + "2" * 24 + "0001"]
    with pytest.raises(AmbiguousIdError, match="matches 2 jobs") as info:
        match_id("abcd0001", twins)
    assert info.value.matches == twins
