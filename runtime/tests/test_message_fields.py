"""``Message.from_dict`` checks every field's type and names the bad one."""

from __future__ import annotations

from typing import Any

import pytest
from haze._base.errors import MessageDecodeError
from haze._base.message import Message, decode, encode, new_id


def _body(**fields: Any) -> dict[str, Any]:
    return {"v": 1, "id": "m1", "job": "ping", "payload": {"n": 1}, **fields}


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"v": "1"}, "v"),
        ({"id": 5}, "id"),
        ({"id": ""}, "id"),
        ({"job": 7}, "job"),
        ({"queue": 12}, "queue"),
        ({"queue": "q" * 256}, "queue"),
        ({"connection": 3}, "connection"),
        ({"ts": "now"}, "ts"),
        ({"attempts": "2"}, "attempts"),
        ({"attempts": -1}, "attempts"),
        ({"attempts": True}, "attempts"),
        ({"tenant": ["acme"]}, "tenant"),
        ({"chain": "zzz"}, "chain"),
        ({"chain": [5]}, "chain[0]"),
        ({"chain": [{"job": "a"}, {"job": 1}]}, "chain[1].job"),
        ({"chain": [{"job": "a", "delay": "soon"}]}, "chain[0].delay"),
        ({"chain": [{"job": "a", "queue": ""}]}, "chain[0].queue"),
        ({"chain": [{"nothing": 1}]}, "chain[0]"),
        ({"chain": [{"tail": "t1", "chunk": 1, "of": 3}]}, "chain[0].links"),
        ({"chain": [{"tail": "t1", "chunk": "1", "of": 3, "links": 9}]}, "chain[0].chunk"),
        ({"chain": [{"tail": "t1", "chunk": 1, "of": -3, "links": 9}]}, "chain[0].of"),
        ({"chain_catch": [{"tail": "t1", "chunk": 1, "of": 3, "links": 9}]}, "chain_catch[0]"),
        ({"chain_id": 1}, "chain_id"),
        ({"chain_catch": {"job": "a"}}, "chain_catch"),
        ({"chain_catch": [{"fn": 3}]}, "chain_catch[0]"),
        ({"batch_id": 2.5}, "batch_id"),
        ({"unique": "zzz"}, "unique"),
        ({"unique": {"until": "processed"}}, "unique.key"),
        ({"meta": 5}, "meta"),
        ({"meta": {"first_ts": "x"}}, "meta.first_ts"),
        ({"meta": {"debounce": 4}}, "meta.debounce"),
        ({"meta": {"traceparent": 4}}, "meta.traceparent"),
        ({"meta": {"tracestate": "x" * 600}}, "meta.tracestate"),
        ({"meta": {"failed_attempt": 0}}, "meta.failed_attempt"),
        ({"meta": {"failed_attempt": "3"}}, "meta.failed_attempt"),
        ({"meta": {"failed_attempt": True}}, "meta.failed_attempt"),
        ({"enc": 9}, "enc"),
    ],
)
def test_a_wrong_typed_field_is_a_decode_error_naming_it(
    fields: dict[str, Any], named: str
) -> None:
    with pytest.raises(MessageDecodeError) as e:
        Message.from_dict(_body(**fields))
    assert f'field "{named}"' in str(e.value)


def test_every_field_haze_writes_decodes_back() -> None:
    m = Message(
        id=new_id(),
        job="ping",
        payload={"n": 1},
        queue="emails",
        connection="main",
        ts=1.5,
        attempts=2,
        tenant="acme",
        chain=[
            {"job": "a", "queue": "q", "delay": 5.0},
            {"batch": {"jobs": []}},
            {"tail": "t1", "chunk": 1, "of": 3, "links": 9},
        ],
        chain_id="c1",
        chain_catch=[{"job": "cleanup"}, {"fn": "f1"}],
        batch_id="b1",
        unique={"key": "haze:unique:ping:1", "until": "processed"},
        meta={"first_ts": 1.0, "debounce": "k", "group": "g", "failed_attempt": 3},
    )
    assert decode(encode(m)) == m
    assert Message.from_dict(_body(queue=None, ts=None)).queue == "default"


@pytest.mark.parametrize("version", [2, 0, 99, True])
def test_an_envelope_version_this_haze_cannot_read_is_refused_naming_it(version: Any) -> None:
    with pytest.raises(MessageDecodeError) as e:
        Message.from_dict(_body(v=version))
    assert 'field "v"' in str(e.value) and repr(version) in str(e.value)
    assert "upgrade" in str(e.value) or "an integer" in str(e.value)
    # the fast path of a plain envelope refuses it too
    import json

    with pytest.raises(MessageDecodeError, match='field "v"'):
        decode(json.dumps({"v": version, "id": "m1", "job": "ping", "payload": 1}))


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('{"v":1,"id":"m1","job":"ping","payload":{"amount":NaN}}', "payload.amount"),
        ('{"v":1,"id":"m1","job":"ping","payload":[1,Infinity]}', "payload[1]"),
        ('{"v":1,"id":"m1","job":"ping","payload":-Infinity}', "payload"),
        ('{"v":1,"id":"m1","job":"ping","payload":1,"ts":NaN}', "ts"),
    ],
)
def test_nan_and_infinity_tokens_are_refused_naming_the_field(text: str, named: str) -> None:
    with pytest.raises(MessageDecodeError) as e:
        decode(text)
    assert f'field "{named}"' in str(e.value) and "not JSON" in str(e.value)
    with pytest.raises(MessageDecodeError) as from_bytes:
        decode(text.encode())
    assert str(from_bytes.value) == str(e.value)


def test_a_body_nested_past_what_a_worker_reads_is_refused_before_it_is_parsed() -> None:
    """Parsing deeper JSON recurses: CPython raises RecursionError near 1,000 levels,
    but Pyodide (a Cloudflare Worker) overflows the JavaScript stack much sooner and
    aborts the isolate. So the depth is read from the text first (no recursion)."""
    from haze._base.errors import MessageDecodeError
    from haze._base.message import decode

    deep = "[" * 300 + "]" * 300
    body = '{"id": "m1", "job": "j", "queue": "default", "payload": ' + deep + "}"
    with pytest.raises(MessageDecodeError, match="nested too deeply"):
        decode(body)
    with pytest.raises(MessageDecodeError, match="nested too deeply"):
        decode(body.encode())
    ok = '{"id": "m1", "job": "j", "queue": "default", "payload": ' + "[" * 199 + "]" * 199 + "}"
    assert decode(ok).payload is not None


def test_a_failed_record_nested_too_deeply_is_read_as_not_json_without_parsing() -> None:
    from haze._base.message import envelope_of

    assert envelope_of('{"payload": ' + "[" * 300 + "]" * 300 + "}") is None
    assert envelope_of(b'{"payload": ' + b"[" * 300 + b"]" * 300 + b"}") is None
    assert envelope_of('{"payload": ' + "[" * 150 + "]" * 150 + "}") is not None


@pytest.mark.parametrize(
    "text",
    [
        "[" * 201 + "]" * 201,
        "[" * 200 + "]" * 200,
        '["' + "[" * 300 + '"]',  # brackets inside a string do not nest
        '["\\"' + "{" * 300 + '"]',  # nor after an escaped quote
        '{"é": "ü' + "[" * 300 + '", "x": ' + "[" * 199 + "]" * 199 + "}",
        '{"é": "ü", "x": ' + "[" * 250 + "]" * 250 + "}",
        '["\\\\"' + ", [" * 250 + "]" * 250 + "]",  # an escaped backslash ends no string
    ],
)
def test_the_depth_of_a_bytes_body_is_read_as_its_text_s(text: str) -> None:
    """A bytes body is scanned without decoding it: UTF-8 keeps every byte of a
    non-ASCII character above 0x7F, so its brackets and quotes are the text's own."""
    from haze._base.json_text import too_deep

    assert too_deep(text.encode()) == too_deep(text)
    assert too_deep(text.encode("utf-8") + b"\xff") == too_deep(text)  # not UTF-8: still read
