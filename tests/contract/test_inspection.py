"""Counting a queue's jobs by state (``QueueInspector``: ``haze queue:stats``/``queue:top``)
on every driver that declares it, with one job running, one ready and one delayed."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from haze import Queue, define_job
from haze.contracts.driver import QueueCounts, QueueInspector, UncountedQueues

GATE: dict[str, asyncio.Event] = {}


@pytest.fixture(autouse=True)
def _gate() -> None:
    GATE.clear()


@define_job(name="insp_block")
async def insp_block(payload: dict[str, Any]) -> None:
    GATE["started"].set()
    await GATE["go"].wait()


@define_job(name="insp_other")
async def insp_other(payload: dict[str, Any]) -> None:
    pass


@define_job(name="insp_fail", tries=3, backoff=0)
async def insp_fail(payload: dict[str, Any]) -> None:
    raise RuntimeError("insp_fail always fails")


async def _until(check: Any, within: float = 20.0) -> Any:
    deadline = time.monotonic() + within
    while True:
        value = await check()
        if value or time.monotonic() > deadline:
            return value
        await asyncio.sleep(0.05)


async def test_counts_ready_delayed_and_running_and_lists_the_running_job(
    app: Any, driver: Any, done: Any
) -> None:
    d = app.driver("main")
    if not isinstance(d, QueueInspector):
        # sync keeps nothing to count; Cloudflare Queues report one backlog for a whole
        # queue, with no split by state (queue:stats says so instead of guessing).
        # Vercel Queues tell no depth at all (UncountedQueues).
        assert driver.id in {"sync", "cloudflare"} or isinstance(d, UncountedQueues), (
            f"{driver.id} should count jobs by state"
        )
        pytest.skip(f"the {driver.id} driver cannot count jobs by state")
    GATE["started"], GATE["go"] = asyncio.Event(), asyncio.Event()
    blocked = await insp_block.dispatch({})
    await asyncio.wait_for(GATE["started"].wait(), 30)
    try:
        delayed_at = time.time()
        await insp_other.dispatch({}, delay=300)
        # concurrency 1: this one waits behind the blocked job
        before = time.time()
        await insp_other.dispatch({})
        after = time.time()

        async def settled() -> QueueCounts | None:
            c = await d.counts("default")
            return c if (c.ready, c.delayed, c.running) == (1, 1, 1) else None

        counts = await _until(settled)
        assert counts is not None, await d.counts("default")
        if driver.id == "sqs":
            # its age is the CloudWatch metric ApproximateAgeOfOldestMessage only
            assert counts.oldest_ready_at is None
        else:
            # ready since its dispatch (the delayed job is not ready, so not the oldest)
            oldest = counts.oldest_ready_at
            assert oldest is not None and before - 0.01 <= oldest <= after + 0.01, (
                before,
                oldest,
                after,
            )
            assert counts.oldest_ready_age(oldest + 12) == 12
        if driver.id == "sqs":
            assert counts.next_delayed_at is None  # SQS does not say when a delay ends
        else:
            # when the delayed job comes due (`queue:work --stop-when-empty` says so)
            due = counts.next_delayed_at
            assert due is not None and delayed_at + 299 <= due <= time.time() + 301, due
        assert await d.counts("q1") == QueueCounts(0, 0, 0, None)
        running = await d.running("default")
        if driver.id == "sqs":
            assert running is None  # SQS cannot list messages in flight
        else:
            assert running is not None and [(j.id, j.name, j.attempt) for j in running] == [
                (blocked, "insp_block", 1)
            ]
            started = running[0].started_at
            assert started is not None and abs(time.time() - started) < 60
            assert await d.running("q1") == []
    finally:
        GATE["go"].set()
    await _until(lambda: _idle(d))
    await Queue.clear("default")


async def _idle(d: Any) -> bool:
    c = await d.counts("default")
    return bool(c.running == 0 and c.ready == 0)


async def test_oldest_ready_job_of_a_delayed_dispatch_is_ready_from_its_due_time(
    app: Any, driver: Any, done: Any
) -> None:
    """A job dispatched with a delay has waited since it came due, not since dispatch."""
    d = app.driver("main")
    if not isinstance(d, QueueInspector) or driver.id in {"sqs"}:
        pytest.skip(f"the {driver.id} driver cannot tell its oldest ready job")
    GATE["started"], GATE["go"] = asyncio.Event(), asyncio.Event()
    await insp_block.dispatch({})
    await asyncio.wait_for(GATE["started"].wait(), 30)
    try:
        before = time.time()
        await insp_other.dispatch({}, delay=1)
        if driver.id == "redis":
            # BullMQ moves a due job to the wait list only when a worker asks for work
            # (this one is busy): promote it as that worker would.
            link = d._link()
            s = link.scripts("default")
            await link.client.zremrangebyrank(s.keys["delayed"], 0, -1)
            last = await link.client.get(s.keys["id"])
            await asyncio.sleep(1.1)
            await link.client.lpush(s.keys["wait"], str(last))
        else:
            await asyncio.sleep(1.1)

        async def ready() -> QueueCounts | None:
            c = await d.counts("default")
            return c if c.ready == 1 else None

        counts = await _until(ready)
        assert counts is not None, await d.counts("default")
        oldest = counts.oldest_ready_at
        assert oldest is not None and oldest >= before + 1 - 0.01, (before, oldest)
        assert oldest <= time.time()
    finally:
        GATE["go"].set()
    await _until(lambda: _idle(d))
    await Queue.clear("default")


@pytest.mark.requires("failed_store")
async def test_failed_record_keeps_the_attempt_it_failed_on(app: Any, done: Any) -> None:
    """The failed record says which attempt failed (kept in its stored message, so no
    failed-table column), and a retried job counts its attempts afresh."""
    job_id = await insp_fail.dispatch({})
    await done()
    (rec,) = await Queue.failed()
    assert rec.id == job_id and rec.attempt == 3
    assert rec.to_dict()["attempt"] == 3
    assert await Queue.retry(rec.id) == [rec.id]
    await done()
    (again,) = await Queue.failed()
    assert again.id == job_id and again.attempt == 3
