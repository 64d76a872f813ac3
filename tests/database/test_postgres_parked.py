"""The PostgreSQL connector's parked connection: single statements skip the pool's
checkout and return, without changing what a statement, a transaction, a cancellation,
a lost connection or ``close()`` do."""

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


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    psycopg = pytest.importorskip("psycopg")
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
    try:
        yield c
    finally:
        await c.close()


async def _pid(db: PostgresConnector) -> int:
    row = await db.fetchone("SELECT pg_backend_pid()")
    assert row is not None
    return int(row[0])


async def test_sequential_statements_run_on_one_connection(db: PostgresConnector) -> None:
    pids = {await _pid(db) for _ in range(20)}
    assert len(pids) == 1
    # statements at the same time still get pool connections of their own
    rows = await asyncio.gather(
        *(db.fetchone("SELECT pg_backend_pid() FROM pg_sleep(0.05)") for _ in range(4))
    )
    assert len({r[0] for r in rows if r is not None}) == 4
    assert await _pid(db) in pids | {r[0] for r in rows if r is not None}


async def test_transactions_do_not_wait_for_the_parked_connection(pg_url: str) -> None:
    db = _connector(pg_url, pool_size=2)
    try:
        await db.execute("CREATE TABLE parked_tx (id INTEGER PRIMARY KEY)")
        parked = await _pid(db)

        async def insert(i: int) -> None:
            async with db.transaction() as tx:
                await tx.execute("INSERT INTO parked_tx (id) VALUES (?)", (i,))
                await asyncio.sleep(0.05)
                # a single statement inside a transaction's block: the parked connection
                assert await _pid(db) == parked

        await asyncio.wait_for(asyncio.gather(*(insert(i) for i in range(3))), 10)
        assert await db.fetchone("SELECT COUNT(*) FROM parked_tx") == (3,)
    finally:
        await db.close()


async def test_a_pool_of_one_parks_nothing(pg_url: str) -> None:
    db = _connector(pg_url, pool_size=1)
    try:
        assert await db.fetchone("SELECT 1") == (1,)
        assert db._parked is None
        async with asyncio.timeout(10):  # the transaction gets the only connection
            async with db.transaction() as tx:
                assert await tx.fetchone("SELECT 2") == (2,)
    finally:
        await db.close()


async def test_a_failed_statement_keeps_the_connection(db: PostgresConnector) -> None:
    pid = await _pid(db)
    with pytest.raises(Exception, match="nope_no_table"):
        await db.execute("SELECT * FROM nope_no_table")
    assert await _pid(db) == pid


async def test_a_cancelled_statement_does_not_come_back_busy(db: PostgresConnector) -> None:
    await _pid(db)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(db.fetchone("SELECT pg_sleep(5)"), 0.2)
    async with asyncio.timeout(3):  # well before the sleep would have ended
        assert await db.fetchone("SELECT 1") == (1,)
        # the sleeping statement was cancelled or its connection dropped
        rows = await db.fetchall(
            "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(5)' "
            "AND state = 'active' AND datname = current_database()"  # not another run's
        )
    assert rows == [(0,)]


async def test_a_terminated_parked_connection_is_replaced_before_its_next_statement(
    db: PostgresConnector, pg_url: str
) -> None:
    """A parked connection the server closed is found closed when next used and
    replaced: no error while the server is up."""
    pid = await _pid(db)
    other = _connector(pg_url)
    try:
        assert await other.fetchone("SELECT pg_terminate_backend(?)", (pid,)) == (True,)
    finally:
        await other.close()
    await asyncio.sleep(0.1)
    assert await db.fetchone("SELECT 1") == (1,)
    assert await _pid(db) != pid


async def test_close_leaves_no_connection_open(pg_url: str) -> None:
    name = f"haze_parked_{secrets.token_hex(3)}"
    db = _connector(pg_url, options={"application_name": name})
    await asyncio.gather(*(db.fetchone("SELECT pg_sleep(0.02)") for _ in range(3)))
    assert db._parked is not None
    await db.close()
    probe = _connector(pg_url)
    try:
        rows = await probe.fetchall(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = ?", (name,)
        )
    finally:
        await probe.close()
    assert rows == [(0,)]


async def test_the_parked_connection_goes_back_to_the_pool_in_time(
    db: PostgresConnector, monkeypatch: pytest.MonkeyPatch
) -> None:
    import haze.connectors.postgres as pg

    monkeypatch.setattr(pg, "PARK_SECONDS", 0.0)
    await _pid(db)
    assert db._parked is not None
    await asyncio.sleep(0.01)
    await _pid(db)  # its time is up: returned to the pool instead of parked again
    assert db._parked is None
    await _pid(db)
    assert db._parked is not None


async def test_sequential_statements_skip_the_pool(
    db: PostgresConnector, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _pid(db)
    pool = db._pool
    assert pool is not None
    checkouts = 0
    getconn = pool.getconn

    async def counted(timeout: float | None = None) -> Any:
        nonlocal checkouts
        checkouts += 1
        return await getconn(timeout)

    monkeypatch.setattr(pool, "getconn", counted)
    for i in range(10):
        assert await db.fetchone("SELECT ?::int", (i,)) == (i,)
    assert await db.execute("SELECT 1") == 1
    assert checkouts == 0
    async with db.transaction() as tx:  # a transaction still takes a pool connection
        await tx.execute("SELECT 1")
    assert checkouts == 1
