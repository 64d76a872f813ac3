"""A job runs with the payload as it was at ``dispatch()``, on every driver: the message
is JSON-encoded when it is dispatched, so a caller that mutates its payload afterwards
cannot change the job (the memory driver keeps a plain message's payload as JSON and
copies it out at the claim instead of decoding the whole body again; these pin that the
shortcut changes nothing a job or a driver wrapper can see)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from haze import JobContext, PayloadError, Queue, define_job

SEEN: list[Any] = []


@pytest.fixture(autouse=True)
def _reset() -> None:
    SEEN.clear()


@define_job(name="pc_record")
async def pc_record(payload: dict[str, Any], job: JobContext) -> None:
    SEEN.append(payload)
    payload["touched_by_job"] = True  # the job's own copy: nothing else may see it


async def test_a_payload_mutated_after_dispatch_does_not_reach_the_job(app, done) -> None:
    payload: dict[str, Any] = {"n": 1, "items": [1, 2], "nested": {"k": "v"}}
    await pc_record.dispatch(payload)
    payload["n"] = 2
    payload["items"].append(3)
    payload["nested"]["k"] = "changed"
    payload["added"] = True
    await done()
    assert len(SEEN) == 1
    seen = SEEN[0]
    assert seen is not payload
    assert {k: v for k, v in seen.items() if k != "touched_by_job"} == {
        "n": 1,
        "items": [1, 2],
        "nested": {"k": "v"},
    }
    assert "touched_by_job" not in payload


async def test_two_dispatches_of_one_payload_get_copies_of_their_own(app, done) -> None:
    payload: dict[str, Any] = {"n": 1}
    await pc_record.dispatch(payload)
    payload["n"] = 2
    await pc_record.dispatch(payload)
    await done()
    assert sorted(p["n"] for p in SEEN) == [1, 2]
    assert SEEN[0] is not SEEN[1]


async def test_bulk_payloads_are_copied_at_dispatch(app, done) -> None:
    payloads: list[dict[str, Any]] = [{"n": i} for i in range(3)]
    await Queue.bulk([pc_record.with_(p) for p in payloads])
    for p in payloads:
        p["n"] = -1
    await done()
    assert sorted(p["n"] for p in SEEN) == [0, 1, 2]


async def test_a_body_changed_on_its_way_to_the_driver_is_what_runs(
    app, done, driver, monkeypatch
) -> None:
    # A wrapper around the driver's enqueue (instrumentation, a test double) that changes
    # the body: the body is what runs, not a copy kept from before the wrapper.
    if driver.inline:
        pytest.skip("the sync driver runs the job in dispatch(), with no body to change")
    d = app.driver("main")
    real = d.enqueue

    async def enqueue(body: str, message: Any, delay: float) -> Any:
        return await real(
            body.replace('"n":1', '"n":7').replace('"n": 1', '"n": 7'), message, delay
        )

    monkeypatch.setattr(d, "enqueue", enqueue)
    await pc_record.dispatch({"n": 1})
    await done()
    assert [p["n"] for p in SEEN] == [7]


#: Payloads whose JSON round trip changes a type or takes haze's JSON path; each pair is
#: (payload, what the job must see).
ROUND_TRIPS: list[tuple[Any, Any]] = [
    ({"t": (1, 2.5, None, True), "n": [[-0.0, 1e300, 'a\n\x01"']]}, None),
    ({"big": 2**60, "neg": -(2**53) - 1}, None),
    ({"é": "naïve ✓ \U0001f600"}, None),
    ({1: "int key", "k": {2: [3]}}, {"1": "int key", "k": {"2": [3]}}),
    ({"deep": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}, None),
]


@pytest.mark.parametrize(("sent", "expected"), ROUND_TRIPS)
async def test_the_job_sees_what_a_json_round_trip_gives(app, done, driver, sent, expected) -> None:
    if driver.id == "cloudflare" and "big" in sent:
        # a JavaScript number cannot carry it, and a JSON queue message no BigInt
        with pytest.raises(ValueError, match="past the integers JavaScript carries"):
            await pc_record.dispatch(sent)
        return
    await pc_record.dispatch(sent)
    await done()
    assert len(SEEN) == 1
    seen = {k: v for k, v in SEEN[0].items() if k != "touched_by_job"}
    want = expected if expected is not None else json.loads(json.dumps(sent))
    if driver.id == "cloudflare":
        # the message crosses into JavaScript, whose JSON writes -0 as 0: what a
        # Cloudflare queue delivers, not haze's choice
        want = json.loads(json.dumps(want).replace("-0.0", "0"))
    assert seen == want
    assert repr(seen) == repr(want)  # the same types too: lists for tuples, -0.0 kept


@pytest.mark.parametrize(
    "bad", [{"x": float("nan")}, {"x": float("inf")}, {"x": object()}, {"x": "\ud800"}]
)
async def test_a_value_json_cannot_carry_is_refused_at_dispatch(app, done, bad) -> None:
    with pytest.raises((TypeError, ValueError)):
        await pc_record.dispatch(bad)
    await done()
    assert SEEN == []
    assert await app.driver("main").size("default") == 0


ATTEMPTS: list[dict[str, Any]] = []


@define_job(name="pc_mutate_then_fail", tries=2, backoff=0)
async def pc_mutate_then_fail(payload: dict[str, Any], job: JobContext) -> None:
    ATTEMPTS.append(copy.deepcopy(payload))
    payload["items"].append("changed by the job")
    raise ValueError("declined")


@pytest.mark.requires("retries", "failed_store")
async def test_every_attempt_sees_the_payload_as_dispatched(app, done) -> None:
    ATTEMPTS.clear()
    sent = {"items": [1, (2, 3)], "s": "x"}
    sent_id = await pc_mutate_then_fail.dispatch(sent)
    await done()
    assert ATTEMPTS == [{"items": [1, [2, 3]], "s": "x"}] * 2
    assert [f.id for f in await Queue.failed()] == [sent_id]
    assert sent == {"items": [1, (2, 3)], "s": "x"}


@pytest.mark.requires("retries", "failed_store")
async def test_the_failed_record_keeps_the_payload_as_dispatched(app, done) -> None:
    """A job that changes its payload and then fails for good: its failed record (and so
    ``Queue.retry``) holds what was dispatched, not what the job made of it."""
    ATTEMPTS.clear()
    sent_id = await pc_mutate_then_fail.dispatch({"items": [1], "s": "x"})
    await done()
    (record,) = await Queue.failed()
    assert record.id == sent_id
    assert record.payload == {"items": [1], "s": "x"}
    assert await Queue.retry(sent_id) == [sent_id]
    await done()
    assert ATTEMPTS == [{"items": [1], "s": "x"}] * 4


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("depth", [1_000, 201])
async def test_a_payload_nested_too_deeply_is_refused_at_dispatch(app, done, depth) -> None:
    # {"deep": [...]}: the dict is one level, so 201 lists make 202, past the limit of 200
    with pytest.raises(PayloadError) as info:
        await pc_record.dispatch({"deep": _nested(depth)})
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith('job "pc_record": payload is nested more than 200 levels deep')
    assert isinstance(info.value, TypeError)  # what a payload JSON cannot carry raises
    with pytest.raises(PayloadError, match='job "pc_record": payload'):
        await Queue.bulk([pc_record.with_({"deep": _nested(depth)})])
    await done()
    assert SEEN == []
    assert await app.driver("main").size("default") == 0


async def test_a_payload_at_the_depth_limit_runs(app, done) -> None:
    await pc_record.dispatch({"deep": _nested(199)})
    await done()
    assert len(SEEN) == 1


@pytest.mark.requires("queued", "failed_store")
async def test_a_queued_message_nested_too_deeply_fails_once_with_the_reason(
    app, done, monkeypatch
) -> None:
    """A producer that is not haze (or an older one) queued a body nested deeper than a
    worker reads: the job fails with the reason and is kept, never run, never retried
    in a loop."""
    ATTEMPTS.clear()
    drv = app.driver("main")
    real = drv.enqueue

    async def forge(body: str, message: Any, delay: float) -> Any:
        data = json.loads(body)
        data["payload"] = None
        deep = "[" * 5_000 + "]" * 5_000
        text = json.dumps(data).replace('"payload": null', f'"payload": {deep}')
        return await real(text, message, delay)

    monkeypatch.setattr(drv, "enqueue", forge)
    refused = ""
    try:
        await pc_mutate_then_fail.dispatch({"items": [], "s": "x"})
    except TypeError as e:
        refused = str(e)
    if refused:
        # A driver that sends the body as a JSON value (a Cloudflare queue) reads it
        # first: it refuses one too deep to read, and nothing is queued.
        assert "a haze message body is a JSON object" in refused
        assert await drv.size("default") == 0
        pytest.skip("this driver sends a body as a JSON value: one too deep is refused when sent")
    await done()
    assert ATTEMPTS == []
    [failed] = await Queue.failed()  # its id unread: the record has one of its own
    assert "MessageDecodeError" in failed.exception
    assert "nested too deeply" in failed.exception
    assert await drv.size("default") == 0
