"""The PostgreSQL connector's lean ``execute()``: an autocommit statement with plain
parameters goes straight through libpq, and a caller cannot tell the difference (the
same rowcount, values, psycopg exception classes, outage errors, cancellation, NOTIFY
delivery and pool behaviour as psycopg's cursor)."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from harness import PG_ADMIN_URL
from haze.connectors import connect
from haze.connectors.postgres import PostgresConnector

psycopg = pytest.importorskip("psycopg")


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    try:
        admin = psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as e:
        pytest.skip(f"PostgreSQL at {PG_ADMIN_URL} is not reachable: {e}")
    name = f"haze_test_{secrets.token_hex(4)}"
    with admin:
        admin.execute(f"CREATE DATABASE {name}")
    try:
        yield urlunsplit(urlsplit(PG_ADMIN_URL)._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=3) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _connector(url: str, **options: Any) -> PostgresConnector:
    c = connect("main", {"url": url, **options})
    assert isinstance(c, PostgresConnector)
    return c


@pytest.fixture
async def db(pg_url: str) -> AsyncIterator[PostgresConnector]:
    c = _connector(pg_url)
    table = f"lean_{secrets.token_hex(3)}"
    await c.execute(
        f"CREATE TABLE {table} (id INTEGER PRIMARY KEY, n BIGINT, x DOUBLE PRECISION, "
        "s TEXT, big NUMERIC)"
    )
    c.table = table  # type: ignore[attr-defined]
    try:
        yield c
    finally:
        await c.close()


def _t(db: PostgresConnector) -> str:
    return str(db.table)  # type: ignore[attr-defined]


async def _pid(db: PostgresConnector) -> int:
    row = await db.fetchone("SELECT pg_backend_pid()")
    assert row is not None
    return int(row[0])


async def _prepared(db: PostgresConnector) -> list[str]:
    rows = await db.fetchall("SELECT name FROM pg_prepared_statements ORDER BY name")
    return [str(r[0]) for r in rows]


async def test_values_and_rowcount_are_psycopgs(db: PostgresConnector) -> None:
    t = _t(db)
    sql = f"INSERT INTO {t} (id, n, x, s, big) VALUES (?, ?, ?, ?, ?)"
    rows = [
        (1, 7, 0.1, "plain", 1),
        (2, 70_000, 1733.123456789, "ünïcode ✓ 'quoted' ?", 2**40),
        (3, 2**40, -1e-300, None, 2**70),
        (4, -(2**15), 1e300, "", None),
    ]
    for row in rows:
        assert await db.execute(sql, row) == 1
    got = await db.fetchall(f"SELECT id, n, x, s, big FROM {t} ORDER BY id")
    assert got == [(i, n, x, s, None if b is None else b) for i, n, x, s, b in rows]
    assert await db.execute(f"UPDATE {t} SET s = ? WHERE id > ?", ("u", 1)) == 3
    assert await db.execute(f"DELETE FROM {t} WHERE id = ?", (99,)) == 0
    # the rowcount of a SELECT: its rows (the enqueue's INSERT … SELECT pg_notify); as
    # psycopg does, a statement is prepared after it ran prepare_threshold (5) times
    for _ in range(5):
        assert await db.execute(f"SELECT id FROM {t} WHERE id >= ?", (2,)) == 3
    assert not any(name.startswith("_haze_") for name in await _prepared(db))
    assert await db.execute(f"SELECT id FROM {t} WHERE id >= ?", (2,)) == 3
    assert any(name.startswith("_haze_") for name in await _prepared(db))


async def test_other_parameters_still_go_through_psycopg(db: PostgresConnector) -> None:
    t = _t(db)
    assert await db.execute(f"INSERT INTO {t} (id, s) VALUES (?, ?)", (1, True)) == 1
    assert await db.fetchone(f"SELECT s FROM {t}") == ("true",)
    with pytest.raises(psycopg.DataError, match="NUL"):
        await db.execute(f"INSERT INTO {t} (id, s) VALUES (?, ?)", (2, "a\x00b"))
    assert await db.execute(f"UPDATE {t} SET x = ? WHERE id = ?", (float("inf"), 1)) == 1
    assert await db.fetchone(f"SELECT x FROM {t}") == (float("inf"),)


async def test_server_errors_are_psycopgs_classes_and_keep_the_connection(
    db: PostgresConnector,
) -> None:
    t = _t(db)
    pid = await _pid(db)
    await db.execute(f"INSERT INTO {t} (id) VALUES (?)", (1,))
    with pytest.raises(psycopg.errors.UniqueViolation) as info:
        await db.execute(f"INSERT INTO {t} (id) VALUES (?)", (1,))
    assert info.value.sqlstate == "23505"
    assert info.value.diag.constraint_name == f"{t}_pkey"
    with pytest.raises(psycopg.errors.UndefinedTable, match="no_such_table"):
        await db.execute("INSERT INTO no_such_table (id) VALUES (?)", (1,))
    with pytest.raises(psycopg.errors.InvalidTextRepresentation):
        await db.execute(f"UPDATE {t} SET n = ? WHERE id = 1", ("seven",))
    assert await _pid(db) == pid  # still the same, idle connection
    assert await db.execute(f"INSERT INTO {t} (id) VALUES (?)", (2,)) == 1


async def test_a_statement_the_server_forgot_is_prepared_again(db: PostgresConnector) -> None:
    t = _t(db)
    sql = f"INSERT INTO {t} (id) VALUES (?)"
    for i in range(6):
        await db.execute(sql, (i,))
    assert await _prepared(db)
    await db.execute("DEALLOCATE ALL")  # as psycopg does after a DROP or ALTER
    assert await _prepared(db) == []
    assert await db.execute(sql, (6,)) == 1
    assert await db.fetchone(f"SELECT count(*) FROM {t}") == (7,)
    assert await _prepared(db)


async def test_statements_built_on_the_fly_prepare_a_bounded_number(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import haze.connectors.postgres_lean as lean

    monkeypatch.setattr(lean, "MAX_PREPARED", 3)
    db = _connector(pg_url, options={"prepare_threshold": 0})
    try:
        for i in range(10):
            assert await db.execute(f"SELECT ? + {i}", (1,)) == 1
        assert [n for n in await _prepared(db) if n.startswith("_haze_")] == [
            "_haze_0",
            "_haze_1",
            "_haze_2",
        ]
    finally:
        await db.close()


async def test_prepared_statements_turned_off_prepare_nothing(pg_url: str) -> None:
    # as behind a pooler in transaction mode: options={"prepare_threshold": None}
    db = _connector(pg_url, options={"prepare_threshold": None})
    try:
        await db.execute("CREATE TEMP TABLE t (id INTEGER)")
        for i in range(10):
            assert await db.execute("INSERT INTO t (id) VALUES (?)", (i,)) == 1
        assert await _prepared(db) == []
        assert await db.fetchone("SELECT count(*) FROM t") == (10,)
    finally:
        await db.close()


async def test_a_statement_larger_than_the_socket_buffer(db: PostgresConnector) -> None:
    big = "x" * 3_000_000
    assert await db.execute(f"INSERT INTO {_t(db)} (id, s) VALUES (?, ?)", (1, big)) == 1
    assert await db.fetchone(f"SELECT length(s) FROM {_t(db)}") == (len(big),)


async def test_a_cancelled_statement_does_not_come_back_busy(db: PostgresConnector) -> None:
    await _pid(db)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(db.execute("SELECT pg_sleep(?)", (5.0,)), 0.2)
    async with asyncio.timeout(3):  # well before the sleep would have ended
        assert await db.execute(f"INSERT INTO {_t(db)} (id) VALUES (?)", (1,)) == 1
        rows = await db.fetchall(
            "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep($1)' "
            "AND state = 'active' AND datname = current_database()"
        )
    assert rows == [(0,)]
    pool = db._pool
    assert pool is not None
    # nothing in the pool or parked is in the middle of a statement
    conns = [*pool._pool, *([db._parked[0]] if db._parked else [])]
    assert all(c.pgconn.transaction_status == 0 for c in conns)


async def test_a_terminated_connection_is_replaced_before_its_next_statement(
    db: PostgresConnector, pg_url: str
) -> None:
    """An idle connection the server closed (a restart, a failover, pg_terminate_backend)
    is found closed when next used and replaced: the statement runs on a new one, with no
    error while the server is up."""
    pid = await _pid(db)
    other = _connector(pg_url)
    try:
        assert await other.fetchone("SELECT pg_terminate_backend(?)", (pid,)) == (True,)
    finally:
        await other.close()
    await asyncio.sleep(0.1)
    assert await db.execute(f"INSERT INTO {_t(db)} (id) VALUES (?)", (1,)) == 1
    assert await _pid(db) != pid


async def test_the_notify_in_the_statement_reaches_a_listener(pg_url: str) -> None:
    producer, consumer = _connector(pg_url), _connector(pg_url)
    channel = f"lean_{secrets.token_hex(3)}"
    try:
        await consumer.listen(channel, 0.01)  # the LISTEN is in place
        waiting = asyncio.ensure_future(consumer.listen(channel, 10))
        await asyncio.sleep(0.05)
        assert await producer.execute("SELECT pg_notify(?, ?)", (channel, "q")) == 1
        async with asyncio.timeout(3):
            await waiting
    finally:
        await producer.close()
        await consumer.close()


async def test_other_users_of_the_pool_at_the_same_time(db: PostgresConnector) -> None:
    t = _t(db)

    async def insert(i: int) -> int:
        return await db.execute(f"INSERT INTO {t} (id, s) VALUES (?, ?)", (i, f"v{i}"))

    async def in_transaction(i: int) -> None:
        async with db.transaction() as tx:
            await tx.execute(f"INSERT INTO {t} (id) VALUES (?)", (i,))
            await asyncio.sleep(0.01)

    async with asyncio.timeout(20):
        counts = await asyncio.gather(
            *(insert(i) for i in range(40)), *(in_transaction(100 + i) for i in range(5))
        )
    assert counts[:40] == [1] * 40
    assert await db.fetchone(f"SELECT count(*) FROM {t}") == (45,)


def test_on_uvloop_too(pg_url: str) -> None:
    """The lean wait registers the socket with the running loop: uvloop's as well."""
    uvloop = pytest.importorskip("uvloop")

    async def go() -> None:
        db = _connector(pg_url)
        try:
            await db.execute("CREATE TEMP TABLE u (id INTEGER PRIMARY KEY)")
            for i in range(10):
                assert await db.execute("INSERT INTO u (id) VALUES (?)", (i,)) == 1
            with pytest.raises(psycopg.errors.UniqueViolation):
                await db.execute("INSERT INTO u (id) VALUES (?)", (0,))
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(db.execute("SELECT pg_sleep(?)", (5.0,)), 0.2)
            async with asyncio.timeout(3):
                assert await db.fetchone("SELECT count(*) FROM u") == (10,)
        finally:
            await db.close()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(go())
