"""A worker that lost a job's lease says so.

An async job that blocks the event loop (``time.sleep``) stops the lease heartbeat; once
``retry_after`` passes another worker takes the job over. When the first worker's ack,
release or fail then finds it no longer owns the job, it logs a warning naming the job
and why, and counts it (``Worker.leases_lost``).

Worker A runs in this process (its loop is blocked by the job, as a user's would be);
worker B is a real ``haze queue:work`` process, started by a timer thread while A's
loop is blocked.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from haze._app.driver_context import AppDriverContext
from haze._workers.worker import Worker
from haze.drivers import FailedJob
from rb_harness import jobs, needs_redis, rig

pytestmark = [pytest.mark.timeout(120)]

KINDS = ["sqlite", "postgres", pytest.param("redis", marks=needs_redis)]


def _db_url(request: pytest.FixtureRequest, kind: str) -> str | None:
    return str(request.getfixturevalue("pg_url")) if kind == "postgres" else None


@pytest.mark.parametrize("kind", KINDS)
async def test_an_ack_after_the_lease_expired_is_a_warning_naming_the_job(
    request: pytest.FixtureRequest, kind: str, tmp_path: Path, caplog: Any
) -> None:
    async with rig(kind, tmp_path, _db_url(request, kind), retry_after="2s") as r:
        job_id = await jobs.rb_block.dispatch({"k": "blocked", "sleep": 8}, connection=r.connection)
        # B starts while A's loop is blocked inside the job
        threading.Timer(0.3, r.worker).start()
        a = Worker(r.app, r.connection, ["default"], 1, stop_when_empty=True, sleep=0.05)
        with caplog.at_level(logging.WARNING):
            await a.run()
        [b] = r.procs
        await r.wait_ended({"blocked"}, within=30, procs=[b])
        events = [(e, att, pid) for e, k, att, pid, _ in r.events() if k == "blocked"]
        starts = sorted((att, pid) for e, att, pid in events if e == "start")
        assert [att for att, _ in starts] == [1, 2], events
        assert starts[1][1] == b.pid, "worker B took the job over"

        assert a.leases_lost == 1
        lost = [rec for rec in caplog.records if "lease" in rec.getMessage()]
        assert len(lost) == 1, [rec.getMessage() for rec in caplog.records]
        text = lost[0].getMessage()
        assert lost[0].levelno == logging.WARNING
        assert '"rb_block"' in text and job_id in text, text
        assert "another worker" in text and "retry_after" in text, text
        assert "blocks the event loop" in text, text
        assert getattr(lost[0], "job_id", None) == job_id

        b.send_signal(signal.SIGTERM)
        assert await r.wait_exit(b) == 0, r.log(b)
        assert await r.leftover() == [] and await r.failed() == []


@pytest.mark.parametrize("kind", KINDS)
async def test_ack_release_and_fail_report_a_lost_lease(
    request: pytest.FixtureRequest, kind: str, tmp_path: Path
) -> None:
    """Each settling call returns False (and changes nothing) once another worker holds
    the job; True while this one does. On a database the other worker has a driver of
    its own, as another process would: a claim of this process's own driver is this
    process's next attempt (a retry that crossed it counts as recorded)."""
    async with rig(kind, tmp_path, _db_url(request, kind), retry_after="1s") as r:
        driver: Any = r.app.driver(r.connection)
        other: Any = driver
        if kind != "redis":
            context = AppDriverContext(r.app, r.connection, "'database'")
            other = type(driver)(r.connection, dict(driver.settings), context)
        for _ in range(5):
            await jobs.rb_record.dispatch({"k": "x"}, connection=r.connection)
        mine = await driver.reserve(["default"], 0)
        assert await driver.ack(mine) is True
        for settle in ("ack", "retry", "release", "fail"):
            first = await driver.reserve(["default"], 0)
            assert first is not None
            if kind == "redis":
                await r.redis().delete(f"{r.prefix}:default:{first.token[0]}:lock")
                await asyncio.sleep(0.01)
                assert await driver.check_stalled(["default"]) == []  # marks it
                await _wait_stalled(driver, first)
            else:
                await asyncio.sleep(1.1)  # past retry_after with no heartbeat
            second = await other.reserve(["default"], 0)
            assert second is not None and second.body == first.body, settle
            if settle == "ack":
                owned = await driver.ack(first)
            elif settle == "retry":
                owned = await driver.release(first, 0, consume_attempt=True)
            elif settle == "release":
                owned = await driver.release(first, 0, consume_attempt=False)
            else:
                owned = await driver.fail(first, _failed(first, r.connection))
            assert owned is False, settle
            assert await other.ack(second) is True, settle
        assert await r.leftover() == [] and await r.failed() == []


async def _wait_stalled(driver: Any, job: Any) -> None:
    deadline = time.monotonic() + 10
    while job.token[0] not in await driver.check_stalled(["default"]):
        assert time.monotonic() < deadline, "the stalled check never put the job back"
        await asyncio.sleep(0.05)


def _failed(job: Any, connection: str) -> FailedJob:
    return FailedJob(
        id=job.message.id,
        name=job.message.job,
        connection=connection,
        queue=job.queue,
        payload=job.message.payload,
        exception="RuntimeError: boom",
        failed_at=time.time(),
        body=job.body,
    )
