"""Counting a queue's jobs by state (``QueueInspector``: ``haze queue:stats``/``queue:top``)
on every driver that declares it, with one job running, one ready and one delayed."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from haze import Queue, define_job
from haze.drivers.base import QueueCounts, QueueInspector

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
        assert driver.id in {"sync", "cloudflare"}, f"{driver.id} should count jobs by state"
        pytest.skip(f"the {driver.id} driver cannot count jobs by state")
    GATE["started"], GATE["go"] = asyncio.Event(), asyncio.Event()
    blocked = await insp_block.dispatch({})
    await asyncio.wait_for(GATE["started"].wait(), 30)
    try:
        await insp_other.dispatch({}, delay=300)
        # concurrency 1: this one waits behind the blocked job
        await insp_other.dispatch({})

        async def settled() -> QueueCounts | None:
            c = await d.counts("default")
            return c if (c.ready, c.delayed, c.running) == (1, 1, 1) else None

        counts = await _until(settled)
        assert counts is not None, await d.counts("default")
        assert await d.counts("q1") == QueueCounts(0, 0, 0)
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
