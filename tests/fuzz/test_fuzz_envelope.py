"""Fuzz the message envelope: ``Message.from_dict``, ``decode`` of a body, and the
failed-record readers (``envelope_of``, ``FailedJob.from_body``) that must never raise.

Every input decodes or raises ``MessageDecodeError`` with one line (the job is failed
with it); nothing else escapes. Not fuzzed here: the envelope version ``"v"`` and
non-finite numbers (NaN, Infinity), whose checks are another change's.
"""

from __future__ import annotations

import json
from typing import Any

from fuzzing import fuzz, integers, json_values, one_line, outcome
from haze._base.errors import MessageDecodeError
from haze._base.message import FailedJob, Message, decode, envelope_of
from hypothesis import example, given
from hypothesis import strategies as st

FIELDS = (
    "id", "job", "payload", "queue", "ts", "connection", "attempts", "tenant", "chain",
    "chain_id", "chain_catch", "batch_id", "unique", "meta", "enc", "other",
)  # fmt: skip
META_KEYS = (
    "first_ts", "due", "track", "keep", "debounce", "group", "failed_attempt",
    "traceparent", "tracestate", "once", "schedule",
)  # fmt: skip
LINK_KEYS = ("job", "batch", "fn", "queue", "connection", "group", "delay", "payload")


def _object(keys: tuple[str, ...]) -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(st.sampled_from(keys), json_values | integers, max_size=4)


def _field(name: str) -> st.SearchStrategy[Any]:
    if name == "meta":
        return _object(META_KEYS) | json_values
    if name == "unique":
        return _object(("key", "until", "owner")) | json_values
    if name in ("chain", "chain_catch"):
        return st.lists(_object(LINK_KEYS) | json_values, max_size=3) | json_values
    return json_values | integers


@st.composite
def envelopes(draw: st.DrawFn) -> dict[str, Any]:
    """A valid plain envelope with some fields replaced by anything or removed."""
    d: dict[str, Any] = {"v": 1, "id": "m1", "job": "ping", "payload": None, "queue": "q"}
    for name in draw(st.lists(st.sampled_from(FIELDS), max_size=5)):
        if name in d and draw(st.booleans()):
            del d[name]
        else:
            d[name] = draw(_field(name))
    return d


def _refused_in_one_line(fn: Any, *args: Any) -> Message | None:
    message, error = outcome(MessageDecodeError, fn, *args)
    assert error is None or one_line(error), repr(error)
    return message  # type: ignore[no-any-return]


@fuzz(500)
@given(envelopes())
@example({"v": 1, "id": "m1", "job": "ping", "payload": None, "ts": 10**400})
@example({"v": 1, "id": "m1", "job": "p", "payload": 1, "chain": [{"job": "a", "delay": 10**400}]})
@example({"v": 1, "id": "m1", "job": "p", "payload": 1, "meta": {"track": -(10**400)}})
def test_an_envelope_decodes_or_is_refused_in_one_line(d: dict[str, Any]) -> None:
    message = _refused_in_one_line(Message.from_dict, d)
    if message is not None:
        assert message.id == d["id"] and message.job == d["job"]
        assert isinstance(message.ts, float) and isinstance(message.attempts, int)


@fuzz(300)
@given(json_values)
@example({"\n": None})
def test_any_json_value_is_a_message_or_refused(value: Any) -> None:
    _refused_in_one_line(Message.from_dict, value)


@st.composite
def bodies(draw: st.DrawFn) -> str | bytes:
    """Text, bytes, JSON of an envelope cut or spliced, and deeply nested JSON."""
    envelope = json.dumps(draw(envelopes()))
    kind = draw(st.integers(0, 4))
    if kind == 0:
        return draw(st.text(max_size=80))
    if kind == 1:
        return draw(st.binary(max_size=80))
    if kind == 2:
        cut = draw(st.integers(0, len(envelope)))
        return envelope[:cut] + draw(st.text(max_size=5)) + envelope[cut:]
    depth = draw(st.integers(1, 3000))
    open_, close = draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
    return '{"v":1,"id":"m1","job":"p","payload":' + open_ * depth + "1" + close * depth + "}"


@fuzz(200)
@given(bodies())
@example("[" * 100_000)
@example('{"v":1,"id":"m1","job":"p","payload":' + "[" * 5000 + "]" * 5000 + "}")
def test_a_body_decodes_or_is_refused_and_failed_readers_never_raise(body: str | bytes) -> None:
    _refused_in_one_line(decode, body)
    text = body if isinstance(body, str) else body.decode("utf-8", "replace")
    envelope_of(text)
    job = FailedJob.from_body(text, id=None, connection="c", queue="q", exception="E", failed_at=0)
    assert isinstance(job.name, str) and isinstance(job.id, str)
