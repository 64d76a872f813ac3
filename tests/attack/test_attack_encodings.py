"""Attacks on the UTF-8 promise of docs/configuration.md (written from the docs only):

    "haze's tables keep payloads and error messages in any language, so a connection
    talks UTF-8: a PostgreSQL ``client_encoding`` or a MySQL ``charset`` other than UTF-8
    (``utf8mb4`` on MySQL/MariaDB), in the URL or in ``options``, is refused when the
    config is read, and a PostgreSQL database created with another encoding (``LATIN1``,
    ...) when haze first connects to it, each in one line. ``SQL_ASCII`` databases work:
    they keep the UTF-8 bytes as they are."

What held (each is a test below): WIN1252 and EUC_JP databases refused in one line;
SQL_ASCII round trips of 4-byte characters in payloads and failure messages (the
``Queue.failed()`` record); client_encoding slipped in through libpq's ``options``
(``-c client_encoding=LATIN1``, URL and options) and ``ALTER DATABASE ... SET
client_encoding`` (haze's own UTF8 wins); spellings ``utf_8``, ``Unicode``, ``utf-8`` of
client_encoding; ``UTF8MB4`` / ``Utf8Mb4`` charset; a MariaDB database whose default
charset is latin1 (the tables say utf8mb4); ``init_command: SET NAMES latin1``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from atk_harness import mysql_admin
from harness import PG_ADMIN_URL, pg_database
from haze import (
    App,
    ConfigError,
    Queue,
    define_database_config,
    define_job,
    define_queue_config,
)
from haze._workers.worker import Worker
from haze.connectors.migrations import ensure_queue_tables

pytestmark = [pytest.mark.timeout(120)]

TEXT = "café 😀 日本 𝄞"
SEEN: list[Any] = []


@define_job(name="attack5_enc_fail", tries=1)
async def attack5_enc_fail(payload: dict[str, Any]) -> None:
    SEEN.append(payload["s"])
    raise RuntimeError(f"could not send {payload['s']}")


def _pg_database(encoding: str) -> Iterator[str]:
    yield from pg_database(f"attack5_enc_{encoding.lower()}", encoding=encoding)


@pytest.fixture
def pg_utf8() -> Iterator[str]:
    yield from _pg_database("UTF8")


@pytest.fixture
def pg_sql_ascii() -> Iterator[str]:
    yield from _pg_database("SQL_ASCII")


@pytest.fixture
def mysql_latin1() -> Iterator[str]:
    db = f"attack5_enc_latin1_{os.getpid()}"
    with contextlib.closing(mysql_admin()) as c, c.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {db}")
        cur.execute(f"CREATE DATABASE {db} CHARACTER SET latin1")
    yield f"mysql://root@127.0.0.1:3306/{db}"
    with contextlib.closing(mysql_admin()) as c, c.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {db}")


def _app(url: str, **connection: Any) -> App:
    conn = {"driver": "database", "table": "attack5_enc_j", "failed_table": "attack5_enc_f"}
    return App(
        queue=define_queue_config(default="db", connections={"db": conn}),
        database=define_database_config(
            default="main", connections={"main": {"url": url, **connection}}
        ),
    )


@contextlib.asynccontextmanager
async def _open(url: str, **connection: Any) -> AsyncIterator[App]:
    async with _app(url, **connection) as app:
        await ensure_queue_tables(app)
        yield app


async def _round_trip(url: str, **connection: Any) -> None:
    """A payload with 4-byte characters runs, fails, and its failed record keeps both
    the payload and the error message whole."""
    SEEN.clear()
    async with _open(url, **connection) as app:
        await attack5_enc_fail.dispatch({"s": TEXT})
        await Worker(app, "db", None, 1, stop_when_empty=True).run()
        [record] = await Queue.failed()
        assert SEEN == [TEXT]
        assert record.payload == {"s": TEXT}
        assert isinstance(record.exception, str) and f"could not send {TEXT}" in record.exception


@pytest.mark.parametrize("encoding", ["WIN1252", "EUC_JP"])
async def test_a_non_utf8_database_is_refused_in_one_line(encoding: str) -> None:
    for url in _pg_database(encoding):
        with pytest.raises(ConfigError) as e:
            async with _open(url):
                pass
        line = str(e.value)
        assert "\n" not in line and encoding in line, line


async def test_a_database_the_client_cannot_talk_utf8_to_is_refused_as_config() -> None:
    """MULE_INTERNAL: the server refuses the UTF8 client at connect (``conversion between
    UTF8 and MULE_INTERNAL is not supported``). haze said the server may be down
    (``DatabaseConnectionError ... Check that the server is running``), which sends the
    user after the wrong cause; it is the database's encoding, a ConfigError like
    LATIN1's."""
    for url in _pg_database("MULE_INTERNAL"):
        with pytest.raises(ConfigError) as e:
            async with _open(url):
                pass
        line = str(e.value)
        assert "\n" not in line and "MULE_INTERNAL" in line, line


async def test_sql_ascii_keeps_4_byte_characters_in_payloads_and_failures(
    pg_sql_ascii: str,
) -> None:
    await _round_trip(pg_sql_ascii)


@pytest.mark.parametrize(
    ("where", "value"),
    [
        ("url", "options=-c%20client_encoding%3DLATIN1"),
        ("options", "-c client_encoding=LATIN1"),
        ("url", "client_encoding=utf_8"),
        ("url", "client_encoding=Unicode"),
        ("url", "client_encoding=utf-8"),
    ],
)
@pytest.mark.parametrize("database", ["utf8", "sql_ascii"])
async def test_odd_postgres_client_encodings_still_talk_utf8(
    request: pytest.FixtureRequest, database: str, where: str, value: str
) -> None:
    url = str(request.getfixturevalue(f"pg_{database}"))
    if where == "url":
        await _round_trip(f"{url}?{value}")
    else:
        await _round_trip(url, options={"options": value})


async def test_a_database_level_client_encoding_does_not_win(pg_utf8: str) -> None:
    import psycopg

    name = pg_utf8.rsplit("/", 1)[1]
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as c:
        c.execute(f"ALTER DATABASE {name} SET client_encoding = 'LATIN1'")
    await _round_trip(pg_utf8)


@pytest.mark.parametrize("value", [" UTF8", "UTF8 ", "utf8mb4", "'UTF8'"])
def test_near_misses_of_utf8_are_refused_in_one_line(value: str) -> None:
    with pytest.raises(ConfigError) as e:
        _app(PG_ADMIN_URL, options={"client_encoding": value}).database("main")
    assert "\n" not in str(e.value) and "client_encoding" in str(e.value)


@pytest.mark.parametrize("charset", ["UTF8MB4", "Utf8Mb4", "utf_8mb4", "utf-8mb4"])
async def test_every_accepted_mysql_charset_spelling_connects(
    mysql_latin1: str, charset: str
) -> None:
    """The check accepts ``utf_8mb4`` and ``utf-8mb4`` (it drops ``-``/``_`` before
    comparing), but aiomysql knew no such charset and the first statement raised
    ``AttributeError: 'NoneType' object has no attribute 'encoding'``. A spelling the
    check accepts must work."""
    await _round_trip(f"{mysql_latin1}?charset={charset}")


async def test_a_latin1_mariadb_database_keeps_4_byte_characters(mysql_latin1: str) -> None:
    await _round_trip(mysql_latin1)


async def test_set_names_in_init_command_does_not_win(mysql_latin1: str) -> None:
    await _round_trip(mysql_latin1, options={"init_command": "SET NAMES latin1"})


def test_use_unicode_off_is_refused_in_one_line() -> None:
    """``options: {"use_unicode": False}`` made aiomysql return text columns as bytes:
    the failed record's ``exception`` came back as ``bytes`` (``Queue.failed()`` no
    longer gave the error message as text). It is refused like a non-UTF-8 charset."""
    with pytest.raises(ConfigError) as e:
        _app("mysql://root@127.0.0.1:3306/x", options={"use_unicode": False}).database("main")
    assert "\n" not in str(e.value) and "use_unicode" in str(e.value)
