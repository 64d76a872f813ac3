"""The sync connection: runs inside dispatch, in the caller's context, stores nothing."""

from __future__ import annotations

import contextvars
import logging
from typing import Any

import pytest
from haze import App, JobContext, Queue, define_job, define_queue_config

events: list[Any] = []
request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")


@pytest.fixture(autouse=True)
def _clear() -> None:
    events.clear()


@pytest.fixture
async def sync_app() -> Any:
    """An app whose default connection is sync."""
    app = App(queue=define_queue_config(default="sync", connections={"sync": {"driver": "sync"}}))
    async with app:
        yield app


@define_job(name="sync_record", tries=3, backoff="1h")
async def sync_record(payload: dict, job: JobContext) -> None:
    events.append(("run", payload, job.attempt, job.connection, request_id.get()))


@define_job(name="sync_plain")
def sync_plain(payload: dict, job: JobContext) -> None:
    events.append(("plain", request_id.get()))


@define_job(name="sync_fails", tries=3, backoff=[1, 2])
async def sync_fails(payload: dict, job: JobContext) -> None:
    events.append(("run", job.attempt))
    raise ValueError("bad invoice")


@sync_fails.on_failed
async def _sync_fails_failed(payload: dict, error: BaseException, job: JobContext) -> None:
    events.append(
        ("failed", payload, type(error).__name__, str(error), job.attempt, request_id.get())
    )


@define_job(name="sync_releases")
async def sync_releases(payload: dict, job: JobContext) -> None:
    events.append(("run", job.attempt))
    job.release("1s")


async def test_runs_inside_dispatch(sync_app: App) -> None:
    job_id = await sync_record.dispatch({"n": 1})
    assert events == [("run", {"n": 1}, 1, "sync", "-")]
    assert isinstance(job_id, str)


async def test_runs_in_the_callers_context(sync_app: App) -> None:
    token = request_id.set("req-42")
    try:
        await sync_record.dispatch({"n": 1})
        await sync_plain.dispatch({})  # a plain def handler runs in a thread with a copy
    finally:
        request_id.reset(token)
    assert events == [("run", {"n": 1}, 1, "sync", "req-42"), ("plain", "req-42")]


async def test_ignores_delay(sync_app: App) -> None:
    await sync_record.dispatch({"n": 1}, delay="10m")
    res = await sync_record.with_({"n": 2}).delay("1h").dispatch()
    assert [e[1] for e in events] == [{"n": 1}, {"n": 2}]
    assert res.skipped is False


async def test_no_retries_failed_then_raise_to_the_caller(sync_app: App) -> None:
    token = request_id.set("req-7")
    try:
        with pytest.raises(ValueError, match="bad invoice"):
            await sync_fails.dispatch({"invoice_id": 1})
        events.append("caller saw the error")
    finally:
        request_id.reset(token)
    assert events == [
        ("run", 1),  # tries=3 is ignored: one run only
        ("failed", {"invoice_id": 1}, "ValueError", "bad invoice", 1, "req-7"),
        "caller saw the error",
    ]


async def test_pending_dispatch_and_facade_raise_too(sync_app: App) -> None:
    with pytest.raises(ValueError):
        await sync_fails.with_({"n": 1}).dispatch()
    with pytest.raises(ValueError):
        await Queue.dispatch("sync_fails", {"n": 2})
    assert [e[0] for e in events] == ["run", "failed", "run", "failed"]


async def test_final_failure_is_logged_once(
    sync_app: App, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="haze")
    with pytest.raises(ValueError):
        await sync_fails.dispatch({})
    job_records = [r for r in caplog.records if r.name == "haze.job"]
    assert [r.state for r in job_records] == ["running", "failed"]  # type: ignore[attr-defined]
    job_records = [r for r in job_records if r.levelno > logging.DEBUG]
    assert [r.levelno for r in job_records] == [logging.ERROR]
    assert (
        job_records[0].getMessage()
        == 'Job "sync_fails" failed after 1 attempt(s): ValueError: bad invoice'
    )


async def test_release_drops_the_job_with_a_warning(
    sync_app: App, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="haze")
    await sync_releases.dispatch({})  # does not raise
    assert events == [("run", 1)]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "sync_releases" in warnings[0].getMessage()
    assert "dropped" in warnings[0].getMessage()


async def test_stores_nothing(sync_app: App) -> None:
    with pytest.raises(ValueError):
        await sync_fails.dispatch({})
    await sync_record.dispatch({}, delay="1h")
    assert await Queue.failed() == []
    assert await Queue.failed(connection="sync") == []
    assert await Queue.size(connection="sync") == 0
    assert await Queue.retry() == []
    assert await Queue.flush() == 0
    assert await Queue.forget("anything") is False
    await Queue.idle()  # nothing to wait for


async def test_sync_connection_next_to_memory(app: App) -> None:
    """dispatch(connection="sync") on an app whose default is memory."""
    with pytest.raises(ValueError):
        await sync_fails.dispatch({}, connection="sync")
    assert await Queue.failed(connection="sync") == []
    assert await Queue.failed() == []
    await sync_record.dispatch({"n": 1}, connection="sync")
    assert events[-1] == ("run", {"n": 1}, 1, "sync", "-")


async def test_bulk_on_sync_runs_inline(sync_app: App) -> None:
    ids = await Queue.bulk([sync_record.with_({"i": 1}), sync_record.with_({"i": 2})])
    assert len(ids) == 2
    assert [e[1] for e in events] == [{"i": 1}, {"i": 2}]


@define_job(name="sync_link")
async def sync_link(payload: dict, job: JobContext) -> None:
    events.append(("link", payload["i"]))
    if payload.get("fail"):
        raise ValueError(f"link {payload['i']} failed")


async def test_a_long_chain_runs_every_link_inside_dispatch(sync_app: App) -> None:
    """Each link used to run inside the previous link's settling: past about 80 links
    the nesting raised RecursionError."""
    await Queue.chain([sync_link.with_({"i": i}) for i in range(400)]).dispatch()
    assert events == [("link", i) for i in range(400)]


async def test_a_long_chains_failing_link_raises_to_the_caller_and_stops_it(
    sync_app: App,
) -> None:
    caught: list[str] = []
    links = [sync_link.with_({"i": i, "fail": i == 300}) for i in range(400)]
    with pytest.raises(ValueError, match="link 300 failed"):
        await Queue.chain(links).catch(lambda error: caught.append(str(error))).dispatch()
    assert events == [("link", i) for i in range(301)]
    assert caught == ["link 300 failed"]


async def test_a_job_that_dispatches_another_sees_it_run_inside_its_dispatch(
    sync_app: App,
) -> None:
    await sync_parent.dispatch({})
    assert events == [("parent", "before"), ("link", 7), ("parent", "after")]


@define_job(name="sync_parent")
async def sync_parent(payload: dict, job: JobContext) -> None:
    events.append(("parent", "before"))
    await sync_link.dispatch({"i": 7})
    events.append(("parent", "after"))
