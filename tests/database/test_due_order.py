"""The database driver claims in due order, on every SQL backend.

A claim takes the row that became due first (``available_at``, then ``id`` among rows
due at the same time), merged with rows whose lease ran out, from an index that starts
at the due rows: a job due earlier but inserted after many rows not due yet (lower ids)
is claimed first, and PostgreSQL's plan reads the due index. ``haze db:migrate`` gives
tables created before this the new index. No speed is asserted here: the 100k-job
lateness figures come from ``bench/scale.py``'s ``delayed`` scenario.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import BACKENDS, backend_url, database_app, mysql_database, pg_database
from haze import App, JobContext, Queue, define_job
from haze._workers.worker import Worker
from haze.connectors.migrations import ensure_queue_tables, migrate
from haze.drivers.sql.claim import _branches

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    yield from pg_database("dbx_due")


@pytest.fixture(scope="session")
def mysql_url() -> Iterator[str]:
    yield from mysql_database("dbx_due")


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return backend_url(request, request.param, tmp_path)


@define_job(name="dbx_due_noop")
async def dbx_due_noop(payload: dict[str, Any], job: JobContext) -> None:
    pass


@contextlib.asynccontextmanager
async def open_app(db_url: str, create: bool = True) -> AsyncIterator[tuple[App, str]]:
    async with database_app(db_url, "dbx_due", create=create, retry_after=60) as app:
        driver: Any = app.driver("db")
        yield app, driver.table


async def _keys(jobs: list[Any]) -> list[str]:
    return [str(j.message.payload["k"]) for j in jobs]


async def test_the_row_due_first_is_claimed_first_not_the_lowest_id(db_url: str) -> None:
    async with open_app(db_url) as (app, table):
        driver: Any = app.driver("db")
        db = app.database()
        # 300 rows first (low ids), then "late" (the highest id) and "lapsed".
        await Queue.bulk([dbx_due_noop.with_({"k": f"a{i}"}) for i in range(300)])
        await dbx_due_noop.dispatch({"k": "late"})
        await dbx_due_noop.dispatch({"k": "lapsed"})
        rows = await db.fetchall(f"SELECT id FROM {table} ORDER BY id")
        ids = [int(r[0]) for r in rows]
        now = time.time()
        # The low ids became due a second ago, "late" ten seconds ago (a job dispatched
        # with a shorter delay after them) ...
        # (A row without a group has its due time as its turn: both move together.)
        await db.execute(
            f"UPDATE {table} SET available_at = ?, turn = ? WHERE id < ?",
            (now - 1, now - 1, ids[-2]),
        )
        await db.execute(
            f"UPDATE {table} SET available_at = ?, turn = ? WHERE id = ?",
            (now - 10, now - 10, ids[-2]),
        )
        # ... and "lapsed" was claimed by a worker that died: due a minute ago, its lease
        # (retry_after 60 s) ran out since.
        await db.execute(
            f"UPDATE {table} SET available_at = ?, turn = ?, reserved_at = ?, heartbeat_at = ? "
            "WHERE id = ?",
            (now - 70, now - 70, now - 65, now - 65, ids[-1]),
        )
        first = await driver.reserve(["default"], 0)
        assert await _keys([first]) == ["lapsed"]
        batch = await driver.reserve_many(["default"], 3, 0)
        # due order, then FIFO (id) among the rows due at the same time
        assert await _keys(batch) == ["late", "a0", "a1"]
        await driver.ack_many([first, *batch])
        # the folded ack and claim (one statement on PostgreSQL) claims in due order too
        await db.execute(
            f"UPDATE {table} SET available_at = ?, turn = ? WHERE id = ?",
            (now - 5, now - 5, ids[250]),
        )
        jobs = await driver.reserve_many(["default"], 1, 0)
        assert await _keys(jobs) == ["a250"]
        _, claimed = await driver.ack_and_claim(jobs, "default", 2)
        assert await _keys(claimed) == ["a2", "a3"]


async def test_rows_not_due_yet_are_not_claimed(db_url: str) -> None:
    async with open_app(db_url) as (app, _):
        driver: Any = app.driver("db")
        await Queue.bulk([dbx_due_noop.with_({"k": f"d{i}"}).delay(3600) for i in range(50)])
        await dbx_due_noop.dispatch({"k": "now"})
        assert await _keys(await driver.reserve_many(["default"], 5, 0)) == ["now"]
        assert await driver.reserve_many(["default"], 5, 0) == []


@pytest.fixture
def pg_only(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue("pg_url"))


async def _pg_plan(app: App, sql: str, params: tuple[Any, ...]) -> str:
    rows = await app.database().fetchall(f"EXPLAIN {sql}", params)
    return "\n".join(str(r[0]) for r in rows)


async def test_postgres_claims_read_the_turn_index(pg_only: str) -> None:
    async with open_app(pg_only) as (app, table):
        driver: Any = app.driver("db")
        db = app.database()
        # Enough rows not due yet that a scan would cost: the planner picks the index.
        await Queue.bulk([dbx_due_noop.with_({"k": i}).delay(3600) for i in range(3000)])
        await db.execute(f"ANALYZE {table}")
        now, token = time.time(), time.time()
        # (rows without a group have their due time as their turn: the turn index starts
        # at the rows whose turn has come and stops at now)
        b = ("default", now, now, 4, "default", now, now, 4, "default", now - 60, now - 60, 4, 4)
        claim = await _pg_plan(app, driver.sql["claim_many"], (*b, token, token))
        assert f"Index Scan using {table}_turn_idx" in claim, claim
        folded = await _pg_plan(
            app, driver.sql["ack_claim_many"], ([1], [1.0], *b[:11], [1], *b[11:], token, token)
        )
        assert f"Index Scan using {table}_turn_idx" in folded, folded


#: The PostgreSQL jobs table and index as haze created them before claims went in due
#: order (the other dialects' queue index already starts at the due rows).
OLD_PG_SCHEMA = [
    """CREATE TABLE {jobs} (
        id BIGSERIAL PRIMARY KEY, queue TEXT NOT NULL, payload TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0, reserved_at DOUBLE PRECISION,
        heartbeat_at DOUBLE PRECISION, available_at DOUBLE PRECISION NOT NULL,
        created_at DOUBLE PRECISION NOT NULL)""",
    "CREATE INDEX {jobs}_queue_idx ON {jobs} (queue, id) WHERE reserved_at IS NULL",
    """CREATE INDEX {jobs}_reserved_idx ON {jobs} (queue, reserved_at)
        WHERE reserved_at IS NOT NULL""",
]


async def _pg_indexes(app: App, table: str) -> set[str]:
    rows = await app.database().fetchall(
        "SELECT indexname FROM pg_indexes WHERE tablename = ?", (table,)
    )
    return {str(r[0]) for r in rows}


async def test_db_migrate_gives_old_postgres_tables_the_due_index(pg_only: str) -> None:
    async with open_app(pg_only, create=False) as (app, table):
        db = app.database()
        for stmt in OLD_PG_SCHEMA:
            await db.execute(stmt.format(jobs=table))
        await db.execute(
            f"INSERT INTO {table} (queue, payload, attempts, available_at, created_at) "
            "VALUES ('default', ?, 0, 1, 1)",
            ('{"v":1,"id":"x1","job":"dbx_due_noop","payload":{"k":"kept"}}',),
        )
        result = await migrate(app)
        assert result.upgraded == [table]
        assert await _pg_indexes(app, table) == {
            f"{table}_pkey",
            f"{table}_due_idx",
            f"{table}_reserved_idx",
            f"{table}_turn_idx",  # and the group columns' indexes (test_sql_groups.py)
            f"{table}_group_turn_idx",
            f"{table}_group_idx",
        }
        assert (await migrate(app)).upgraded == [], "done once"
        job = await app.driver("db").reserve(["default"], 0)
        assert job is not None and job.message.payload == {"k": "kept"}


async def test_tables_created_now_need_no_upgrade(db_url: str) -> None:
    async with open_app(db_url, create=False) as (app, _):
        assert (await migrate(app)).upgraded == []  # no tables: nothing to upgrade
        await ensure_queue_tables(app)
        assert (await migrate(app)).upgraded == []  # the current schema has it all


DUE: dict[str, float] = {}


@define_job(name="dbx_due_record")
async def dbx_due_record(payload: dict[str, Any], job: JobContext) -> None:
    DUE[payload["k"]] = time.time() - payload["due"]


async def test_an_idle_worker_wakes_when_a_delayed_job_comes_due(db_url: str) -> None:
    DUE.clear()
    async with open_app(db_url) as (app, _):
        # polling alone would find the job up to 5 s late (sleep 5 s); the idle wait
        # ends when the next delayed row comes due instead
        worker = Worker(app, "db", ["default"], 1, sleep=5.0)
        worker.start()
        try:
            await asyncio.sleep(0.2)  # the worker is idle, in its 5 s wait
            await dbx_due_record.with_({"k": "a", "due": time.time() + 0.8}).delay(0.8).dispatch()
            began = time.monotonic()
            while "a" not in DUE:
                assert time.monotonic() - began < 4.5, "found by polling, not at its due time"
                await asyncio.sleep(0.02)
        finally:
            await worker.stop()


def _index_reads(plan: dict[str, Any]) -> dict[str, int]:
    """Index name -> index entries a node of ``plan`` returned (a bitmap index scan
    returns every entry in its range, a dead row's too)."""
    reads: dict[str, int] = {}
    if "Index Name" in plan:
        name = plan["Index Name"]
        reads[name] = reads.get(name, 0) + int(plan["Actual Rows"]) * int(plan["Actual Loops"])
    for child in plan.get("Plans", []):
        for name, n in _index_reads(child).items():
            reads[name] = reads.get(name, 0) + n
    return reads


async def test_postgres_claims_do_not_read_the_entries_of_finished_jobs(pg_only: str) -> None:
    """A finished job leaves dead entries in the claim's indexes until VACUUM (never,
    with autovacuum off): a claim that read them would cost more with every job done."""
    async with open_app(pg_only) as (app, _):
        driver: Any = app.driver("db")
        await Queue.bulk([dbx_due_noop.with_({"k": i}) for i in range(2000)])
        jobs = await driver.reserve_many(["default"], 50, 0)
        while jobs:
            _, jobs = await driver.ack_and_claim(jobs, "default", 50)
        await Queue.bulk([dbx_due_noop.with_({"k": i}) for i in range(5)])
        now = time.time()
        # a claim that looks for lapsed leases too (a worker's does, once a second)
        params = (*_branches("default", now, 4, now - 60), now, now)
        rows = await app.database().fetchall(
            f"EXPLAIN (ANALYZE, FORMAT JSON) {driver.sql['claim_many']}", params
        )
        plan = rows[0][0]
        plan = json.loads(plan) if isinstance(plan, str) else plan
        reads = _index_reads(plan[0]["Plan"])
        assert reads, plan
        assert all(n <= 10 for n in reads.values()), reads


def _sqlite_steps(path: Path, sql: str, params: tuple[Any, ...]) -> tuple[list[Any], int]:
    """``sql``'s rows and the SQLite VM instructions it took, in hundreds."""
    import sqlite3

    con = sqlite3.connect(path)
    steps = [0]

    def count() -> int:
        steps[0] += 1
        return 0

    con.set_progress_handler(count, 100)
    try:
        rows = con.execute(sql, params).fetchall()
        con.commit()
    finally:
        con.close()
    return rows, steps[0]


async def test_sqlite_claims_and_acks_do_not_read_the_rows_not_due_yet(tmp_path: Path) -> None:
    """The claim's group branch (due rows of groups whose turn lies ahead) read every
    row not due yet through the turn index, and the ack's (id, reserved_at) IN (VALUES
    ...) scanned the table: 100,000 jobs delayed up to a minute made one worker fall
    a minute behind. Counted in SQLite VM instructions, not time."""
    db = tmp_path / "due.db"
    async with open_app(f"sqlite:///{db}") as (app, table):
        driver: Any = app.driver("db")
        await Queue.bulk([dbx_due_noop.with_({"k": i}).delay(3600) for i in range(20_000)])
        await Queue.bulk([dbx_due_noop.with_({"k": "now"}) for _ in range(2)])
        now = time.time()
        params = (now, now, *_branches("default", now, 8, now - 60))
        rows, steps = _sqlite_steps(db, driver.sql["claim_many"], params)
        assert len(rows) == 2, (table, rows)
        # the bad plan: ~200,000 instructions (2,000 hundreds); the index's: a few hundred
        assert steps < 50, steps
        ack = driver.sql["ack_many"].replace("{pairs}", "(?, ?), (?, ?)")
        pairs = (rows[0][0], rows[0][3], rows[1][0], rows[1][3])
        acked, steps = _sqlite_steps(db, ack, pairs)
        assert sorted(acked) == sorted((r[0],) for r in rows)
        assert steps < 50, steps
