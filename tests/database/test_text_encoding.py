"""A database whose text encoding cannot hold every character: haze's tables keep
payloads and error messages of any language, so a PostgreSQL database that would fail at
the first emoji is refused when haze first connects, and a MySQL charset other than
utf8mb4 when the connection is built, in one line saying what to do.

SQL_ASCII stores the bytes it is given: with the UTF-8 client haze asks for, any text
goes in and comes back whole. A ``client_encoding`` other than UTF-8 (in the URL or the
connection's options) is refused too: the client could not send such text at all.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from harness import pg_database
from haze import App, ConfigError, Queue, define_database_config, define_job, define_queue_config
from haze._workers.worker import Worker
from haze.connectors.migrations import ensure_queue_tables

TEXT = "café 😀 日本"
SEEN: list[Any] = []


@define_job(name="dbx_encoding_echo")
async def echo(payload: Any) -> None:
    SEEN.append(payload["s"])


def _database(encoding: str) -> Iterator[str]:
    yield from pg_database(f"dbx_enc_{encoding.lower()}", encoding=encoding)


@pytest.fixture
def latin1() -> Iterator[str]:
    yield from _database("LATIN1")


@pytest.fixture
def sql_ascii() -> Iterator[str]:
    yield from _database("SQL_ASCII")


@pytest.fixture
def utf8() -> Iterator[str]:
    yield from _database("UTF8")


@contextlib.asynccontextmanager
async def _app(url: str, **connection: Any) -> AsyncIterator[App]:
    app = App(
        queue=define_queue_config(default="db", connections={"db": {"driver": "database"}}),
        database=define_database_config(
            default="main", connections={"main": {"url": url, **connection}}
        ),
    )
    async with app:
        yield app


async def test_a_latin1_database_is_refused_in_one_line(latin1: str) -> None:
    async with _app(latin1) as app:
        with pytest.raises(ConfigError) as e:
            await ensure_queue_tables(app)
    line = str(e.value)
    assert "\n" not in line and "LATIN1" in line and "UTF8" in line, line


async def test_a_sql_ascii_database_keeps_any_text(sql_ascii: str) -> None:
    SEEN.clear()
    async with _app(sql_ascii) as app:
        await ensure_queue_tables(app)
        await echo.dispatch({"s": TEXT})
        worker = Worker(app, "db", None, 1, stop_when_empty=True)
        await worker.run()
        assert await Queue.size() == 0
    assert SEEN == [TEXT]


@pytest.mark.parametrize("where", ["url", "options"])
async def test_a_client_encoding_other_than_utf8_is_refused(utf8: str, where: str) -> None:
    if where == "url":
        url, extra = f"{utf8}?client_encoding=LATIN1", {}
    else:
        url, extra = utf8, {"options": {"client_encoding": "LATIN1"}}
    with pytest.raises(ConfigError) as e:
        async with _app(url, **extra) as app:
            await ensure_queue_tables(app)
    line = str(e.value)
    assert "\n" not in line and "client_encoding" in line and "LATIN1" in line, line


@pytest.mark.parametrize("where", ["url", "options"])
def test_a_mysql_charset_other_than_utf8mb4_is_refused(where: str) -> None:
    url = "mysql://root@127.0.0.1:3306/haze"
    if where == "url":
        database = {"url": f"{url}?charset=utf8"}
    else:
        database = {"url": url, "options": {"charset": "latin1"}}
    with pytest.raises(ConfigError) as e:
        App(
            queue=define_queue_config(default="db", connections={"db": {"driver": "database"}}),
            database=define_database_config(default="main", connections={"main": database}),
        ).database("main")
    line = str(e.value)
    assert "\n" not in line and "utf8mb4" in line, line
