"""Fuzz the redis driver's reader of a BullMQ job hash: the fields a claim, the job
lookup, the running list and the failed list read (``data``, ``atm``,
``attemptsMade``, ``stc``, ``name``, ``failedReason``, ``stacktrace``, ``finishedOn``),
as a hand edit, another BullMQ producer or a bug could leave them.

A claimed hash becomes a job to run, or a job to fail with a ``MessageDecodeError``
saying which field is wrong; a failed hash becomes a failed record. The hashes are
handed to the reader directly (no Redis round trip: the reader is what is fuzzed, and
every field value Redis can hold is a string).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from fuzzing import fuzz, json_values
from haze._base.errors import HazeError
from haze._base.message import Message, encode
from hypothesis import example, given
from hypothesis import strategies as st

pytest.importorskip("bullmq")
from haze.drivers.redis import RedisDriver

BODY = encode(Message(id="m1", job="ping", payload={"n": 1}, queue="q"))
#: Strings as Redis hands them back: counts, numbers, JSON, text.
values = (
    st.sampled_from(["", "0", "1", "-1", "01", "1.5", "1e3", "٣", " 2", "2 ", "9" * 30, BODY])
    | st.integers().map(str)
    | st.text(max_size=20)
    | json_values.map(json.dumps)
)


def driver() -> RedisDriver:
    # Not connected: the reader only parses what a round trip returned.
    return RedisDriver("fuzz", {"url": "redis://127.0.0.1:1/0"}, None)


@fuzz(400)
@given(st.dictionaries(st.sampled_from(["data", "atm", "attemptsMade", "stc"]), values))
def test_a_claimed_hash_is_a_job_to_run_or_to_fail(fields: dict[str, str]) -> None:
    job = driver()._reserved("q", fields, "7", "token")
    if job.message is None:
        assert isinstance(job.error, HazeError), repr(job.error)
    else:
        assert job.attempt >= 1 and job.error is None


@fuzz(300)
@given(st.lists(st.none() | values, min_size=5, max_size=5))
@example([None, BODY, "boom", None, "yesterday"])
@example([None, BODY, "boom", "[1, 2", "1.5e3"])
@example([None, BODY, "boom", "[" * 5000, "9" * 400])
def test_a_failed_hash_is_a_failed_record(row: list[Any]) -> None:
    failed = driver().failed._record("q", "7", row)
    assert isinstance(failed.id, str) and failed.id
    assert isinstance(failed.exception, str) and failed.failed_at >= 0
