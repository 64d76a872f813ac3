"""The redis driver keeps one failed record per haze message id: a message that fails
again (a retry from failed jobs, a copy of it queued twice, a failure recorded beside
BullMQ's) replaces its record, so list, find, count, counts and pages agree."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from haze import App, Queue, define_job
from haze._workers.worker import Worker
from haze.contracts.driver import FailedJob
from haze.drivers.redis import RedisDriver
from haze.drivers.redis.scripts import _NewJob
from redis_spec import needs_redis

pytestmark = needs_redis

RUNS: list[Any] = []


@define_job(name="rfo_fails", tries=1)
async def rfo_fails(payload: Any) -> None:
    RUNS.append(payload)
    raise ValueError(f"boom {len(RUNS)}")


async def _drain(app: App, runs: int) -> None:
    w = Worker(app, "r", None, 1, sleep=0.05, max_sleep=0.2)
    w.start()
    try:
        deadline = time.monotonic() + 10
        while len(RUNS) < runs:
            assert time.monotonic() < deadline, "the jobs did not run"
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)  # the last failure is recorded after the run
    finally:
        await w.stop()


async def _one_record(app: App, job_id: str) -> FailedJob:
    driver = app.driver()
    assert isinstance(driver, RedisDriver)
    failed = driver.failed
    listed = await Queue.failed()
    assert [f.id for f in listed] == [job_id]
    assert await failed.count() == 1
    assert await failed.counts() == {"default": 1}
    assert [f.id for f in await failed.page()] == [job_id]
    found = await failed.find(job_id)
    assert found is not None
    return found


@pytest.fixture(autouse=True)
def _reset() -> None:
    RUNS.clear()


async def test_a_retried_job_that_fails_again_keeps_one_record(redis_app) -> None:
    async with redis_app() as app:
        job_id = await rfo_fails.dispatch({"n": 1})
        await _drain(app, 1)
        await _one_record(app, job_id)
        assert await Queue.retry(job_id) == [job_id]
        await _drain(app, 2)
        record = await _one_record(app, job_id)
        assert "boom 2" in record.exception


async def test_a_message_queued_twice_that_fails_twice_keeps_one_record(redis_app) -> None:
    async with redis_app() as app:
        job_id = await rfo_fails.dispatch({"n": 1})
        driver = app.driver()
        assert isinstance(driver, RedisDriver)
        scripts = driver._link().scripts("default")
        raw = await driver._link().client.hget(scripts.toKey("1"), "data")
        body = raw.decode() if isinstance(raw, bytes) else raw
        assert json.loads(body)["id"] == job_id
        # the same message sent again (a producer's resend): a second BullMQ job
        await scripts.addJob(_NewJob("rfo_fails", body, 0, round(time.time() * 1000)))
        await _drain(app, 2)
        record = await _one_record(app, job_id)
        assert "boom 2" in record.exception
        assert await Queue.forget(job_id) is True
        assert await Queue.failed() == []
        assert await driver.failed.count() == 0


async def test_a_failure_recorded_beside_bullmqs_replaces_it(redis_app) -> None:
    async with redis_app() as app:
        job_id = await rfo_fails.dispatch({"n": 1})
        await _drain(app, 1)
        first = await _one_record(app, job_id)
        driver = app.driver()
        assert isinstance(driver, RedisDriver)
        again = FailedJob.from_body(
            first.body,
            id=None,
            connection="r",
            queue="default",
            exception="RuntimeError: recorded apart",
            failed_at=time.time() + 1,
            name=first.name,
        )
        await driver.failed.record(again)
        record = await _one_record(app, job_id)
        assert record.exception == "RuntimeError: recorded apart"
