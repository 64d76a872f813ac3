"""Tenant groups on the database driver, on every SQL backend: workers take a queue's
groups in turn, group names compare exactly, and ``haze db:migrate`` gives tables made
before groups their columns. Rows without a group keep their due order
(``test_due_order.py``). No speed is asserted: ``bench/groups.py`` measures the cost.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import BACKENDS, backend_url, mysql_database, pg_database
from haze import App, JobContext, Queue, define_database_config, define_job, define_queue_config
from haze._base.errors import QueueTablesMissingError
from haze._workers.worker import Worker
from haze.connectors.migrations import ensure_queue_tables, migrate
from haze.dashboard._data import overview

pytestmark = pytest.mark.timeout(120)

_names = itertools.count()
#: (tenant, k) in the order the jobs started: the jobs' own records
STARTED: list[tuple[str, int]] = []


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    yield from pg_database("dbx_groups")


@pytest.fixture(scope="session")
def mysql_url() -> Iterator[str]:
    yield from mysql_database("dbx_groups")


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return backend_url(request, request.param, tmp_path)


@define_job(name="dbx_groups_job", group=lambda payload: payload["tenant"])
async def dbx_groups_job(payload: dict[str, Any], job: JobContext) -> None:
    STARTED.append((payload["tenant"], payload["k"]))


RUNNING: dict[str, int] = {}
PEAK: dict[str, int] = {}


@define_job(name="dbx_groups_slow", group=lambda payload: payload["tenant"])
async def dbx_groups_slow(payload: dict[str, Any], job: JobContext) -> None:
    tenant = payload["tenant"]
    RUNNING[tenant] = RUNNING.get(tenant, 0) + 1
    PEAK[tenant] = max(PEAK.get(tenant, 0), RUNNING[tenant])
    STARTED.append((tenant, payload["k"]))
    try:
        await asyncio.sleep(0.15)
    finally:
        RUNNING[tenant] -= 1


@contextlib.asynccontextmanager
async def open_app(
    db_url: str, create: bool = True, groups: dict[str, Any] | None = None
) -> AsyncIterator[tuple[App, str]]:
    n = next(_names)
    jobs, failed = f"dbx_grp_{os.getpid()}_{n}", f"dbx_grpf_{os.getpid()}_{n}"
    conn: dict[str, Any] = {
        "driver": "database",
        "connection": "main",
        "table": jobs,
        "failed_table": failed,
    }
    if groups is not None:
        conn["groups"] = groups
    app = App(
        queue=define_queue_config(default="db", connections={"db": conn}),
        database=define_database_config(default="main", connections={"main": {"url": db_url}}),
    )
    async with app:
        if create:
            await ensure_queue_tables(app)
        try:
            yield app, jobs
        finally:
            with contextlib.suppress(Exception):
                await app.database().execute(f"DROP TABLE IF EXISTS {jobs}")
                await app.database().execute(f"DROP TABLE IF EXISTS {failed}")


def _jobs(tenant: str, n: int) -> list[Any]:
    return [dbx_groups_job.with_({"tenant": tenant, "k": i}) for i in range(n)]


async def _claim_all(driver: Any, batch: int) -> list[tuple[str, int]]:
    order: list[tuple[str, int]] = []
    while jobs := await driver.reserve_many(["default"], batch, 0):
        order += [(j.message.payload["tenant"], j.message.payload["k"]) for j in jobs]
        await driver.ack_many(jobs)
    return order


async def test_claims_take_the_groups_in_turn(db_url: str) -> None:
    async with open_app(db_url) as (app, _):
        driver: Any = app.driver("db")
        await Queue.bulk(_jobs("A", 300))  # one tenant's backlog first ...
        for tenant in "BCDE":  # ... then four tenants with three jobs each, one by one
            for job in _jobs(tenant, 3):
                await job.dispatch()
        await dbx_groups_job.with_({"tenant": "F", "k": 0}).delay(3600).dispatch()
        order = await _claim_all(driver, 4)
        assert len(order) == 312 and ("F", 0) not in order  # not due: not claimed
        last_small = max(i for i, (t, _) in enumerate(order) if t != "A")
        # round-robin: A's turn comes once per round, so the small tenants are done within
        # their three rounds (5 groups a round), not after A's 300
        assert last_small < 15, order[:20]
        for tenant in "ABCDE":  # each group in its own order
            ks = [k for t, k in order if t == tenant]
            assert ks == sorted(ks)


async def test_a_group_back_from_idle_starts_at_the_head(db_url: str) -> None:
    async with open_app(db_url) as (app, _):
        driver: Any = app.driver("db")
        await Queue.bulk(_jobs("B", 5))
        await Queue.bulk(_jobs("A", 200))
        assert [t for t, _ in await _claim_all_n(driver, 30)].count("B") == 5
        # B's old turns are spent; its new job does not wait behind A's remaining 175
        await dbx_groups_job.dispatch({"tenant": "B", "k": 99})
        jobs = await driver.reserve_many(["default"], 2, 0)
        assert ("B", 99) in [(j.message.payload["tenant"], j.message.payload["k"]) for j in jobs]


async def _claim_all_n(driver: Any, n: int) -> list[tuple[str, int]]:
    jobs = await driver.reserve_many(["default"], n, 0)
    await driver.ack_many(jobs)
    return [(j.message.payload["tenant"], j.message.payload["k"]) for j in jobs]


async def test_group_names_compare_exactly(db_url: str) -> None:
    # MariaDB's default collation once made `Tenant` and `tenant` one name.
    async with open_app(db_url) as (app, _):
        driver: Any = app.driver("db")
        await Queue.bulk(_jobs("Tenant", 20))
        await dbx_groups_job.dispatch({"tenant": "tenant", "k": 0})
        await dbx_groups_job.dispatch({"tenant": "tenant ", "k": 0})
        first = await _claim_all_n(driver, 3)
        assert sorted(t for t, _ in first) == ["Tenant", "tenant", "tenant "]


async def test_a_released_row_of_a_group_goes_behind_its_group(db_url: str) -> None:
    async with open_app(db_url) as (app, _):
        driver: Any = app.driver("db")
        await Queue.bulk(_jobs("A", 3))
        [job] = await driver.reserve_many(["default"], 1, 0)
        assert await driver.release(job, 0, consume_attempt=False)
        order = await _claim_all(driver, 1)
        assert order == [("A", 1), ("A", 2), ("A", 0)]


#: The jobs table as haze created it before groups (the dialect's own types).
OLD_TABLE = {
    "postgres": "CREATE TABLE {jobs} (id BIGSERIAL PRIMARY KEY, queue TEXT NOT NULL, "
    "payload TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, reserved_at DOUBLE "
    "PRECISION, heartbeat_at DOUBLE PRECISION, available_at DOUBLE PRECISION NOT NULL, "
    "created_at DOUBLE PRECISION NOT NULL)",
    "mysql": "CREATE TABLE {jobs} (id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY, "
    "queue VARCHAR(255) NOT NULL, payload LONGTEXT NOT NULL, attempts INT UNSIGNED NOT NULL "
    "DEFAULT 0, reserved_at DOUBLE NULL, heartbeat_at DOUBLE NULL, available_at DOUBLE NOT "
    "NULL, created_at DOUBLE NOT NULL, INDEX {jobs}_queue_idx (queue, reserved_at, "
    "available_at)) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 "
    "/*M! COLLATE=utf8mb4_nopad_bin */ /*!80000 COLLATE=utf8mb4_0900_bin */",
    "sqlite": "CREATE TABLE {jobs} (id INTEGER PRIMARY KEY AUTOINCREMENT, queue TEXT NOT "
    "NULL, payload TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, reserved_at REAL, "
    "heartbeat_at REAL, available_at REAL NOT NULL, created_at REAL NOT NULL)",
}


async def test_db_migrate_gives_old_tables_the_group_columns(db_url: str) -> None:
    async with open_app(db_url, create=False) as (app, table):
        db = app.database()
        await db.execute(OLD_TABLE.get(db.dialect, OLD_TABLE["sqlite"]).format(jobs=table))
        await db.execute(
            f"INSERT INTO {table} (queue, payload, attempts, available_at, created_at) "
            "VALUES ('default', ?, 0, 1, 1)",
            ('{"v":1,"id":"x1","job":"dbx_groups_job","payload":{"tenant":"O","k":0}}',),
        )
        with pytest.raises(QueueTablesMissingError, match=r"earlier haze.*db:migrate") as e:
            await dbx_groups_job.dispatch({"tenant": "A", "k": 0})
        assert "\n" not in str(e.value)
        result = await migrate(app)
        assert table in result.upgraded
        assert table not in (await migrate(app)).upgraded, "done once"
        await Queue.bulk(_jobs("A", 3))
        order = await _claim_all(app.driver("db"), 2)
        assert order[0] == ("O", 0) and sorted(order[1:]) == [("A", 0), ("A", 1), ("A", 2)]


async def test_the_dashboard_shows_the_backlog_per_group(db_url: str) -> None:
    async with open_app(db_url) as (app, _):
        await Queue.bulk(_jobs("A", 30))
        await Queue.bulk(_jobs("B", 3))
        await Queue.bulk(_jobs("b", 5))
        await dbx_groups_job.with_({"tenant": "-", "k": 0}).dispatch()
        [_claimed] = await app.driver("db").reserve_many(["default"], 1, 0)  # not queued now
        rows = await overview(app)
        [row] = [r for r in rows if r.queue == "default"]
        assert row.groups == [("A", 29), ("b", 5), ("B", 3), ("-", 1)]


# --------------------------------------------------------------------------- limits


async def _drain(app: App, until: Any, concurrency: int = 8, limit: float = 20.0) -> None:
    worker = Worker(app, "db", ["default"], concurrency, sleep=0.05)
    run = asyncio.ensure_future(worker.run())
    try:
        async with asyncio.timeout(limit):
            while not until():
                await asyncio.sleep(0.02)
    finally:
        await worker.stop()
        await asyncio.gather(run, return_exceptions=True)


async def test_the_group_concurrency_limit_holds_per_group(tmp_path: Path) -> None:
    STARTED.clear()
    PEAK.clear()
    async with open_app(f"sqlite:///{tmp_path}/q.db", groups={"concurrency": 2}) as (app, _):
        for tenant in ("g", "h"):
            await Queue.bulk([dbx_groups_slow.with_({"tenant": tenant, "k": i}) for i in range(8)])
        await dbx_groups_slow.with_({"tenant": "-", "k": 0}).in_group("g").dispatch()
        await _drain(app, lambda: len(STARTED) == 17)
    # each group at most 2 at once, and 2 did run at once (8 worker slots, 2 groups)
    assert PEAK["g"] == 2 and PEAK["h"] == 2
    assert sorted(k for t, k in STARTED if t == "g") == list(range(8))


async def test_the_group_rate_limit_holds_per_group(tmp_path: Path) -> None:
    STARTED.clear()
    async with open_app(f"sqlite:///{tmp_path}/q.db", groups={"rate": "3/d"}) as (app, _):
        await Queue.bulk([dbx_groups_job.with_({"tenant": "r", "k": i}) for i in range(6)])
        await Queue.bulk([dbx_groups_job.with_({"tenant": "s", "k": i}) for i in range(2)])
        await _drain(app, lambda: len(STARTED) >= 5)
        await asyncio.sleep(0.5)  # the other three of "r" wait for tomorrow's window
        assert sorted(t for t, _ in STARTED) == ["r", "r", "r", "s", "s"]
        assert await Queue.size("default") == 3  # released, not lost


# --------------------------------------------------------------------------- fairness


@pytest.fixture
def pg_only(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue("pg_url"))


async def test_ten_thousand_jobs_of_one_tenant_starve_no_other(pg_only: str) -> None:
    """Tenant A has 10,000 queued jobs, B–E 10 each, and 2 workers drain the queue:
    every job of B–E starts before A's 200th (the order the jobs themselves recorded)."""
    STARTED.clear()
    async with open_app(pg_only) as (app, _):
        await Queue.bulk(_jobs("A", 10_000))
        for tenant in "BCDE":
            await Queue.bulk(_jobs(tenant, 10))
        workers = [Worker(app, "db", ["default"], 1, sleep=0.05) for _ in range(2)]
        runs = [asyncio.ensure_future(w.run()) for w in workers]
        try:
            while sum(t != "A" for t, _ in STARTED) < 40 or len(STARTED) < 250:
                await asyncio.sleep(0.05)
        finally:
            for w in workers:
                await w.stop()
            await asyncio.gather(*runs, return_exceptions=True)
        a_200th = [i for i, (t, _) in enumerate(STARTED) if t == "A"][199]
        others = [i for i, (t, _) in enumerate(STARTED) if t != "A"]
        assert len(others) == 40 and max(others) < a_200th


@define_job(name="dbx_groups_plain")
async def dbx_groups_plain(payload: dict[str, Any], job: JobContext) -> None:
    STARTED.append(("", payload["k"]))


async def test_a_postgres_dispatch_is_one_statement_and_only_a_grouped_one_reads_first(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job without a group costs one round trip (the INSERT and its NOTIFY, autocommit):
    no table check, no turn read; a grouped job reads its group's last turn first."""
    import psycopg

    sent: list[str] = []
    execute = psycopg.AsyncCursor.execute

    from haze.connectors.postgres_lean import LeanStatements

    lean = LeanStatements.execute

    async def spy(self: Any, query: Any, params: Any = None, **kw: Any) -> Any:
        sent.append(str(query))
        return await execute(self, query, params, **kw)

    async def lean_spy(self: Any, conn: Any, sql: str, params: Any) -> Any:
        n = await lean(self, conn, sql, params)
        if n is not None:  # else it goes on to the cursor, which the other spy sees
            sent.append(sql)
        return n

    async with open_app(pg_url) as (_app, table):
        await dbx_groups_plain.dispatch({"k": 0})  # the first one opens the pool
        monkeypatch.setattr(psycopg.AsyncCursor, "execute", spy)
        monkeypatch.setattr(LeanStatements, "execute", lean_spy)
        for k in range(1, 6):
            await dbx_groups_plain.dispatch({"k": k})
        assert len(sent) == 5, sent
        assert all(f"INSERT INTO {table}" in q and "pg_notify" in q for q in sent), sent
        sent.clear()
        await dbx_groups_job.dispatch({"tenant": "a", "k": 0})
        assert len(sent) == 2 and f"INSERT INTO {table}" in sent[1], sent
