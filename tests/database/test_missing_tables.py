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


# ------------------------------------------------------------- what counts as "missing"


async def test_only_the_databases_own_missing_table_or_column_error_is_read_as_one(
    app: App,
) -> None:
    """The backend's real errors are told apart by the client's exception classes, not
    by whatever attributes an error carries: a KeyError for row 1146 (MySQL's "no such
    table" code) or an error with an ``sqlstate`` of 42P01 raised by something else is a
    bug to show as it is, not a reason to tell the user to run db:migrate."""
    driver: Any = app.driver("db")
    async with app:
        with pytest.raises(Exception) as no_table:
            await driver.db.fetchall(f"SELECT id FROM {driver.table}")
        with pytest.raises(Exception) as no_column:
            await driver.db.fetchall("SELECT nope FROM (SELECT 1 AS id) AS t")
    assert isinstance(driver._tables_missing_for(no_table.value), QueueTablesMissingError)
    assert isinstance(driver._tables_missing_for(no_column.value), ConfigError)

    class Stray(Exception):
        sqlstate = "42P01"

    class StrayColumn(Exception):
        sqlstate = "42703"

    for look_alike in (KeyError(1146), KeyError(1054), Stray("x"), StrayColumn("x")):
        assert driver._tables_missing_for(look_alike) is None, look_alike
