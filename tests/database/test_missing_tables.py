"""Missing queue tables (``db:migrate`` never ran) are one line telling the user what to run,
on every SQL backend: from dispatch, from the worker (which stops instead of retrying as if
the database were down) and from every admin call the ``queue:*`` commands make."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import BACKENDS, backend_url, mysql_database, pg_database
from haze import (
    App,
    ConfigError,
    QueueTablesMissingError,
    define_database_config,
    define_job,
    define_queue_config,
)
from haze._workers.worker import Worker

MESSAGE = (
    'the queue tables are missing on database "main": run haze make:queue-tables, '
    "then haze db:migrate"
)


@define_job(name="missing_tables_job")
async def job(payload: dict[str, Any]) -> None:
    pass


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    yield from pg_database("dbx_mtb")


@pytest.fixture(scope="module")
def mysql_url() -> Iterator[str]:
    yield from mysql_database("dbx_mtb")


@pytest.fixture(params=BACKENDS)
def app(request: pytest.FixtureRequest, tmp_path: Path) -> App:
    url = backend_url(request, request.param, tmp_path)
    uid = uuid.uuid4().hex[:8]  # the session's sqld is shared: tables no one created
    return App(
        queue=define_queue_config(
            default="db",
            connections={
                "db": {
                    "driver": "database",
                    "table": f"mtb_jobs_{uid}",
                    "failed_table": f"mtb_failed_{uid}",
                    "sleep": "50ms",
                }
            },
        ),
        database=define_database_config(default="main", connections={"main": {"url": url}}),
    )


def _one_line(error: BaseException) -> None:
    assert str(error) == MESSAGE
    # Raised "from None": no database traceback (UndefinedTable, 1146…) printed under it.
    assert error.__suppress_context__


async def test_dispatch_says_to_run_the_migration(app: App) -> None:
    async with app:
        with pytest.raises(QueueTablesMissingError) as info:
            await job.dispatch({})
        _one_line(info.value)
        with pytest.raises(QueueTablesMissingError) as info:
            await app.manager.bulk([job.with_({}), job.with_({})])
        _one_line(info.value)


async def test_the_worker_stops_with_the_error_instead_of_retrying_forever(app: App) -> None:
    async with app:
        worker = Worker(app, "db", ["default"], 2, sleep=0.05, max_sleep=0.1)
        with pytest.raises(QueueTablesMissingError) as info:
            await asyncio.wait_for(worker.run(), 20)
        _one_line(info.value)


async def test_every_admin_call_says_so_too(app: App) -> None:
    m = app.manager
    async with app:
        for call in (
            m.size("default", "db"),
            m.clear("default", "db"),
            m.failed("db"),
            m.failed("db", "default"),
            m.retry(None, connection="db"),
            m.retry(["some-id"], connection="db"),
            m.forget("nope", "db"),
            m.flush("db"),
            m.flush("db", 3600),
        ):
            with pytest.raises(QueueTablesMissingError) as info:
                await call
            _one_line(info.value)


# ------------------------------------------------------------- a table of the same name


async def test_a_jobs_table_of_another_shape_is_one_line_naming_the_table(app: App) -> None:
    """An existing app's own ``jobs`` table (a job board's, a Rails app's) under the name
    the queue uses: the claim's missing column is not an outage ("never reachable, start
    the server") but one line saying to give the queue tables other names."""
    driver: Any = app.driver("db")
    async with app:
        await driver.db.execute(f"CREATE TABLE {driver.table} (id INTEGER PRIMARY KEY, title TEXT)")
        await driver.db.execute(
            f"CREATE TABLE {driver.failed_table} (id INTEGER PRIMARY KEY, title TEXT)"
        )
        with pytest.raises(ConfigError) as info:
            await job.dispatch({})
        _not_ours(info.value, driver.table)
        worker = Worker(app, "db", ["default"], 2, sleep=0.05, max_sleep=0.1)
        with pytest.raises(ConfigError) as info:
            await asyncio.wait_for(worker.run(), 20)
        _not_ours(info.value, driver.table)
        with pytest.raises(ConfigError) as info:
            await app.manager.size("default", "db")
        _not_ours(info.value, driver.table)


def _not_ours(error: BaseException, table: str) -> None:
    message = str(error)
    assert f'table "{table}" on database "main" is not a haze queue table' in message, message
    assert 'set "table" and "failed_table"' in message, message
    assert "\n" not in message, message
    assert error.__suppress_context__
