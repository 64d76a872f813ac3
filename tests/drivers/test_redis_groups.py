"""Tenant groups on the ``redis`` driver: workers take a queue's groups in turn.

A grouped job waits in BullMQ's prioritized set with its turn as its priority, so every
BullMQ claim takes the groups round-robin; delayed, released and retried grouped jobs
come back there, and the queue's size, purge and the dashboard's backlog per group
count them. The same fairness test as the database driver's (tests/database/
test_groups.py): the order is the one the jobs themselves recorded. No speed is
asserted: ``bench/groups.py`` measures the cost.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis
from haze import App, JobContext, Queue, define_job
from haze._workers.worker import Worker
from haze.dashboard._data import overview
from redis_spec import REDIS_URL, needs_redis

pytestmark = [needs_redis, pytest.mark.timeout(120)]

#: (tenant, k) in the order the jobs started: the jobs' own records
STARTED: list[tuple[str, int]] = []


@define_job(name="rd_groups_job", group=lambda payload: payload["tenant"])
async def rd_groups_job(payload: dict[str, Any], job: JobContext) -> None:
    STARTED.append((payload["tenant"], payload["k"]))


@pytest.fixture
async def raw() -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        yield client
    finally:
        await client.aclose()


def _jobs(tenant: str, n: int) -> list[Any]:
    return [rd_groups_job.with_({"tenant": tenant, "k": i}) for i in range(n)]


async def _claim_all(app: App) -> list[tuple[str, int]]:
    driver: Any = app.driver("r")
    order: list[tuple[str, int]] = []
    while job := await driver.reserve(["default"], 0):
        order.append((job.message.payload["tenant"], job.message.payload["k"]))
        assert await driver.ack(job)
    return order


async def test_claims_take_the_groups_in_turn(redis_app: Callable[..., Any]) -> None:
    async with redis_app() as app:
        await Queue.bulk(_jobs("A", 4))
        await Queue.bulk(_jobs("B", 2))
        await rd_groups_job.dispatch({"tenant": "C", "k": 0})  # a single dispatch
        order = await _claim_all(app)
        assert order == [("A", 0), ("B", 0), ("C", 0), ("A", 1), ("B", 1), ("A", 2), ("A", 3)]


async def test_a_group_back_from_idle_starts_at_the_head(redis_app: Callable[..., Any]) -> None:
    async with redis_app() as app:
        await Queue.bulk(_jobs("A", 2))
        assert await _claim_all(app) == [("A", 0), ("A", 1)]
        await Queue.bulk(_jobs("B", 3))
        await Queue.bulk(_jobs("A", 2))  # A's old turns are spent: it starts at the head
        assert await _claim_all(app) == [("B", 0), ("A", 0), ("B", 1), ("A", 1), ("B", 2)]


async def test_delayed_and_released_grouped_jobs_come_back_to_the_turns(
    redis_app: Callable[..., Any], raw: aioredis.Redis, redis_prefix: str
) -> None:
    async with redis_app() as app:
        driver: Any = app.driver("r")
        await rd_groups_job.with_({"tenant": "D", "k": 0}).delay(0.2).dispatch()
        await Queue.bulk(_jobs("A", 3))
        assert await Queue.size("default") == 4
        await asyncio.sleep(0.3)
        first = await driver.reserve(["default"], 0)  # promotes D's job: it is due
        assert first.message.payload["tenant"] == "A"
        assert await raw.llen(f"{redis_prefix}:default:wait") == 0  # not a plain job
        assert await raw.zcard(f"{redis_prefix}:default:prioritized") == 3
        # a release goes back to the prioritized set too, with its turn (taken next)
        assert await driver.release(first, 0, consume_attempt=False)
        order = await _claim_all(app)
        assert sorted(order) == [("A", 0), ("A", 1), ("A", 2), ("D", 0)]
        assert order[0] in (("A", 0), ("D", 0))
        assert await raw.llen(f"{redis_prefix}:default:wait") == 0


async def test_size_and_purge_count_grouped_jobs(redis_app: Callable[..., Any]) -> None:
    async with redis_app() as app:
        await Queue.bulk(_jobs("A", 5))
        await rd_groups_job.with_({"tenant": "B", "k": 0}).delay(60).dispatch()
        assert await Queue.size("default") == 6
        assert await app.driver("r").purge("default") == 6  # type: ignore[attr-defined]
        assert await Queue.size("default") == 0


async def test_the_dashboard_shows_the_backlog_per_group(redis_app: Callable[..., Any]) -> None:
    async with redis_app() as app:
        await Queue.bulk(_jobs("A", 30))
        await Queue.bulk(_jobs("B", 3))
        await Queue.bulk(_jobs("b", 5))
        await rd_groups_job.with_({"tenant": "-", "k": 0}).delay(60).dispatch()
        await app.driver("r").reserve(["default"], 0)  # type: ignore[attr-defined]
        rows = await overview(app)
        [row] = [r for r in rows if r.queue == "default"]
        assert row.groups == [("A", 29), ("b", 5), ("B", 3), ("-", 1)]


async def test_ten_thousand_jobs_of_one_tenant_starve_no_other(
    redis_app: Callable[..., Any],
) -> None:
    """Tenant A has 10,000 queued jobs, B–E 10 each, and 2 workers drain the queue:
    every job of B–E starts before A's 200th (the order the jobs themselves recorded)."""
    STARTED.clear()
    async with redis_app() as app:
        await Queue.bulk(_jobs("A", 10_000))
        for tenant in "BCDE":
            await Queue.bulk(_jobs(tenant, 10))
        workers = [Worker(app, "r", ["default"], 1, sleep=0.05) for _ in range(2)]
        runs = [asyncio.ensure_future(w.run()) for w in workers]
        try:
            async with asyncio.timeout(60):
                while sum(t != "A" for t, _ in STARTED) < 40 or len(STARTED) < 250:
                    await asyncio.sleep(0.05)
        finally:
            for w in workers:
                await w.stop()
            with contextlib.suppress(Exception):
                await asyncio.gather(*runs, return_exceptions=True)
        a_200th = [i for i, (t, _) in enumerate(STARTED) if t == "A"][199]
        others = [i for i, (t, _) in enumerate(STARTED) if t != "A"]
        assert len(others) == 40 and max(others) < a_200th


@define_job(name="rd_groups_fails", group=lambda payload: payload["tenant"])
async def rd_groups_fails(payload: dict[str, Any]) -> None:
    raise RuntimeError("tenant down")


async def test_a_retried_grouped_job_goes_back_to_its_group(
    redis_app: Callable[..., Any], raw: aioredis.Redis, redis_prefix: str
) -> None:
    async with redis_app() as app:
        failed_id = await rd_groups_fails.dispatch({"tenant": "F"})
        await Worker(app, "r", ["default"], 1, sleep=0.05, stop_when_empty=True).run()
        [failed] = await Queue.failed()
        assert failed.id == failed_id
        assert await Queue.retry(failed_id) == [failed_id]
        [job_id] = await raw.zrange(f"{redis_prefix}:default:prioritized", 0, -1)
        assert await raw.hget(f"{redis_prefix}:default:{job_id}", "hzg") == "F"
        assert await raw.llen(f"{redis_prefix}:default:wait") == 0


async def test_a_paused_queue_holds_its_grouped_jobs(
    redis_app: Callable[..., Any], raw: aioredis.Redis, redis_prefix: str
) -> None:
    """BullMQ's pause (a Node ``queue.pause()``) holds grouped jobs like the others."""
    async with redis_app() as app:
        await raw.hset(f"{redis_prefix}:default:meta", "paused", 1)
        await Queue.bulk(_jobs("A", 2))
        assert await app.driver("r").reserve(["default"], 0) is None  # type: ignore[attr-defined]
        assert await Queue.size("default") == 2
        await raw.hdel(f"{redis_prefix}:default:meta", "paused")
        assert await _claim_all(app) == [("A", 0), ("A", 1)]
