"""A worker with many slots or many running jobs, on each SQL backend.

The heartbeat renews the leases of a claim's running rows in one statement. A worker
with ``stop_when_empty`` stops once a claim finds nothing and no slot is busy. Its idle
slots used to claim again every 5 ms while another slot ran a job, so one long job at
concurrency 8 sent about 800 claims a second to the server (6,660 transactions on
PostgreSQL for one 8-second job, against 62 at concurrency 1); and a slot waiting for
the other slots' claims polled every 5 ms, so at concurrency 2,000 a worker on an empty
queue took 36 s to stop, and at 3,000 it did not stop within 100 s. Claims are counted
by wrapping the driver's claim calls (the real ones run).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import BACKENDS, backend_url, database_app, mysql_database, pg_database
from haze import App, Queue, define_job
from haze._workers.worker import Worker

pytestmark = [pytest.mark.timeout(180)]

RAN: list[str] = []


@define_job(name="dbx_swe_sleep")
async def dbx_swe_sleep(payload: dict[str, Any]) -> None:
    await asyncio.sleep(payload["seconds"])
    RAN.append(payload["k"])


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    yield from pg_database("dbx_swe")


@pytest.fixture(scope="session")
def mysql_url() -> Iterator[str]:
    yield from mysql_database("dbx_swe")


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    RAN.clear()
    return backend_url(request, request.param, tmp_path)


def open_app(db_url: str) -> contextlib.AbstractAsyncContextManager[App]:
    return database_app(db_url, "dbx_swe")


def count_claims(driver: Any) -> list[int]:
    """Wrap the driver's claim calls (plain, and acks folded into a claim): one entry
    per claim sent, holding how many rows it took."""
    claims: list[int] = []
    for name in ("reserve_many", "ack_and_claim"):
        real = getattr(driver, name, None)
        if real is None:
            continue

        async def call(*args: Any, _real: Any = real, **kwargs: Any) -> Any:
            result = await _real(*args, **kwargs)
            claims.append(len(result) if isinstance(result, list) else -1)
            return result

        setattr(driver, name, call)
    return claims


async def test_many_slots_on_an_empty_queue_stop(db_url: str) -> None:
    async with open_app(db_url) as app:
        claims = count_claims(app.driver("db"))
        worker = Worker(app, "db", ["default"], 3000, stop_when_empty=True, sleep=0.05)
        assert await asyncio.wait_for(worker.run(), 90) == 0
        # Each slot claims once (one answer cannot speak for the others: see the last
        # test); the slots waiting for those claims wait on an event, not a 5 ms poll.
        assert len(claims) <= 3000, f"{len(claims)} claims on an empty queue"


async def test_idle_slots_do_not_poll_the_server_while_a_job_runs(db_url: str) -> None:
    async with open_app(db_url) as app:
        await dbx_swe_sleep.dispatch({"k": "long", "seconds": 2.0})
        claims = count_claims(app.driver("db"))
        worker = Worker(app, "db", ["default"], 4, stop_when_empty=True, sleep=0.2)
        assert await asyncio.wait_for(worker.run(), 150) == 1
        assert RAN == ["long"]
        assert await Queue.size() == 0
        # The claim that took the job, the idle polls at `sleep` doubling to `max_sleep`
        # while it ran (one per wait, not one per slot), and the last one that found
        # nothing: not one claim every 5 ms from each of the 3 idle slots (about 1,200).
        assert sum(1 for n in claims if n == 1) == 1, claims
        assert len(claims) <= 20, f"{len(claims)} claims while one 2 s job ran"


async def test_one_heartbeat_renews_a_claims_rows_in_one_statement(db_url: str) -> None:
    # One UPDATE per running job made a heartbeat cost one round trip per job: 40,000
    # running jobs (or 1,000 on a server 5 ms away) took longer than a 5 s retry_after
    # to renew, and the worker took over its own running jobs and ran them twice.
    async with open_app(db_url) as app:
        driver: Any = app.driver("db")
        await Queue.bulk([dbx_swe_sleep.with_({"k": str(i), "seconds": 0}) for i in range(60)])
        jobs = await driver.reserve_many(["default"], 60, 0.0)
        assert len(jobs) == 60
        db = app.database()
        await db.execute(f"UPDATE {driver.table} SET heartbeat_at = NULL")
        sent: list[str] = []
        real = db.execute

        async def execute(sql: str, params: Any = ()) -> Any:
            sent.append(sql)
            return await real(sql, params)

        db.execute = execute
        await driver.heartbeat(jobs)
        db.execute = real
        assert len(sent) == 1, f"{len(sent)} statements for one heartbeat of 60 jobs"
        rows = await db.fetchall(f"SELECT heartbeat_at FROM {driver.table}")
        assert len(rows) == 60 and all(r[0] is not None for r in rows), rows
        assert await driver.ack_many(jobs) == [True] * 60


def count_statements(db: Any) -> tuple[list[str], Any]:
    """Record each statement ``db.execute``/``fetchall`` sends (the real ones run)."""
    sent: list[str] = []
    real = (db.execute, db.fetchall)

    async def execute(sql: str, params: Any = ()) -> Any:
        sent.append(sql)
        return await real[0](sql, params)

    async def fetchall(sql: str, params: Any = ()) -> Any:
        sent.append(sql)
        return await real[1](sql, params)

    db.execute, db.fetchall = execute, fetchall
    return sent, real


async def test_one_heartbeat_renews_the_rows_of_many_claims_in_one_statement(db_url: str) -> None:
    # A worker fed by a producer claims a few jobs at a time, each claim with its own
    # reserved_at: one UPDATE per claim made a round for 2,000 such jobs take 2 s, and
    # at retry_after 2 s the worker took its own running jobs over and ran them twice
    # (tests/database/test_lease_storm.py).
    async with open_app(db_url) as app:
        driver: Any = app.driver("db")
        await Queue.bulk([dbx_swe_sleep.with_({"k": str(i), "seconds": 0}) for i in range(40)])
        jobs = [job for _ in range(40) for job in await driver.reserve_many(["default"], 1, 0.0)]
        assert len(jobs) == 40 and len({job.token[1] for job in jobs}) == 40
        db = app.database()
        await db.execute(f"UPDATE {driver.table} SET heartbeat_at = NULL")
        # one row taken over by another worker: its lease is not this worker's to renew
        await db.execute(
            f"UPDATE {driver.table} SET reserved_at = 1.5 WHERE id = ?", (jobs[0].token[0],)
        )
        sent, real = count_statements(db)
        await driver.heartbeat(jobs)
        db.execute, db.fetchall = real
        per = 45 if db.dialect == "d1" else 40
        assert len(sent) == -(-40 // per), f"{len(sent)} statements for 40 jobs of 40 claims"
        rows = await db.fetchall(f"SELECT id, heartbeat_at FROM {driver.table} ORDER BY id")
        renewed = {int(r[0]) for r in rows if r[1] is not None}
        assert renewed == {int(job.token[0]) for job in jobs[1:]}


async def test_a_slow_claim_refreshes_its_rows_in_one_statement(db_url: str) -> None:
    # A claim answered late (a loaded server) wrote a reserved_at that is already old:
    # its rows are refreshed before they run, in one statement, not one per row, and a
    # row another worker took over meanwhile is dropped.
    async with open_app(db_url) as app:
        driver: Any = app.driver("db")
        await Queue.bulk([dbx_swe_sleep.with_({"k": str(i), "seconds": 0}) for i in range(30)])
        jobs = await driver.reserve_many(["default"], 30, 0.0)
        token = jobs[0].token[1]
        rows = [(job.token[0], job.body, job.attempt, token, 0.0) for job in jobs]
        db = app.database()
        await db.execute(
            f"UPDATE {driver.table} SET reserved_at = 1.5 WHERE id = ?", (jobs[0].token[0],)
        )
        driver.retry_after = 0.0  # any claim counts as slow
        sent, real = count_statements(db)
        kept = await driver._fresh(rows, token)
        db.execute, db.fetchall = real
        assert [r[0] for r in kept] == [r[0] for r in rows[1:]]
        assert len(sent) <= 2, f"{len(sent)} statements to refresh a claim of 30 rows"


async def test_a_worker_warns_when_its_concurrency_is_more_leases_than_it_can_renew(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with open_app(db_url) as app:
        driver: Any = app.driver("db")
        # a lease a thousand slots cannot renew in time on any dialect
        driver.retry_after, driver.heartbeat_interval = 0.03, 0.01
        for concurrency, told in ((10, False), (1000, True)):
            caplog.clear()
            worker = Worker(app, "db", ["default"], concurrency, stop_when_empty=True)
            worker.start()
            await worker.stop()
            lines = [r.getMessage() for r in caplog.records if "--concurrency" in r.getMessage()]
            assert bool(lines) is told, lines
        assert "--concurrency 1000 " in lines[0] and "retry_after 0.03s" in lines[0]
        assert driver.lease_warning(1000) == lines[0].removeprefix("haze worker: ")


@pytest.mark.parametrize("backend", ["mariadb", "postgres", "sqlite"])
async def test_stop_when_empty_leaves_no_ready_job_behind(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    # On MariaDB a claim can find nothing while ready rows are left (SKIP LOCKED skips
    # rows other statements of this worker hold locked). Letting the slots queued behind
    # such a claim trust its answer, instead of claiming themselves, stopped a worker
    # with 349 to 5,019 of 20,000 jobs ready at --concurrency 1,000-5,000.
    RAN.clear()
    async with open_app(backend_url(request, backend, tmp_path)) as app:
        n = 6000
        await Queue.bulk([dbx_swe_sleep.with_({"k": str(i), "seconds": 0}) for i in range(n)])
        worker = Worker(app, "db", ["default"], 500, stop_when_empty=True, sleep=0.05)
        assert await asyncio.wait_for(worker.run(), 150) == n
        assert await Queue.size() == 0
        assert sorted(RAN) == sorted(str(i) for i in range(n))
