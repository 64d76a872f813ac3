"""A PostgreSQL queue table that autovacuum never visits grows without bound (every job
leaves three dead row versions), so:

- the jobs table is created with the autovacuum settings a queue table needs;
- a worker whose table autovacuum will not vacuum (off for the server, or for the table)
  says so under its start line, in real ``haze queue:work`` processes.

The servers here may run with autovacuum on or off; each test reads the server's setting
and checks what haze must say in that case.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import pg_database
from haze import App, define_database_config, define_queue_config
from haze.connectors.migrations import ensure_queue_tables
from haze.contracts.driver import Advises
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
