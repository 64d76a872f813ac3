"""A PostgreSQL queue table that autovacuum never visits grows without bound (every job
leaves three dead row versions), so:

- the jobs table is created with the autovacuum settings a queue table needs;
- a worker whose table autovacuum will not vacuum (off for the server, or for the table)
  says so under its start line, in real ``haze queue:work`` processes.

The servers here may run with autovacuum on or off; each test reads the server's setting
and checks what haze must say in that case.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import pg_database
from haze import App, define_database_config, define_queue_config
from haze.connectors.migrations import ensure_queue_tables
from haze.contracts.driver import Advises
from haze.drivers.sql import DatabaseDriver
from worker_procs import WorkerProcs

pytestmark = [pytest.mark.timeout(120)]

APP = Path(__file__).parent / "apps" / "batch"


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    yield from pg_database("dbx_vac")


def _app(url: str, table: str) -> App:
    conn = {"driver": "database", "connection": "main", "table": table}
    conn["failed_table"] = f"{table}_failed"
    return App(
        queue=define_queue_config(default="db", connections={"db": conn}),
        database=define_database_config(default="main", connections={"main": {"url": url}}),
    )


async def test_the_jobs_table_is_created_with_queue_autovacuum_settings(pg_url: str) -> None:
    async with _app(pg_url, "vac_settings") as app:
        await ensure_queue_tables(app)
        row = await app.database().fetchone(
            "SELECT reloptions FROM pg_class WHERE oid = to_regclass(?)", ("vac_settings",)
        )
        assert row is not None
        options = set(row[0])
        assert "autovacuum_vacuum_scale_factor=0" in options, options
        assert "autovacuum_vacuum_threshold=5000" in options, options
        assert "autovacuum_vacuum_cost_delay=0" in options, options


async def test_advice_names_autovacuum_off_for_the_server_or_the_table(pg_url: str) -> None:
    async with _app(pg_url, "vac_advice") as app:
        await ensure_queue_tables(app)
        driver = app.driver("db")
        assert isinstance(driver, Advises)
        db = app.database()
        server_on = (await db.fetchone("SELECT current_setting('autovacuum')", ()))[0] == "on"
        lines = await driver.advice()
        if server_on:
            assert lines == []
        else:
            assert len(lines) == 1 and "autovacuum is off on this server" in lines[0], lines
        await db.execute("ALTER TABLE vac_advice SET (autovacuum_enabled = false)")
        lines = await driver.advice()
        assert len(lines) == 1, lines
        where = 'for the "vac_advice" table' if server_on else "on this server"
        assert f"autovacuum is off {where}" in lines[0], lines
        assert "'vac_advice'" in lines[0] and "VACUUM" in lines[0], lines


async def test_no_advice_before_the_tables_exist_or_off_postgres(
    pg_url: str, tmp_path: Path
) -> None:
    async with _app(pg_url, "vac_missing") as app:
        driver = app.driver("db")
        assert isinstance(driver, Advises)
        # No such table yet: nothing to say (to_regclass is NULL), and no error.
        assert await driver.advice() == []
    async with _app(f"sqlite:///{tmp_path / 'q.db'}", "jobs") as app:
        driver = app.driver("db")
        assert isinstance(driver, Advises)
        await ensure_queue_tables(app)
        assert await driver.advice() == []


async def test_queue_work_warns_when_its_table_is_never_vacuumed(
    pg_url: str, tmp_path: Path
) -> None:
    async with _app(pg_url, "vac_proc") as app:
        await ensure_queue_tables(app)
        await app.database().execute("ALTER TABLE vac_proc SET (autovacuum_enabled = false)")
    procs = WorkerProcs(tmp_path, APP)
    env = dict(os.environ)
    env.update(DBX_DB_URL=pg_url, DBX_TABLE="vac_proc", DBX_FAILED_TABLE="vac_proc_failed")
    env.pop("PYTEST_CURRENT_TEST", None)
    worker = procs.spawn("db", "default", [], env)
    try:
        await procs.wait_ready(worker)
        worker.send_signal(signal.SIGTERM)
        assert await procs.wait_exit(worker) == 0, procs.log(worker)
    finally:
        procs.kill_all()
    text = procs.out(worker) + procs.err(worker)
    warned = [line for line in text.splitlines() if "autovacuum is off" in line]
    assert len(warned) == 1, procs.log(worker)
    assert "'vac_proc'" in warned[0] and "Traceback" not in text, procs.log(worker)


# --------------------------------------------------------------- the worker's own VACUUM
#
# With autovacuum off, every claim starts at the head of the due index and steps over
# the dead entries of the jobs done since the last VACUUM: a backlog gets slower with
# every job. A worker then vacuums its table itself (one process at a time, at most
# every few seconds, when enough dead rows piled up); ``vacuum: False`` opts out.


def _dead_rows(url: str, table: str, n: int) -> None:
    """``n`` dead rows in ``table``, counted in pg_stat_user_tables at once."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as c:
        c.execute(
            f"INSERT INTO {table} (queue, payload, attempts, available_at, created_at, turn) "
            "SELECT 'other', '{}', 0, 0, 0, 0 FROM generate_series(1, %s)",
            (n,),
        )
        c.execute(f"DELETE FROM {table}")
        c.execute("SELECT pg_stat_force_next_flush()")
        c.execute("SELECT 1")  # the flush happens when the session goes idle


def _vacuums(url: str, table: str) -> tuple[int, int]:
    """(vacuum_count, n_dead_tup) of ``table``."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as c:
        row = c.execute(
            "SELECT vacuum_count, n_dead_tup FROM pg_stat_user_tables WHERE relname = %s",
            (table,),
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _vac_app(url: str, table: str, **extra: object) -> App:
    conn: dict[str, object] = {"driver": "database", "connection": "main", "table": table}
    conn.update(failed_table=f"{table}_failed", **extra)
    return App(
        queue=define_queue_config(default="db", connections={"db": conn}),
        database=define_database_config(default="main", connections={"main": {"url": url}}),
    )


async def test_a_worker_vacuums_its_table_when_autovacuum_will_not(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with _vac_app(pg_url, "vac_self") as app:
        await ensure_queue_tables(app)
        await app.database().execute("ALTER TABLE vac_self SET (autovacuum_enabled = false)")
        driver = app.driver("db")
        assert isinstance(driver, DatabaseDriver)
        _dead_rows(pg_url, "vac_self", 100)
        # Few dead rows: not worth a VACUUM yet.
        assert await driver.maintain() is False
        assert _vacuums(pg_url, "vac_self")[0] == 0
        _dead_rows(pg_url, "vac_self", 6000)
        assert _vacuums(pg_url, "vac_self")[1] >= 6000
        with caplog.at_level(logging.INFO, logger="haze"):
            # The claim path runs it (in the background, once per check interval).
            assert await driver.reserve_many(["default"], 1, 0.0) == []
            for _ in range(100):
                if _vacuums(pg_url, "vac_self")[0] >= 1:
                    break
                await asyncio.sleep(0.05)
            assert _vacuums(pg_url, "vac_self")[0] == 1
            _dead_rows(pg_url, "vac_self", 6000)
            # Checked at most once per interval: the next claim does not look again.
            assert await driver.reserve_many(["default"], 1, 0.0) == []
            await asyncio.sleep(0.3)
            assert _vacuums(pg_url, "vac_self")[0] == 1
            # Called directly (no interval), it vacuums again: logged once only.
            assert await driver.maintain() is True
        assert _vacuums(pg_url, "vac_self")[0] == 2
        said = [r.getMessage() for r in caplog.records if "VACUUM" in r.getMessage()]
        assert len(said) == 1 and "'vac_self'" in said[0] and "vacuum" in said[0], said


async def test_one_process_vacuums_at_a_time_and_the_option_turns_it_off(pg_url: str) -> None:
    import psycopg

    async with _vac_app(pg_url, "vac_lock") as app:
        await ensure_queue_tables(app)
        await app.database().execute("ALTER TABLE vac_lock SET (autovacuum_enabled = false)")
        driver = app.driver("db")
        assert isinstance(driver, DatabaseDriver)
        _dead_rows(pg_url, "vac_lock", 6000)
        with psycopg.connect(pg_url, autocommit=True) as other:
            # Another worker is vacuuming the table (it holds the table's lock).
            other.execute("SELECT pg_advisory_lock(hashtext('haze_vacuum:' || 'vac_lock'))")
            assert await driver.maintain() is False
            other.execute("SELECT pg_advisory_unlock_all()")
        assert _vacuums(pg_url, "vac_lock")[0] == 0
    async with _vac_app(pg_url, "vac_lock", vacuum=False) as app:
        driver = app.driver("db")
        assert isinstance(driver, DatabaseDriver)
        assert await driver.maintain() is False
        assert await driver.reserve_many(["default"], 1, 0.0) == []
        await asyncio.sleep(0.3)
    assert _vacuums(pg_url, "vac_lock")[0] == 0
