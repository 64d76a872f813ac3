"""Dispatching: ids, pending dispatches, the Queue facade, payload rules."""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass
from typing import Any

import pytest
from haze import (
    App,
    DispatchResult,
    JobContext,
    PayloadError,
    Queue,
    UnknownJobError,
    define_job,
)
from pydantic import BaseModel

runs: list[dict[str, Any]] = []


@define_job(name="dispatch_record", queue="emails")
async def dispatch_record(payload: Any, job: JobContext) -> None:
    runs.append(
        {
            "payload": payload,
            "queue": job.queue,
            "connection": job.connection,
            "id": job.id,
            "at": time.monotonic(),
        }
    )


@define_job(name="dispatch_no_payload")
async def dispatch_no_payload() -> None:
    runs.append({"no_payload": True})


@define_job(name="dispatch_no_payload_ctx")
async def dispatch_no_payload_ctx(payload: None, job: JobContext) -> None:
    runs.append({"payload": payload, "queue": job.queue})


@dataclass
class Invoice:
    invoice_id: int
    lines: list[str]


class Customer(BaseModel):
    customer_id: int
    email: str


@define_job(name="dispatch_dataclass")
async def dispatch_dataclass(payload: Invoice, job: JobContext) -> None:
    runs.append({"payload": payload})


@define_job(name="dispatch_pydantic")
def dispatch_pydantic(payload: Customer) -> None:
    runs.append({"payload": payload})


@pytest.fixture(autouse=True)
def _clear() -> None:
    runs.clear()


ID = re.compile(r"^[0-9a-f]{32}$")


async def test_dispatch_returns_the_job_id(app: App) -> None:
    job_id = await dispatch_record.dispatch({"invoice_id": 42})
    assert isinstance(job_id, str)
    assert ID.match(job_id)
    await Queue.idle()
    assert runs[0]["id"] == job_id
    assert runs[0]["payload"] == {"invoice_id": 42}
    assert runs[0]["queue"] == "emails"  # define_job's queue
    assert runs[0]["connection"] == "memory"  # the config default


async def test_dispatch_options_queue_connection_delay(app: App) -> None:
    await dispatch_record.dispatch({"n": 1}, queue="high", connection="sync")
    assert runs[-1]["queue"] == "high"
    assert runs[-1]["connection"] == "sync"
    start = time.monotonic()
    await dispatch_record.dispatch({"n": 2}, delay="50ms")
    assert len(runs) == 1
    await Queue.idle()
    assert runs[-1]["payload"] == {"n": 2}
    assert runs[-1]["at"] - start >= 0.045


async def test_pending_dispatch_returns_a_dispatch_result(app: App) -> None:
    start = time.monotonic()
    res = await dispatch_record.with_({"invoice_id": 42}).on_queue("high").delay("50ms").dispatch()
    assert isinstance(res, DispatchResult)
    assert ID.match(res.id)
    assert (res.skipped, res.deferred, res.chain_id) == (False, False, None)
    assert await Queue.size("high") == 1
    await Queue.idle()
    assert runs == [
        {
            "payload": {"invoice_id": 42},
            "queue": "high",
            "connection": "memory",
            "id": res.id,
            "at": runs[0]["at"],
        }
    ]
    assert runs[0]["at"] - start >= 0.045


async def test_queue_dispatch_by_job_and_by_name(app: App) -> None:
    a = await Queue.dispatch(dispatch_record, {"by": "job"}, delay=0)
    b = await Queue.dispatch("dispatch_record", {"by": "name"}, queue="other")
    assert a != b
    await Queue.idle()
    assert {r["payload"]["by"]: r["queue"] for r in runs} == {"job": "emails", "name": "other"}


async def test_queue_dispatch_unknown_name_raises(app: App) -> None:
    with pytest.raises(UnknownJobError, match="no job named 'dispatch_nobody'"):
        await Queue.dispatch("dispatch_nobody", {})
    with pytest.raises(TypeError):
        await Queue.dispatch(42, {})  # type: ignore[arg-type]
    assert await Queue.size() == 0


async def test_jobs_without_payload(app: App) -> None:
    await dispatch_no_payload.dispatch()
    await dispatch_no_payload.dispatch(None, delay="10ms")
    res = await dispatch_no_payload_ctx.with_().on_queue("low").dispatch()
    assert isinstance(res, DispatchResult)
    await Queue.dispatch(dispatch_no_payload)
    await Queue.idle()
    assert runs.count({"no_payload": True}) == 3
    assert {"payload": None, "queue": "low"} in runs


@pytest.mark.parametrize(
    ("payload", "path"),
    [
        ({"a": [1, object()]}, "payload['a'][1]"),
        ({"a": {"b": {1, 2}}}, "payload['a']['b']"),
        ({"when": float("nan")}, "payload['when']"),
        ([1, 2, b"bytes"], "payload[2]"),
    ],
)
async def test_non_json_payload_raises_type_error_naming_the_path(
    app: App, payload: Any, path: str
) -> None:
    with pytest.raises(PayloadError) as info:
        await dispatch_record.dispatch(payload)
    assert isinstance(info.value, TypeError)
    assert str(info.value).startswith(f'job "dispatch_record": {path} ')
    with pytest.raises(PayloadError, match="dispatch_record"):
        await dispatch_record.with_(payload).on_queue("high").dispatch()
    with pytest.raises(PayloadError, match="dispatch_record"):
        await dispatch_record.dispatch(payload, connection="sync")
    # nothing was enqueued (or run)
    assert await Queue.size("emails") == 0
    assert await Queue.size("high") == 0
    await Queue.idle()
    assert runs == []


async def test_non_json_payload_records_nothing_in_the_fake(app: App) -> None:
    fake = Queue.fake()
    try:
        with pytest.raises(TypeError, match=r"payload\['a'\]\[1\]"):
            await dispatch_record.dispatch({"a": [1, object()]})
        fake.assert_nothing_dispatched()
    finally:
        Queue.restore()


async def test_self_referencing_payload_is_a_type_error(app: App) -> None:
    loop: dict[str, Any] = {}
    loop["self"] = loop
    with pytest.raises((TypeError, ValueError)):
        await dispatch_record.dispatch(loop)
    assert await Queue.size("emails") == 0


async def test_dataclass_payload_travels_as_json_and_is_rebuilt(app: App) -> None:
    fake = Queue.fake()
    await dispatch_dataclass.dispatch(Invoice(42, ["a", "b"]))
    assert fake.dispatched[0].message.payload == {"invoice_id": 42, "lines": ["a", "b"]}
    Queue.restore()
    await dispatch_dataclass.dispatch(Invoice(42, ["a", "b"]))
    await dispatch_dataclass.dispatch({"invoice_id": 7, "lines": []})  # type: ignore[arg-type]
    await Queue.idle()
    assert [r["payload"] for r in runs] == [Invoice(42, ["a", "b"]), Invoice(7, [])]
    assert all(type(r["payload"]) is Invoice for r in runs)


async def test_pydantic_payload_travels_as_json_and_is_rebuilt(app: App) -> None:
    await dispatch_pydantic.dispatch(Customer(customer_id=1, email="a@example.com"))
    await dispatch_pydantic.dispatch(
        Customer(customer_id=2, email="b@example.com"), connection="sync"
    )
    await Queue.idle()
    payloads = sorted((r["payload"] for r in runs), key=lambda c: c.customer_id)
    assert payloads == [
        Customer(customer_id=1, email="a@example.com"),
        Customer(customer_id=2, email="b@example.com"),
    ]
    assert all(isinstance(p, Customer) for p in payloads)


async def test_bulk_returns_ids_in_order(app: App) -> None:
    ids = await Queue.bulk([dispatch_record.with_({"i": i}) for i in range(3)])
    assert len(ids) == 3
    assert all(ID.match(i) for i in ids)
    await Queue.idle()
    assert [r["id"] for r in runs] == ids


async def test_dispatch_from_inside_a_job_and_gather(app: App) -> None:
    await asyncio.gather(*(dispatch_record.dispatch({"i": i}) for i in range(5)))
    await Queue.idle()
    assert sorted(r["payload"]["i"] for r in runs) == [0, 1, 2, 3, 4]


@define_job(name="dispatch_unique_big", unique={"for": "1h"})
async def dispatch_unique_big(payload: Any, job: JobContext) -> None:
    runs.append({"payload": payload})


async def test_unique_lock_is_released_when_the_locked_message_is_too_large(app: App) -> None:
    # The lock adds a few bytes to the message: a message that fits without it and not
    # with it must not leave a lock behind that blocks every later dispatch.
    from haze._base.errors import PayloadTooLargeError
    from haze._base.message import Message, encode

    driver = app.driver("memory")
    plain = encode(Message(id="0" * 32, job="dispatch_unique_big", payload={"x": "a" * 100}))
    driver.max_message_size = len(plain) + 40
    with pytest.raises(PayloadTooLargeError):
        await dispatch_unique_big.dispatch({"x": "a" * 100})
    driver.max_message_size = None
    result = await dispatch_unique_big.with_({"x": "a"}).dispatch()
    assert not result.skipped


@define_job(name="dispatch_unique_debounced", unique={"for": "1h"}, debounce="1h")
async def dispatch_unique_debounced(payload: Any) -> None:
    runs.append({"payload": payload})


async def test_a_locked_job_is_encoded_once(app: App, monkeypatch: pytest.MonkeyPatch) -> None:
    # The payload goes through JSON once per dispatch: before the locks (so a payload
    # JSON cannot carry fails with nothing taken), and the envelope after them.
    from haze._base import message as envelope

    payload = {"rows": list(range(50))}
    walked: list[object] = []
    dumps = envelope._dumps

    def counting(value: Any) -> str:
        if value is payload or (isinstance(value, dict) and value.get("payload") is payload):
            walked.append(value)
        return dumps(value)

    monkeypatch.setattr(envelope, "_dumps", counting)
    result = await dispatch_unique_debounced.with_(payload).dispatch()
    assert not result.skipped
    assert len(walked) == 1


@define_job(name="dispatch_debounced_big", debounce="0.2s")
async def dispatch_debounced_big(payload: Any) -> None:
    runs.append({"payload": payload})


async def test_a_debounced_message_too_large_leaves_the_burst_alone(app: App) -> None:
    # Refused before its debounce mark is written: the mark would make the queued
    # message of the burst a superseded one, and no message would run at all.
    from haze._base.errors import PayloadTooLargeError

    driver = app.driver("memory")
    driver.max_message_size = 2000
    await dispatch_debounced_big.dispatch({"x": "small"})
    with pytest.raises(PayloadTooLargeError):
        await dispatch_debounced_big.dispatch({"x": "a" * 1990})
    await Queue.idle()
    assert [r["payload"] for r in runs] == [{"x": "small"}]
