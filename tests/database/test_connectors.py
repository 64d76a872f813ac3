"""SQL connectors against real servers: SQLite, PostgreSQL and MariaDB/MySQL.

Every test parametrised over ``backend`` runs the same code on each connector. The
PostgreSQL and MariaDB backends each get one freshly created database for the test
session (dropped at the end); tests use unique table names inside it. A server that
cannot be reached skips its backend, unless ``CI=true`` (then the tests fail).

Servers (override with env): ``HAZE_TEST_POSTGRES_URL`` (default
``postgresql://postgres@127.0.0.1:5432/postgres``), ``HAZE_TEST_MYSQL_URL`` (default
``mysql://root@127.0.0.1:3306/``). The URL's database is only used to create the test
database.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import secrets
import sys
import time
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import haze.connectors.migrations as migrations
import pytest
from harness import MYSQL_ADMIN_URL, PG_ADMIN_URL
from haze import (
    App,
    ConfigError,
    JobContext,
    MissingDependencyError,
    Queue,
    define_database_config,
    define_job,
    define_queue_config,
    run_in_app,
)
from haze._base.sqlfiles import queue_schema, queue_sql
from haze._workers.worker import Worker
from haze.connectors import Connector, Session, connect
from haze.connectors.postgres import DatabaseConnectionError, translate_placeholders

CI = os.environ.get("CI", "").strip().lower() == "true"

BACKENDS = ["sqlite", "postgres", "mariadb"]


def _with_db(url: str, db: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{db}"))


def _unreachable(what: str, error: BaseException) -> None:
    message = f"{what} is not reachable: {error}"
    if CI:
        pytest.fail(f"{message} (CI=true: the server is required)")
    pytest.skip(message)


# --------------------------------------------------------------------------- servers


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A fresh database ``haze_test_<random>`` on the PostgreSQL server."""
    psycopg = pytest.importorskip("psycopg")
    try:
        admin = psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as e:
        _unreachable(f"PostgreSQL at {PG_ADMIN_URL}", e)
    name = f"haze_test_{secrets.token_hex(4)}"
    with admin:
        admin.execute(f"CREATE DATABASE {name}")
    try:
        yield _with_db(PG_ADMIN_URL, name)
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=3) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(scope="session")
def mariadb_url() -> Iterator[str]:
    """A fresh database ``haze_test_<random>`` on the MariaDB/MySQL server."""
    pymysql = pytest.importorskip("pymysql")
    parts = urlsplit(MYSQL_ADMIN_URL)
    params = {
        "host": parts.hostname or "127.0.0.1",
        "port": parts.port or 3306,
        "user": parts.username or "root",
        "password": parts.password or "",
        "connect_timeout": 3,
        "autocommit": True,
    }
    try:
        admin = pymysql.connect(**params)
    except pymysql.err.OperationalError as e:
        _unreachable(f"MySQL/MariaDB at {MYSQL_ADMIN_URL}", e)
    name = f"haze_test_{secrets.token_hex(4)}"
    with admin.cursor() as cur:
        cur.execute(f"CREATE DATABASE {name} CHARACTER SET utf8mb4")
    admin.close()
    try:
        yield _with_db(MYSQL_ADMIN_URL, name)
    finally:
        admin = pymysql.connect(**params)
        with admin.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.close()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'app.db'}"  # absolute: sqlite:////tmp/...
    return str(request.getfixturevalue(f"{backend}_url"))


@pytest.fixture
async def db(url: str) -> AsyncIterator[Connector]:
    c = connect("main", {"url": url})
    try:
        yield c
    finally:
        await c.close()


@pytest.fixture
def table() -> str:
    return f"dbc_{secrets.token_hex(4)}"


# --------------------------------------------------------------------------- connectors


def test_connect_picks_the_backend() -> None:
    from haze.connectors.mysql import MySQLConnector
    from haze.connectors.postgres import PostgresConnector

    for u in ("postgresql://u@h/db", "postgres://u@h/db", "postgresql+psycopg://u@h/db"):
        c = connect("main", {"url": u})
        assert isinstance(c, PostgresConnector)
        assert c.dialect == "postgres"
        assert c.conninfo == "postgresql://u@h/db"
    for u in ("mysql://root@127.0.0.1:3306/db", "mariadb://root@h/db"):
        c = connect("main", {"url": u, "pool_size": 3})
        assert isinstance(c, MySQLConnector)
        assert c.dialect == "mysql"
        assert c.pool_size == 3


def test_placeholder_translation() -> None:
    assert translate_placeholders("SELECT ? FROM t WHERE a = ?") == "SELECT %s FROM t WHERE a = %s"
    assert translate_placeholders("SELECT '?', ? -- what?\n") == "SELECT '?', %s -- what?\n"
    assert translate_placeholders("SELECT 'a%', ?") == "SELECT 'a%%', %s"
    assert translate_placeholders('SELECT "x?" FROM t') == 'SELECT "x?" FROM t'
    assert translate_placeholders("SELECT 'it\\'s ?', ?", "mysql") == "SELECT 'it\\'s ?', %s"
    assert translate_placeholders("SELECT `a?` # ?\n, ?", "mysql") == "SELECT `a?` # ?\n, %s"


@pytest.mark.parametrize(
    ("module", "cls", "url", "extra", "package"),
    [
        ("psycopg", "PostgresConnector", "postgresql://u@h/db", "postgres", "psycopg"),
        ("aiomysql", "MySQLConnector", "mysql://u@h/db", "mysql", "aiomysql"),
    ],
)
def test_missing_client_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, module: str, cls: str, url: str, extra: str, package: str
) -> None:
    import haze.connectors.mysql
    import haze.connectors.postgres

    monkeypatch.setitem(sys.modules, module, None)
    mod = haze.connectors.postgres if extra == "postgres" else haze.connectors.mysql
    with pytest.raises(MissingDependencyError) as info:
        getattr(mod, cls)("main", {"url": url})
    assert info.value.extra == extra
    assert f"'{package}'" in str(info.value)
    assert f"haze-jobs[{extra}]" in str(info.value) or f"runtime[{extra}]" in str(info.value)


@pytest.mark.parametrize(
    ("url", "option", "hint"),
    [
        ("mysql://root@127.0.0.1:3306/test", "timeout", "connect_timeout"),
        ("mysql://root@127.0.0.1:3306/test", "no_such_thing", None),
        ("postgresql://postgres@127.0.0.1:5432/postgres", "timeout", "connect_timeout"),
        ("postgresql://postgres@127.0.0.1:5432/postgres", "no_such_thing", None),
    ],
)
def test_an_unknown_client_option_is_one_line_naming_it(
    url: str, option: str, hint: str | None
) -> None:
    """``options`` go to the client's connect(): a key it does not take was the client's
    own TypeError / ProgrammingError, raised at the first statement."""
    with pytest.raises(ConfigError) as info:
        connect("main", {"url": url, "options": {option: 5}})
    message = str(info.value)
    assert f"connections.main.options.{option}" in message
    assert "\n" not in message
    if hint:
        assert f"did you mean {hint!r}" in message


@pytest.mark.parametrize(
    "url",
    ["postgresql://postgres:s3cr3t@127.0.0.1:1/haze_x", "mysql://root:s3cr3t@127.0.0.1:1/haze_x"],
)
async def test_unreachable_server_names_connection_and_url(url: str) -> None:
    c = connect("reports", {"url": url})
    try:
        with pytest.raises(DatabaseConnectionError) as info:
            await c.fetchone("SELECT 1")
    finally:
        await c.close()
    text = str(info.value)
    for part in ("'reports'", "127.0.0.1:1", "haze_x", "***", "Check that the server"):
        assert part in text
    assert "s3cr3t" not in text
    assert isinstance(info.value, ConnectionError)


async def test_statements(db: Connector, table: str) -> None:
    assert isinstance(db, Connector)
    await db.execute(
        f"CREATE TABLE {table} (id INTEGER PRIMARY KEY, name VARCHAR(50), score DOUBLE PRECISION)"
    )
    assert (
        await db.execute(f"INSERT INTO {table} (id, name, score) VALUES (?, ?, ?)", (1, "ann", 1.5))
        == 1
    )
    assert (
        await db.executemany(
            f"INSERT INTO {table} (id, name, score) VALUES (?, ?, ?)",
            [(2, "bob", 2.5), (3, "cy", None), (4, "dee", 4.0)],
        )
        == 3
    )
    assert await db.executemany(f"INSERT INTO {table} (id) VALUES (?)", []) == 0
    rows = await db.fetchall(f"SELECT id, name, score FROM {table} ORDER BY id")
    assert rows == [(1, "ann", 1.5), (2, "bob", 2.5), (3, "cy", None), (4, "dee", 4.0)]
    assert all(isinstance(r, tuple) for r in rows)
    assert await db.fetchone(f"SELECT name FROM {table} WHERE id = ?", (2,)) == ("bob",)
    assert await db.fetchone(f"SELECT name FROM {table} WHERE id = ?", (99,)) is None
    assert await db.fetchall(f"SELECT name FROM {table} WHERE id > ?", (99,)) == []
    assert await db.fetchone(f"SELECT COUNT(*) FROM {table}") == (4,)
    # UPDATE counts the rows it matched, even when a value does not change
    assert await db.execute(f"UPDATE {table} SET name = name WHERE id <= ?", (2,)) == 2
    assert await db.execute(f"DELETE FROM {table} WHERE id > ?", (2,)) == 2
    # a float (the driver's reserved_at token) survives the round trip exactly
    token = time.time() + 1e-6
    await db.execute(f"UPDATE {table} SET score = ? WHERE id = ?", (token, 1))
    assert await db.fetchone(f"SELECT id, score FROM {table} WHERE score = ?", (token,)) == (
        1,
        token,
    )


async def test_placeholders_and_literals(db: Connector, table: str) -> None:
    await db.execute(f"CREATE TABLE {table} (id INTEGER PRIMARY KEY, name VARCHAR(50))")
    await db.executemany(
        f"INSERT INTO {table} (id, name) VALUES (?, ?)", [(1, "a?%"), (2, "abc"), (3, "b")]
    )
    rows = await db.fetchall(
        f"SELECT id FROM {table} WHERE name LIKE 'a%' AND id > ? ORDER BY id", (0,)
    )
    assert rows == [(1,), (2,)]
    assert await db.fetchone(f"SELECT '?', name FROM {table} WHERE id = ?", (1,)) == ("?", "a?%")
    assert await db.fetchone(f"SELECT id FROM {table} WHERE name = ?", ("a?%",)) == (1,)
    # no parameters: the SQL goes as written, % and all
    assert await db.fetchall(f"SELECT id FROM {table} WHERE name LIKE '%c' ORDER BY id") == [(2,)]


async def test_transaction_commit_and_rollback(db: Connector, table: str) -> None:
    await db.execute(f"CREATE TABLE {table} (id INTEGER PRIMARY KEY, name VARCHAR(50))")
    async with db.transaction() as tx:
        assert isinstance(tx, Session)
        assert await tx.execute(f"INSERT INTO {table} (id, name) VALUES (?, ?)", (1, "a")) == 1
        await tx.executemany(f"INSERT INTO {table} (id, name) VALUES (?, ?)", [(2, "b"), (3, "c")])
        assert await tx.fetchone(f"SELECT COUNT(*) FROM {table}") == (3,)
        assert await tx.fetchall(f"SELECT id FROM {table} WHERE id < ? ORDER BY id", (3,)) == [
            (1,),
            (2,),
        ]
    assert await db.fetchall(f"SELECT id FROM {table} ORDER BY id") == [(1,), (2,), (3,)]

    class Boom(Exception):
        pass

    async def raises() -> None:
        async with db.transaction(immediate=True) as tx:
            await tx.execute(f"DELETE FROM {table} WHERE id = ?", (1,))
            await tx.execute(f"INSERT INTO {table} (id, name) VALUES (?, ?)", (4, "d"))
            raise Boom

    with pytest.raises(Boom):
        await raises()
    assert await db.fetchall(f"SELECT id FROM {table} ORDER BY id") == [(1,), (2,), (3,)]

    async def duplicate() -> None:
        async with db.transaction() as tx:
            await tx.execute(f"INSERT INTO {table} (id, name) VALUES (?, ?)", (5, "e"))
            await tx.execute(f"INSERT INTO {table} (id, name) VALUES (?, ?)", (1, "dup"))

    # a failed statement rolls the transaction back too; the connector stays usable
    with pytest.raises(Exception, match=r"(?i)duplicate|unique"):
        await duplicate()
    assert await db.fetchall(f"SELECT id FROM {table} ORDER BY id") == [(1,), (2,), (3,)]


async def test_transaction_is_isolated(backend: str, db: Connector, table: str) -> None:
    if backend == "sqlite":
        pytest.skip("one SQLite connection: other statements wait for the transaction")
    await db.execute(f"CREATE TABLE {table} (id INTEGER PRIMARY KEY)")
    async with db.transaction() as tx:
        await tx.execute(f"INSERT INTO {table} (id) VALUES (?)", (1,))
        assert await tx.fetchone(f"SELECT COUNT(*) FROM {table}") == (1,)
        # another pooled connection does not see the uncommitted row
        assert await db.fetchone(f"SELECT COUNT(*) FROM {table}") == (0,)
    assert await db.fetchone(f"SELECT COUNT(*) FROM {table}") == (1,)


async def test_concurrent_statements_share_the_pool(db: Connector, table: str) -> None:
    await db.execute(f"CREATE TABLE {table} (id INTEGER PRIMARY KEY)")
    await asyncio.gather(
        *(db.execute(f"INSERT INTO {table} (id) VALUES (?)", (i,)) for i in range(50))
    )
    assert await db.fetchone(f"SELECT COUNT(*) FROM {table}") == (50,)


async def test_queue_schema_creates_cleanly_and_twice(db: Connector, table: str) -> None:
    statements = queue_schema(db.dialect, table, f"{table}_failed")
    assert statements
    for _ in range(2):
        for stmt in statements:
            await db.execute(stmt)
    sql = queue_sql(db.dialect, table, f"{table}_failed")
    now = time.time()
    await db.execute(sql["enqueue"], ("default", "{}", 0, now, now, None, now))  # no group
    assert await db.fetchone(sql["size"], ("default",)) == (1,)
    await db.execute(sql["failed_insert"], ("u-1", "db", "default", "{}", "boom", now))
    row = await db.fetchone(sql["failed_find"], ("u-1",))
    assert row is not None
    assert row[:5] == ("u-1", "db", "default", "{}", "boom")


def test_new_event_loop_gets_a_new_pool(backend: str, url: str) -> None:
    """``asyncio.run()`` twice with one connector (a pool is bound to its loop)."""
    c = connect("main", {"url": url})

    async def one() -> Any:
        return await c.fetchone("SELECT 1")

    async def last() -> Any:
        row = await c.fetchone("SELECT 2")
        await c.close()
        return row

    assert asyncio.run(one()) == (1,)
    with warnings.catch_warnings():
        # the first loop's connections were never closed: they are collected with it
        warnings.simplefilter("ignore", ResourceWarning)
        assert asyncio.run(last()) == (2,)
        gc.collect()


async def test_migrate_applies_the_queue_tables_once(url: str, table: str, tmp_path: Path) -> None:
    (tmp_path / "config").mkdir()  # an app root holds config/ or app/
    app = App(root=tmp_path, **_app_config(url, table))
    async with app:
        path = migrations.make_queue_tables(app)
        assert path.is_file()
        first = await migrations.migrate(app)
        second = await migrations.migrate(app)
        assert first.applied == [path.name]
        assert second.skipped == [path.name]
        assert second.applied == []
        assert await app.database().fetchone(f"SELECT COUNT(*) FROM {table}") == (0,)


# --------------------------------------------------------------------------- LISTEN/NOTIFY


async def test_postgres_notify_wakes_a_listener_on_another_connector(postgres_url: str) -> None:
    channel = f"haze_{secrets.token_hex(4)}"
    listener = connect("main", {"url": postgres_url})
    producer = connect("main", {"url": postgres_url})
    try:
        t0 = time.monotonic()
        await listener.listen(channel, 0.2)  # type: ignore[attr-defined]
        assert time.monotonic() - t0 >= 0.15  # nothing came: waited the timeout

        async def wait() -> float:
            start = time.monotonic()
            await listener.listen(channel, 10)  # type: ignore[attr-defined]
            return time.monotonic() - start

        waiter = asyncio.create_task(wait())
        await asyncio.sleep(0.2)
        producer.notify(channel, "default")  # type: ignore[attr-defined]
        waited = await asyncio.wait_for(waiter, 5)
        assert waited < 2

        # a notification while nobody listens is kept for the next listen()
        producer.notify(channel, "default")  # type: ignore[attr-defined]
        await asyncio.sleep(0.3)
        t0 = time.monotonic()
        await listener.listen(channel, 10)  # type: ignore[attr-defined]
        assert time.monotonic() - t0 < 1

        # the LISTEN connection is killed: it reconnects (after a short backoff)
        killed = await producer.fetchall(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE query = ? AND pid <> pg_backend_pid()",
            (f'LISTEN "{channel}"',),
        )
        assert killed == [(True,)]
        await asyncio.sleep(1.0)
        await listener.listen(channel, 0.1)  # type: ignore[attr-defined]  # reconnects
        waiter = asyncio.create_task(wait())
        await asyncio.sleep(0.2)
        producer.notify(channel, "default")  # type: ignore[attr-defined]
        assert await asyncio.wait_for(waiter, 5) < 2
    finally:
        await listener.close()
        await producer.close()


async def test_postgres_listen_without_server_falls_back_to_polling() -> None:
    c = connect("main", {"url": "postgresql://postgres@127.0.0.1:1/nothing"})
    try:
        t0 = time.monotonic()
        await c.listen("haze_jobs", 0.3)  # type: ignore[attr-defined]
        assert 0.25 <= time.monotonic() - t0 < 5
        c.notify("haze_jobs", "default")  # type: ignore[attr-defined]  # logged, not raised
        await asyncio.sleep(0.1)
    finally:
        await c.close()


# --------------------------------------------------------------------------- the driver

RAN: list[tuple[Any, int]] = []
STATE: dict[str, Any] = {}


@pytest.fixture(autouse=True)
def _reset() -> None:
    RAN.clear()
    STATE.clear()


@define_job(name="dbc_record")
async def dbc_record(payload: dict[str, Any], job: JobContext) -> None:
    RAN.append((payload["i"], job.attempt))
    if payload.get("sleep"):
        await asyncio.sleep(payload["sleep"])


@define_job(name="dbc_flaky", tries=3)
async def dbc_flaky(payload: dict[str, Any], job: JobContext) -> None:
    RAN.append((payload["i"], job.attempt))
    if job.attempt < 3:
        raise RuntimeError(f"flaky attempt {job.attempt}")


@define_job(name="dbc_release")
async def dbc_release(payload: dict[str, Any], job: JobContext) -> None:
    RAN.append((payload["i"], job.attempt))
    released = STATE.setdefault("released", set())
    if payload["i"] not in released:
        released.add(payload["i"])
        job.release()


@define_job(name="dbc_broken", tries=2)
async def dbc_broken(payload: dict[str, Any], job: JobContext) -> None:
    RAN.append((payload["i"], job.attempt))
    if not STATE.get("fixed"):
        raise ValueError(f"broken {payload['i']}")


@define_job(name="dbc_stamp")
async def dbc_stamp(payload: dict[str, Any]) -> None:
    RAN.append((payload["i"], 1))
    STATE.setdefault("stamps", {})[payload["i"]] = time.monotonic()


def _app_config(url: str, table: str, sleep: float = 0.05) -> dict[str, Any]:
    return {
        "queue": define_queue_config(
            default="db",
            connections={
                "db": {
                    "driver": "database",
                    "connection": "main",
                    "retry_after": "2s",
                    "sleep": sleep,
                    "table": table,
                    "failed_table": f"{table}_failed",
                }
            },
        ),
        "database": define_database_config(default="main", connections={"main": {"url": url}}),
    }


def _app(url: str, table: str, sleep: float = 0.05) -> App:
    return App(**_app_config(url, table, sleep))


async def _work(app: App, concurrency: int = 4) -> int:
    worker = Worker(
        app, "db", ["default"], concurrency=concurrency, stop_when_empty=True, sleep=0.05
    )
    return await asyncio.wait_for(worker.run(), 60)


@contextlib.asynccontextmanager
async def _queue_app(url: str, table: str, sleep: float = 0.05) -> AsyncIterator[App]:
    async with _app(url, table, sleep) as app:
        await migrations.ensure_queue_tables(app)
        yield app


async def test_driver_runs_every_job_once(url: str, table: str) -> None:
    async with _queue_app(url, table) as app:
        for i in range(20):
            await dbc_record.dispatch({"i": i})
        await Queue.bulk([dbc_record.with_({"i": i}) for i in range(20, 30)])
        assert await Queue.size("default", connection="db") == 30
        assert await _work(app) == 30
        assert sorted(RAN) == [(i, 1) for i in range(30)]
        assert await Queue.size("default", connection="db") == 0
        assert await Queue.failed(connection="db") == []


async def test_driver_delay(url: str, table: str) -> None:
    async with _queue_app(url, table) as app:
        await dbc_record.dispatch({"i": 1}, delay=0.4)
        await dbc_record.dispatch({"i": 2})
        await _work(app)
        assert RAN == [(2, 1)]  # the delayed job is not due yet
        await asyncio.sleep(0.5)
        await _work(app)
        assert RAN == [(2, 1), (1, 1)]


async def test_driver_retries(url: str, table: str) -> None:
    async with _queue_app(url, table) as app:
        await dbc_flaky.dispatch({"i": "f"})
        await _work(app)
        assert RAN == [("f", 1), ("f", 2), ("f", 3)]
        assert await Queue.failed(connection="db") == []
        assert await Queue.size("default", connection="db") == 0


async def test_driver_release_uses_no_try(url: str, table: str) -> None:
    async with _queue_app(url, table) as app:
        await dbc_release.dispatch({"i": "r"})
        await _work(app)
        assert RAN == [("r", 1), ("r", 1)]  # tries=1, yet it ran again: release is free
        assert await Queue.failed(connection="db") == []
        assert await Queue.size("default", connection="db") == 0


async def test_driver_failed_jobs_and_retry(url: str, table: str) -> None:
    async with _queue_app(url, table) as app:
        await dbc_broken.dispatch({"i": 1})
        await dbc_broken.dispatch({"i": 2})
        await _work(app)
        assert sorted(RAN) == [(1, 1), (1, 2), (2, 1), (2, 2)]
        failed = await Queue.failed(connection="db")
        assert sorted(f.payload["i"] for f in failed) == [1, 2]
        assert all(f.name == "dbc_broken" and "broken" in f.exception for f in failed)
        assert all(f.connection == "db" and f.queue == "default" for f in failed)
        assert await Queue.size("default", connection="db") == 0

        STATE["fixed"] = True
        RAN.clear()
        retried = await Queue.retry(connection="db")
        assert sorted(retried) == sorted(f.id for f in failed)
        assert await Queue.failed(connection="db") == []
        await _work(app)
        assert sorted(RAN) == [(1, 1), (2, 1)]

        STATE["fixed"] = False
        await dbc_broken.dispatch({"i": 3})
        await _work(app)
        [f3] = await Queue.failed(connection="db")
        assert await Queue.forget(f3.id, connection="db") is True
        assert await Queue.failed(connection="db") == []


async def test_two_workers_never_run_a_job_twice(url: str, table: str) -> None:
    """Two apps = two connectors/pools, as two worker processes would have."""
    n = 120
    async with _queue_app(url, table) as producer:
        await run_in_app(
            producer,
            lambda: Queue.bulk([dbc_record.with_({"i": i, "sleep": 0.005}) for i in range(n)]),
        )
        async with _app(url, table) as a, _app(url, table) as b:
            done_a, done_b = await asyncio.gather(_work(a), _work(b))
    assert sorted(i for i, _ in RAN) == list(range(n))  # each exactly once
    assert done_a + done_b == n
    assert done_a > 0
    assert done_b > 0


async def test_postgres_idle_worker_wakes_on_dispatch_from_another_app(
    postgres_url: str,
    table: str,
) -> None:
    """LISTEN/NOTIFY: the worker polls every 5 s, yet a job dispatched by a separate app
    (as another process would) runs well within a second."""
    async with _queue_app(postgres_url, table, sleep=5) as app:
        worker = Worker(app, "db", ["default"], concurrency=2, sleep=5)
        task = asyncio.create_task(worker.run())
        try:
            await asyncio.sleep(0.5)  # it found nothing and is idle now
            async with _app(postgres_url, table, sleep=5) as producer:
                latencies = []
                for i in range(3):
                    sent = time.monotonic()
                    await run_in_app(producer, lambda i=i: dbc_stamp.dispatch({"i": i}))
                    deadline = sent + 10
                    while i not in STATE.get("stamps", {}) and time.monotonic() < deadline:
                        await asyncio.sleep(0.005)
                    assert i in STATE.get("stamps", {}), "the job never ran"
                    latencies.append(STATE["stamps"][i] - sent)
                    await asyncio.sleep(0.3)
        finally:
            await worker.stop()
            await asyncio.wait_for(task, 10)
    assert RAN == [(0, 1), (1, 1), (2, 1)]
    assert max(latencies) < 1.0, latencies  # polling alone would take ~5 s
