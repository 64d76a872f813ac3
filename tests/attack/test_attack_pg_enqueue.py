"""Attacks on single enqueue (one dispatch at a time) on PostgreSQL, with MariaDB and
SQLite beside it where the docs promise the same of every database.

Connections are killed with ``pg_terminate_backend`` (and MariaDB's ``KILL``) on the
test's own database only: the servers are shared, so nothing here restarts them.
"""

from __future__ import annotations

import asyncio
import collections
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from atk_harness import (
    db_app,
    drain,
    mysql_database,
    mysql_kill,
    pg_database,
    pg_terminate,
    sqlite_url,
)
from haze import (
    App,
    DatabaseConnectionError,
    DispatchOutcomeUnknownError,
    HazeError,
    JobContext,
    Queue,
    define_database_config,
    define_job,
    define_queue_config,
)

pytestmark = pytest.mark.timeout(120)

RAN: list[Any] = []


@pytest.fixture(autouse=True)
def _clear() -> None:
    RAN.clear()


@define_job(name="attack3_pg_record")
async def record(payload: Any) -> None:
    RAN.append(payload)


@define_job(name="attack3_pg_ctx")
async def record_ctx(payload: Any, job: JobContext) -> None:
    RAN.append((job.queue, payload))


ODD_VALUES = {
    "NUL in a value": {"s": "a\x00b"},
    "NUL in a key": {"a\x00b": 1},
    "2**70": {"i": 2**70},
    "4,300 digits": {"i": int("9" * 4300)},
    "-0.0": {"z": -0.0},
    "1e16": {"f": 1e16},
    "5e-324": {"f": 5e-324},
    "key order": {"bb": 1, "a": 2, "": 3},
    "line and paragraph separators, BOM, emoji": {"s": "\u2028\u2029\ufeff\U0001f600\\\"'"},
    "control characters": {"s": "".join(chr(i) for i in range(1, 32))},
    "noncharacters": {"s": "\uffff\ufffe"},
    "1 MiB": {"s": "x" * (1024 * 1024)},
    "2 MiB of two-byte characters": {"s": "é" * (1024 * 1024)},
    "a list": [1, "a", None],
    "a scalar": 5,
}


async def test_odd_values_arrive_as_their_json_round_trip(pg_url: str) -> None:
    """guide.md, Dispatching: "The payload is JSON-encoded when you call `dispatch()`, and
    the job gets a fresh copy decoded from it, on every driver". Held up on PostgreSQL:
    NUL characters (in values and keys), big ints, negative zero, 1 MiB and 2 MiB
    payloads, odd characters each arrive as their JSON round trip, key order kept."""
    async with db_app(pg_url) as app:
        for payload in ODD_VALUES.values():
            await record.dispatch(payload)
        assert await Queue.size() == len(ODD_VALUES)
        await drain(app)
    expected = [json.loads(json.dumps(p)) for p in ODD_VALUES.values()]
    assert [json.dumps(p) for p in RAN] == [json.dumps(p) for p in expected]


QUEUES = [
    "Tenant",
    "tenant",
    "TENANT",
    "t\u00e9nant",  # é composed
    "te\u0301nant",  # e + combining acute: the same text once normalised
    "a_b",
    "axb",
    "a%",
    "ab",
    "it's",
    "a\\b",
    "q\u200b",  # a zero-width space
    "q",
    "a b",
    "x" * 255,
    "😀" * 255,
]


async def test_queue_names_compare_exactly(pg_url: str) -> None:
    """guide.md, Limits: queue names "compare exactly on every driver: `Tenant`, `tenant`,
    `TENANT` and `ténant` are four queues". Held up on PostgreSQL: names differing by
    case, by Unicode normalisation, by LIKE wildcards (`a_b`/`axb`, `a%`/`ab`) or by a
    zero-width space are distinct queues, for `Queue.size` and for a worker's claims."""
    async with db_app(pg_url) as app:
        for q in QUEUES:
            await record_ctx.dispatch({"q": q}, queue=q)
        assert [await Queue.size(q) for q in QUEUES] == [1] * len(QUEUES)
        from haze._workers.worker import Worker

        for q in QUEUES:
            RAN.clear()
            worker = Worker(app, "db", [q], 1, sleep=0.05, max_sleep=0.05, stop_when_empty=True)
            await asyncio.wait_for(worker.run(), 30)
            assert [(q, {"q": q})] == RAN


async def test_concurrent_single_dispatch_from_tasks_and_threads(pg_url: str) -> None:
    """Dispatch one job at a time from 30 tasks at once. Held up: every dispatch returns a
    distinct id and its job runs exactly once."""
    async with db_app(pg_url) as app:

        async def producer(k: int) -> list[str]:
            return [await record.dispatch({"n": k * 1000 + i}) for i in range(40)]

        ids = [
            i for batch in await asyncio.gather(*(producer(k) for k in range(30))) for i in batch
        ]
        assert len(set(ids)) == 30 * 40
        await drain(app, concurrency=4)
    assert sorted(p["n"] for p in RAN) == sorted(k * 1000 + i for k in range(30) for i in range(40))


def test_single_dispatch_from_many_threads(pg_url: str) -> None:
    """The same from 16 threads sharing one sync app (README: "Sync code ... uses `with
    App(root=...)` and the `_blocking` twins"). Held up: 800 distinct ids, 800 rows."""

    async def make_tables() -> str:
        async with db_app(pg_url, table="atk_threads", failed_table="atk_threads_failed") as a:
            del a
        return "atk_threads"

    table = asyncio.run(make_tables())
    conn = {
        "driver": "database",
        "connection": "main",
        "table": table,
        "failed_table": "atk_threads_failed",
    }
    app = App(
        queue=define_queue_config(default="db", connections={"db": conn}),
        database=define_database_config(default="main", connections={"main": {"url": pg_url}}),
    )
    ids: list[str] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def work(k: int) -> None:
        for i in range(50):
            try:
                jid = record.dispatch_blocking({"n": k * 1000 + i})
            except BaseException as e:
                with lock:
                    errors.append(e)
            else:
                with lock:
                    ids.append(jid)

    with app:
        threads = [threading.Thread(target=work, args=(k,)) for k in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == []
        assert len(set(ids)) == 800
        assert Queue.size_blocking() == 800
        assert Queue.clear_blocking() == 800


async def test_connections_killed_during_dispatches(pg_url: str) -> None:
    """guide.md, When a backend is down: a dispatch that cannot reach its server "raises
    `BackendUnavailableError` ... A database connection raises its subclass
    `DatabaseConnectionError` ...; nothing was enqueued." Held up: with this database's
    server processes terminated every few milliseconds while 20 tasks dispatch, every
    dispatch either returned an id whose job is queued once, or raised
    DatabaseConnectionError and queued nothing (no job twice, none lost)."""
    async with db_app(pg_url) as app:
        ok: dict[int, str] = {}
        refused: list[int] = []
        unknown: list[int] = []  # may be queued: each runs at most once
        others: list[BaseException] = []
        stop = asyncio.Event()

        async def killer() -> int:
            kills = 0
            while not stop.is_set():
                await asyncio.sleep(0.01)
                kills += await asyncio.to_thread(pg_terminate, pg_url)
            return kills

        async def producer(k: int) -> None:
            for i in range(40):
                n = k * 1000 + i
                try:
                    ok[n] = await record.dispatch({"n": n})
                except DispatchOutcomeUnknownError:
                    unknown.append(n)
                except DatabaseConnectionError:
                    refused.append(n)
                except BaseException as e:
                    others.append(e)

        kill = asyncio.create_task(killer())
        await asyncio.gather(*(producer(k) for k in range(20)))
        stop.set()
        kills = await kill
        assert others == []
        assert kills > 0
        for _ in range(50):  # the pool gives back a connection that works
            try:
                await Queue.size()
                break
            except DatabaseConnectionError:
                await asyncio.sleep(0.05)
        await drain(app, concurrency=4)
    counts = collections.Counter(p["n"] for p in RAN)
    assert [n for n, c in counts.items() if c > 1] == []
    assert set(counts) - set(unknown) == set(ok)
    assert not set(refused) & set(counts)


@pytest.fixture
def own_pg() -> Iterator[str]:
    """A database of its own: the test terminates every connection to it."""
    yield from pg_database("attack3_kill")


@pytest.fixture
def own_mysql() -> Iterator[str]:
    yield from mysql_database("attack3_kill")


async def test_dispatch_after_the_server_dropped_idle_connections_pg(own_pg: str) -> None:
    """guide.md, When a backend is down: `DatabaseConnectionError` is for a "connection
    whose server cannot be reached ... check that its server is running and reachable".
    Here the server is up and answering: only the idle connections of the app's pool
    were closed by the server (what a server restart, a failover, `idle_session_timeout`
    or a proxy's idle cut does).

    Observed on PostgreSQL: after warming the pool with 20 concurrent dispatches and
    terminating this database's server processes, each of the next dispatches fails with
    ``DatabaseConnectionError: PostgreSQL database connection 'main' ... is unavailable
    (AdminShutdown: terminating connection due to administrator command); check that the
    server at 127.0.0.1:5432 is running and reachable`` -- one failure per dead pooled
    connection (6 to 10 in a row, up to ``pool_size``), then they succeed. The same
    happens to `Queue.bulk`, a delayed dispatch and `Queue.size`. An app therefore loses
    up to ``pool_size`` dispatches after every PostgreSQL restart, although the server
    was reachable for each of them; MariaDB (below) reconnects without a failure."""
    async with db_app(own_pg):
        await asyncio.gather(*(record.dispatch({"warm": i}) for i in range(20)))
        assert pg_terminate(own_pg) > 0
        await asyncio.sleep(0.2)
        for i in range(5):
            await record.dispatch({"after": i})
        assert await Queue.size() == 25


async def test_dispatch_after_the_server_dropped_idle_connections_mariadb(
    own_mysql: str,
) -> None:
    """The MariaDB half of the test above. Held up: after every connection to the
    database was KILLed, the next dispatches succeed."""
    async with db_app(own_mysql):
        await asyncio.gather(*(record.dispatch({"warm": i}) for i in range(20)))
        assert mysql_kill(own_mysql) > 0
        await asyncio.sleep(0.2)
        for i in range(5):
            await record.dispatch({"after": i})
        assert await Queue.size() == 25


@define_job(name="attack3_pg_nul_error")
async def nul_error(payload: Any) -> None:
    raise ValueError(f"cannot parse {payload['name']}")


@pytest.fixture(params=["sqlite", "mariadb", "postgres"])
def nul_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return sqlite_url(tmp_path)
    return str(
        request.getfixturevalue({"postgres": "pg_url", "mariadb": "mysql_url"}[request.param])
    )


async def test_a_failure_whose_text_holds_nul_is_kept_in_failed_jobs(nul_url: str) -> None:
    """guide.md, Handler signatures: "Whatever it raises ... is that job's failure:
    retried or kept in failed jobs with its real type". architecture.md: a final failure
    goes to the failed store, "handed back to the queue when the store cannot keep it".

    A NUL character is accepted in a payload on every database (the first test here), so
    an exception made of the payload, ``ValueError(f"cannot parse {payload['name']}")``,
    can carry one. Observed on PostgreSQL: the worker logs ``the failure of job ... could
    not be recorded (DataError: PostgreSQL text fields cannot contain NUL (0x00) bytes);
    the message is removed from its queue and this line is its only record``: the job is
    in neither the queue nor failed jobs, so `queue:failed` and `queue:retry` never see
    it. (`track=True` records the failure; only the failed-jobs row is lost.) SQLite and
    MariaDB keep the failed record."""
    async with db_app(nul_url) as app:
        job_id = await nul_error.dispatch({"name": "report\x00.csv"})
        await drain(app)
        failed = await Queue.failed()
        assert [f.id for f in failed] == [job_id]
        assert "ValueError" in failed[0].exception
        assert await Queue.size() == 0


@define_job(name="attack3_pg_unique", unique={"key": lambda p: p["file"], "for": "1h"})
async def unique_by_file(payload: Any) -> None:
    RAN.append(payload)


@define_job(name="attack3_pg_debounced", debounce={"key": lambda p: p["file"], "for": "0.2s"})
async def debounced_by_file(payload: Any) -> None:
    RAN.append(payload)


@pytest.mark.parametrize("option", ["unique", "debounce"])
async def test_a_key_holding_nul_is_a_haze_error_or_a_lock(pg_url: str, option: str) -> None:
    """guide.md, Limits: unique keys compare exactly on every driver; configuration.md:
    "The `database` store keeps keys up to 128 characters as they are and a longer key as
    its first 64 characters plus its SHA-256, so a key of any length is kept whole in
    meaning"; guide.md: a key function that raises is a `KeyFunctionError`, one haze
    error, "nothing is queued".

    Observed on PostgreSQL (the default store of a database connection is its database):
    ``unique_by_file.dispatch({"file": "a\\x00b"})`` raises ``psycopg.DataError:
    PostgreSQL text fields cannot contain NUL (0x00) bytes`` -- a client-library error
    that is not a HazeError (a caller catching haze's errors misses it) -- and so does a
    `debounce` key; SQLite and MariaDB lock the key and run the job. The same key in
    `without_overlapping` fails the job at run time with that DataError."""
    job = unique_by_file if option == "unique" else debounced_by_file
    async with db_app(pg_url):
        try:
            await job.dispatch({"file": "a\x00b"})
        except HazeError:
            pass  # refused in haze's own words: acceptable


@define_job(name="attack3_pg_unique_storm", unique={"key": lambda p: p["k"], "for": "1h"})
async def unique_storm(payload: Any) -> None:
    RAN.append(payload["k"])


@pytest.mark.slow
@pytest.mark.storm
async def test_a_failed_unique_dispatch_leaves_no_lock(own_pg: str) -> None:
    """guide.md, When a backend is down: a dispatch that cannot reach its server raises
    `DatabaseConnectionError` and "nothing was enqueued"; architecture.md, route: "on
    failure, record and lock undone"; guide.md: "Unique locks live in the queue `store`,
    owner = message id".

    Ten tasks dispatch a unique job (``for: 1h``) with 400 distinct keys while this
    database's server processes are terminated every few milliseconds. Then every key
    whose dispatch raised is dispatched again (once the server answers). Observed: about
    one in six of them (52 of 309 in one run) comes back ``skipped=True`` -- the lock of
    the failed dispatch is still held -- and the job never runs: the key is neither
    queued nor dispatchable for the lock's hour. A PostgreSQL restart or failover during
    traffic leaves such keys behind."""
    async with db_app(own_pg) as app:
        stop = asyncio.Event()

        async def killer() -> None:
            while not stop.is_set():
                await asyncio.sleep(0.005)
                await asyncio.to_thread(pg_terminate, own_pg)

        raised: list[str] = []
        unknown: list[str] = []

        async def producer(t: int) -> None:
            for i in range(40):
                key = f"k{t}-{i}"
                try:
                    await unique_storm.with_({"k": key}).dispatch()
                except DispatchOutcomeUnknownError:
                    unknown.append(key)  # may be queued: its lock stays
                except DatabaseConnectionError:
                    raised.append(key)

        kill = asyncio.create_task(killer())
        await asyncio.gather(*(producer(t) for t in range(10)))
        stop.set()
        await kill
        assert len(raised) >= 50, "the storm was too mild to judge"
        skipped: list[str] = []
        for key in raised:
            for _ in range(20):
                try:
                    result = await unique_storm.with_({"k": key}).dispatch()
                except DatabaseConnectionError:  # a pooled connection the storm killed
                    await asyncio.sleep(0.05)
                    continue
                if result.skipped:
                    skipped.append(key)
                break
        await drain(app, concurrency=4)
        never_ran = [k for k in skipped if k not in RAN]
        assert never_ran == [], f"{len(never_ran)} of {len(raised)} keys locked with no job"
        assert [k for k in unknown if RAN.count(k) > 1] == []


@pytest.mark.slow
@pytest.mark.storm
async def test_a_dispatch_that_raised_queued_nothing_mariadb(own_mysql: str) -> None:
    """guide.md, When a backend is down: dispatch "raises `BackendUnavailableError` ... A
    database connection raises its subclass `DatabaseConnectionError` ...; nothing was
    enqueued." (PostgreSQL holds this: `test_connections_killed_during_dispatches`, 0 of
    552 in one run.)

    The same storm on MariaDB (20 tasks dispatching while this database's connections are
    KILLed every 10 ms). Observed: of the dispatches that raised DatabaseConnectionError,
    about half had queued their job, which then runs (44 of 79 in one run, 10+ of 26 in
    another) -- far more than the rare lost-reply-after-commit window, so an error comes
    after the row was written. A caller that retries on the error runs the job twice; a
    unique job's lock is undone while its job is queued, so the retry queues a second one
    (a unique job ran twice in the exploration of this storm).

    Cause: MariaDB's ``KILL`` shuts the connection's socket at once but lets the INSERT
    it was running go on to its commit, so the client reads "Lost connection ... during
    query" (2013) for a row that is there. Now a dispatch whose INSERT lost its
    connection looks its job id up once the server thread is idle: found, it returns;
    not found, it sends once more. The storm is judged by the connections it killed
    (few dispatches raise now), and a dispatch that returned ran exactly once.

    A first CI run of that fix still had 4 raised dispatches run: a lookup is only final
    once the server thread was seen idle, and under load neither that check nor the
    lookup got through the storm in time. Now an INSERT whose thread was not seen idle
    is never sent again (its rows are looked for until they appear), and a dispatch whose
    lookup gets no final answer raises ``DispatchOutcomeUnknownError`` (may be queued):
    those run at most once, and every plain ``DatabaseConnectionError`` queued nothing."""
    async with db_app(own_mysql) as app:
        stop = asyncio.Event()

        async def killer() -> int:
            kills = 0
            while not stop.is_set():
                await asyncio.sleep(0.01)
                kills += await asyncio.to_thread(mysql_kill, own_mysql)
            return kills

        raised: list[int] = []
        unknown: list[int] = []  # may be queued: each runs at most once
        returned: list[int] = []

        async def producer(t: int) -> None:
            for i in range(60):
                try:
                    await record.dispatch({"n": t * 1000 + i})
                except DispatchOutcomeUnknownError:
                    unknown.append(t * 1000 + i)
                except DatabaseConnectionError:
                    raised.append(t * 1000 + i)
                else:
                    returned.append(t * 1000 + i)

        kill = asyncio.create_task(killer())
        rounds = 0
        while len(raised) < 30 and rounds < 5:
            await asyncio.gather(*(producer(rounds * 100 + t) for t in range(20)))
            rounds += 1
        stop.set()
        kills = await kill
        assert kills >= 30, "the storm was too mild to judge"
        for _ in range(50):
            try:
                await Queue.size()
                break
            except DatabaseConnectionError:
                await asyncio.sleep(0.05)
        await drain(app, concurrency=4)
        ran = collections.Counter(p["n"] for p in RAN)
        assert [n for n in raised if n in ran] == []
        assert [n for n, c in ran.items() if c > 1] == []
        assert set(ran) - set(unknown) == set(returned)
