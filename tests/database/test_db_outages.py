"""A database outage is one warning and one recovery line, and an unreachable database is
one line at dispatch.

- PostgreSQL and MariaDB: a real ``haze queue:work`` process reaches the server through
  a TCP proxy (``test_faults.Proxy``) that the test severs while jobs are finishing, so
  their acks fail on dead connections; five seconds later the proxy is back. The
  worker's stderr holds one "is unavailable" warning and one "reachable again" line (which
  counts the jobs whose outcome could not be recorded), no traceback, and nothing from
  psycopg's pool. Every job still ends.
- SQLite: another connection holds the write lock past ``busy_timeout`` while a worker
  acks: the same single warning and recovery line.
- libSQL and D1 on a port nothing listens on: dispatch raises ``DatabaseConnectionError``
  (a ``BackendUnavailableError``) whose message is one line.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import mysql_database, pg_database
from haze import (
    App,
    BackendUnavailableError,
    DatabaseConnectionError,
    Queue,
    define_database_config,
    define_job,
    define_queue_config,
)
from haze._workers.worker import Worker
from haze.connectors.migrations import ensure_queue_tables
from test_faults import Proxy, _free_port, _via, dbx_fault_record, harness

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    yield from pg_database("dbx_out")


@pytest.fixture(scope="session")
def mysql_url() -> Iterator[str]:
    yield from mysql_database("dbx_out")


# --------------------------------------------------------------------------- acks cut off


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["postgres", "mariadb"])
async def test_an_outage_during_acks_is_one_warning_and_one_recovery_line(
    request: pytest.FixtureRequest, kind: str, tmp_path: Path
) -> None:
    url = str(request.getfixturevalue({"postgres": "pg_url", "mariadb": "mysql_url"}[kind]))
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    proxy = Proxy((parts.hostname or "127.0.0.1", parts.port or 0))
    await proxy.start()
    async with harness(url, tmp_path, retry_after="4s") as h:
        keys = {f"k{i}" for i in range(12)}
        await Queue.bulk([dbx_fault_record.with_({"k": k, "sleep": 1.0}) for k in sorted(keys)])
        worker = h.start_worker("--concurrency", "4", url=_via(url, proxy.port))
        try:
            await h.wait_ready(worker)
            deadline = time.monotonic() + 60
            while len(h.counts("start")) < 4:  # four jobs running: their acks come soon
                assert time.monotonic() < deadline, h.log(worker)
                await asyncio.sleep(0.05)
            await proxy.stop()  # every pooled connection is cut; the port refuses
            await asyncio.sleep(5)
            assert worker.poll() is None, h.log(worker)
            await proxy.start()
            await h.wait_ended(keys, within=90, procs=[worker])
            deadline = time.monotonic() + 60
            while await h.table_rows():  # re-runs of unrecorded jobs, then their acks
                assert time.monotonic() < deadline, (await h.table_rows(), h.log(worker))
                await asyncio.sleep(0.1)
            worker.send_signal(signal.SIGTERM)
            assert await h.wait_exit(worker, within=60) == 0, h.log(worker)
        finally:
            await proxy.stop()
        err = h.err(worker)
        warnings = [line for line in err.splitlines() if line.strip()]
        assert "Traceback" not in err, err
        assert "unexpected error" not in err, err
        assert "psycopg" not in err, err
        assert sum("is unavailable" in line for line in warnings) == 1, err
        assert sum("reachable again" in line for line in warnings) == 1, err
        assert len(warnings) == 2, err
        assert await h.failed_rows() == []


# --------------------------------------------------------------------------- SQLite locked


@define_job(name="outage_quick", tries=5)
async def outage_quick(payload: dict[str, Any]) -> None:
    await asyncio.sleep(payload.get("sleep", 0))


async def test_sqlite_locked_past_busy_timeout_during_acks_is_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "queue.db"
    app = App(
        queue=define_queue_config(
            default="db",
            connections={"db": {"driver": "database", "connection": "main", "retry_after": "2s"}},
        ),
        database=define_database_config(
            default="main",
            connections={"main": {"url": f"sqlite:///{path}", "busy_timeout": 100}},
        ),
    )
    caplog.set_level(logging.WARNING)
    async with app:
        await ensure_queue_tables(app)
        await Queue.bulk([outage_quick.with_({"sleep": 0.5}) for _ in range(4)])
        worker = Worker(app, "db", ["default"], concurrency=4, sleep=0.05, max_sleep=0.2)
        worker.start()
        run = asyncio.ensure_future(worker.run())
        deadline = time.monotonic() + 10
        while worker.running < 4:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        locker = sqlite3.connect(path, isolation_level=None)
        locker.execute("BEGIN EXCLUSIVE")  # every write and read waits, then gives up
        await asyncio.sleep(2)
        locker.execute("COMMIT")
        locker.close()
        deadline = time.monotonic() + 30
        while await app.database().fetchall("SELECT id FROM jobs"):
            assert time.monotonic() < deadline, caplog.text
            await asyncio.sleep(0.05)
        await worker.stop()
        await run
    records = [r for r in caplog.records if r.levelno >= logging.WARNING]
    text = "\n".join(r.getMessage() for r in records)
    assert not any(r.exc_info for r in records), caplog.text
    assert "unexpected error" not in text, text
    assert sum("is unavailable" in r.getMessage() for r in records) == 1, text
    assert sum("reachable again" in r.getMessage() for r in records) == 1, text
    assert len(records) == 2, text


# --------------------------------------------------------------------------- HTTP databases


@pytest.mark.parametrize(
    ("url", "options"),
    [
        ("http://127.0.0.1:{port}", {}),
        ("d1://acct/db", {"api_token": "t", "options": {"api_url": "http://127.0.0.1:{port}"}}),
    ],
    ids=["libsql", "d1"],
)
async def test_an_unreachable_http_database_is_one_line_at_dispatch(
    url: str, options: dict[str, Any]
) -> None:
    port = _free_port()
    conn: dict[str, Any] = {"url": url.format(port=port), **options}
    if "options" in conn:
        conn["options"] = {k: v.format(port=port) for k, v in conn["options"].items()}
    app = App(
        queue=define_queue_config(
            default="db", connections={"db": {"driver": "database", "connection": "main"}}
        ),
        database=define_database_config(default="main", connections={"main": conn}),
    )
    async with app:
        with pytest.raises(DatabaseConnectionError) as info:
            await outage_quick.dispatch({})
    assert isinstance(info.value, BackendUnavailableError)
    message = str(info.value)
    assert "\n" not in message and f"127.0.0.1:{port}" in message and "'main'" in message
    assert info.value.__cause__ is None and info.value.__suppress_context__


# --------------------------------------------------------------------------- what an outage is


async def test_postgres_tells_a_lost_server_from_a_failed_statement(pg_url: str) -> None:
    import psycopg

    app = App(
        database=define_database_config(
            default="main",
            connections={
                "main": {"url": pg_url, "options": {"options": "-c statement_timeout=100"}}
            },
        )
    )
    async with app:
        db = app.database()
        with pytest.raises(psycopg.errors.QueryCanceled):  # 57014: a timeout, not an outage
            await db.execute("SELECT pg_sleep(2)")
        with pytest.raises(psycopg.errors.SyntaxError):
            await db.execute("SELEC 1")
        with pytest.raises(DatabaseConnectionError, match="'main'"):  # 57P01: shut down
            await db.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        assert await db.fetchone("SELECT 1") == (1,)  # the pool replaced that connection


async def test_mysql_tells_a_lost_server_from_a_failed_statement(mysql_url: str) -> None:
    import pymysql

    app = App(
        database=define_database_config(default="main", connections={"main": {"url": mysql_url}})
    )
    async with app:
        db = app.database()
        with pytest.raises(pymysql.err.ProgrammingError):
            await db.execute("SELEC 1")
        with pytest.raises(DatabaseConnectionError, match="'main'"):  # our connection killed
            await db.execute("KILL CONNECTION_ID()")
        assert await db.fetchone("SELECT 1") == (1,)
