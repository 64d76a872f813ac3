"""The hidden corners of the seed's 数据库驱动 section, on every SQL backend.

Parametrised over SQLite (a file under tmp_path), PostgreSQL and MariaDB (one database
per test session on the local servers, dropped at the end) and libSQL (the session's
real ``sqld`` from conftest). Every test uses its own ``table``/``failed_table`` names,
which also exercises those options. Jobs are named ``dbx_sem_*`` (names are process-wide).

The driver is driven directly (``reserve``/``ack``/``release``/``fail`` and
``manager.process``) where a rule is about one claim, and through a real ``Worker``
where it is about the loop (heartbeats, polling, wake-up).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import haze
import pytest
from harness import BACKENDS, backend_url, database_app, mysql_database, pg_database
from haze import App, JobContext, Queue, define_database_config, define_job, define_queue_config
from haze._app.driver_context import AppDriverContext
from haze._base.errors import ConfigError
from haze._base.message import Message, encode, new_id
from haze._workers.worker import Worker
from haze.connectors.migrations import make_queue_tables, migrate
from haze.drivers import FailedJob

pytestmark = pytest.mark.timeout(90)

_names = itertools.count()


# --------------------------------------------------------------------------- backends


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    yield from pg_database("dbx_sem")


@pytest.fixture(scope="session")
def mysql_url() -> Iterator[str]:
    yield from mysql_database("dbx_sem")


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return backend_url(request, request.param, tmp_path)


class Env:
    """One app with a ``db`` database connection on fresh, uniquely named queue tables."""

    def __init__(self, app: App, jobs: str, failed: str):
        self.app, self.jobs, self.failed = app, jobs, failed
        self.driver: Any = app.driver("db")
        self.db = app.database()

    async def rows(self) -> list[dict[str, Any]]:
        cols = "id, queue, payload, attempts, reserved_at, heartbeat_at, available_at"
        rows = await self.db.fetchall(f"SELECT {cols} FROM {self.jobs} ORDER BY id")
        return [dict(zip([c.strip() for c in cols.split(",")], r, strict=True)) for r in rows]

    async def failed_rows(self) -> list[dict[str, Any]]:
        rows = await self.db.fetchall(
            f"SELECT uuid, connection, queue, payload, exception FROM {self.failed} ORDER BY id"
        )
        return [
            dict(zip(["uuid", "connection", "queue", "payload", "exception"], r, strict=True))
            for r in rows
        ]

    async def reserve(self) -> Any:
        return await self.driver.reserve(["default"], 0)


@contextlib.asynccontextmanager
async def open_env(db_url: str, **options: Any) -> AsyncIterator[Env]:
    async with database_app(db_url, "dbx_sem", **options) as app:
        driver: Any = app.driver("db")
        yield Env(app, driver.table, driver.failed_table)


@pytest.fixture
async def env(db_url: str) -> AsyncIterator[Env]:
    async with open_env(db_url, retry_after=0.5) as e:
        yield e


# --------------------------------------------------------------------------- jobs

RUNS: list[tuple[str, Any, int, str | None]] = []


def runs(name: str) -> list[tuple[Any, int, str | None]]:
    return [(p, a, t) for n, p, a, t in RUNS if n == name]


@pytest.fixture(autouse=True)
def _clear_runs() -> None:
    RUNS.clear()


@define_job(name="dbx_sem_record")
async def dbx_sem_record(payload: Any, job: JobContext) -> None:
    RUNS.append(("record", payload, job.attempt, haze.current_tenant()))


@define_job(name="dbx_sem_fail_once", tries=2, backoff=0.4)
async def dbx_sem_fail_once(payload: Any, job: JobContext) -> None:
    RUNS.append(("fail_once", payload, job.attempt, None))
    if job.attempt == 1:
        raise RuntimeError("first attempt fails")


@define_job(name="dbx_sem_release", tries=1)
async def dbx_sem_release(payload: Any, job: JobContext) -> None:
    RUNS.append(("release", payload, job.attempt, None))
    if len(runs("release")) == 1:
        job.release(0.4)


@define_job(name="dbx_sem_once", tries=1)
async def dbx_sem_once(payload: Any, job: JobContext) -> None:
    RUNS.append(("once", payload, job.attempt, None))


@define_job(name="dbx_sem_long", tries=1)
async def dbx_sem_long(payload: Any, job: JobContext) -> None:
    RUNS.append(("long:start", payload, job.attempt, None))
    await asyncio.sleep(payload["secs"])
    RUNS.append(("long:end", payload, job.attempt, None))


@define_job(name="dbx_sem_tenant_fails", tries=1)
async def dbx_sem_tenant_fails(payload: Any, job: JobContext) -> None:
    RUNS.append(("tenant_fails", payload, job.attempt, haze.current_tenant()))
    raise ValueError(f"failed as {haze.current_tenant()}")


@define_job(name="dbx_sem_secret", encrypted=True)
async def dbx_sem_secret(payload: Any, job: JobContext) -> None:
    RUNS.append(("secret", payload, job.attempt, None))


async def until(predicate: Any, within: float = 10.0, interval: float = 0.02) -> None:
    deadline = time.monotonic() + within
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        await asyncio.sleep(interval)


# =========================================================================== claiming


async def test_claim_writes_reserved_at_and_attempts_plus_one(env: Env) -> None:
    before = time.time()
    job_id = await dbx_sem_record.dispatch({"n": 1})
    [row] = await env.rows()
    assert row["attempts"] == 0 and row["reserved_at"] is None

    claimed = await env.reserve()
    assert claimed is not None and claimed.message.id == job_id
    assert claimed.attempt == 1
    [row] = await env.rows()
    assert row["attempts"] == 1
    assert row["reserved_at"] is not None and before <= float(row["reserved_at"]) <= time.time()
    assert float(row["reserved_at"]) == claimed.token[1], "reserved_at is the claim's token"
    # a reserved row is not handed out again while its claim is fresh
    assert await env.reserve() is None


async def test_concurrent_claims_hand_out_each_row_once(db_url: str) -> None:
    """SKIP LOCKED (PostgreSQL/MariaDB) or one atomic UPDATE (SQLite/libSQL): 12 claimers
    in two apps (two connectors, like two processes) never claim one row twice."""
    async with open_env(db_url) as env:
        ids = set(await Queue.bulk([dbx_sem_record.with_(i) for i in range(60)]))
        second = App(
            queue=define_queue_config(
                default="db",
                connections={
                    "db": {
                        "driver": "database",
                        "connection": "main",
                        "table": env.jobs,
                        "failed_table": env.failed,
                    }
                },
            ),
            database=define_database_config(default="main", connections={"main": {"url": db_url}}),
        )
        claimed: list[str] = []

        async def claimer(driver: Any) -> None:
            while True:
                r = await driver.reserve(["default"], 0)
                if r is None:
                    return
                claimed.append(r.message.id)

        try:
            await asyncio.gather(*(claimer(d) for d in [env.driver, second.driver("db")] * 6))
        finally:
            for c in second._connectors.values():
                await c.close()
        assert sorted(claimed) == sorted(ids)


# =========================================================================== available_at


async def test_delay_goes_through_available_at(env: Env) -> None:
    now = time.time()
    await dbx_sem_record.dispatch({"n": 1}, delay=0.6)
    [row] = await env.rows()
    assert row["reserved_at"] is None
    assert now + 0.5 <= float(row["available_at"]) <= time.time() + 0.7
    assert await env.reserve() is None, "not claimable before available_at"
    await asyncio.sleep(0.7)
    claimed = await env.reserve()
    assert claimed is not None and claimed.attempt == 1


async def test_retry_puts_the_row_back_with_a_later_available_at(env: Env) -> None:
    await dbx_sem_fail_once.dispatch({"n": 1})
    [before] = await env.rows()
    first = await env.reserve()
    t = time.time()
    assert await env.app.manager.process(first, env.driver) == "retry"
    [row] = await env.rows()
    assert row["id"] == before["id"], "a retry keeps its row"
    assert row["reserved_at"] is None and row["heartbeat_at"] is None
    assert row["attempts"] == 1, "the failed attempt is used up"
    assert t + 0.3 <= float(row["available_at"]) <= time.time() + 0.5  # backoff 0.4s
    assert await env.reserve() is None
    await asyncio.sleep(0.5)
    second = await env.reserve()
    assert second is not None and second.attempt == 2
    assert await env.app.manager.process(second, env.driver) == "done"
    assert await env.rows() == []
    assert [a for _, a, _ in runs("fail_once")] == [1, 2]


async def test_release_reinserts_a_row_without_using_a_try(env: Env) -> None:
    await dbx_sem_release.dispatch({"n": 1})  # tries=1: a consumed try would fail it
    [original] = await env.rows()
    first = await env.reserve()
    t = time.time()
    assert await env.app.manager.process(first, env.driver) == "released"
    [row] = await env.rows()
    assert row["id"] != original["id"], "release() inserts a new row"
    assert row["attempts"] == 0, "the released attempt is handed back"
    assert row["reserved_at"] is None
    assert t + 0.3 <= float(row["available_at"]) <= time.time() + 0.5
    assert await env.reserve() is None
    await asyncio.sleep(0.5)
    again = await env.reserve()
    assert again is not None and again.attempt == 1
    assert await env.app.manager.process(again, env.driver) == "done"
    assert [a for _, a, _ in runs("release")] == [1, 1]
    assert await env.failed_rows() == []


# =========================================================================== crashes


async def test_row_reserved_longer_than_retry_after_is_reclaimed(env: Env) -> None:
    await dbx_sem_record.dispatch({"n": 1})
    crashed = await env.reserve()  # claimed, then its worker "dies": no ack, no heartbeat
    assert await env.reserve() is None
    await asyncio.sleep(0.6)  # retry_after 0.5s
    again = await env.reserve()
    assert again is not None
    assert again.token[0] == crashed.token[0], "the same row"
    assert again.attempt == 2, "the crashed attempt counts"
    assert again.token[1] != crashed.token[1], "a new reserved_at"
    [row] = await env.rows()
    assert float(row["reserved_at"]) == again.token[1] and row["attempts"] == 2


async def test_slow_worker_cannot_delete_or_release_a_reclaimed_row(env: Env) -> None:
    await dbx_sem_record.dispatch({"n": 1})
    slow = await env.reserve()
    await asyncio.sleep(0.6)
    owner = await env.reserve()  # reclaimed by "another worker"
    assert owner is not None and owner.token[0] == slow.token[0]

    async def unchanged() -> None:
        [row] = await env.rows()
        assert float(row["reserved_at"]) == owner.token[1] and row["attempts"] == 2
        assert await env.failed_rows() == []

    await env.driver.ack(slow)
    await unchanged()
    await env.driver.release(slow, 0, consume_attempt=True)
    await unchanged()
    await env.driver.release(slow, 0, consume_attempt=False)
    await unchanged()
    record = FailedJob(
        id=slow.message.id,
        name="dbx_sem_record",
        connection="db",
        queue="default",
        payload=None,
        exception="late",
        failed_at=time.time(),
        body=slow.body,
    )
    await env.driver.fail(slow, record)
    await unchanged()
    await env.driver.heartbeat([slow])
    [row] = await env.rows()
    assert float(row["heartbeat_at"]) == owner.token[1], "a stale claim cannot heartbeat"
    # the current owner still can
    await env.driver.ack(owner)
    assert await env.rows() == []


async def test_slow_job_whose_row_was_reclaimed_does_not_delete_the_new_run(db_url: str) -> None:
    """End to end: a job outlives retry_after with heartbeats off (a stuck worker); another
    worker reclaims and runs it; the slow run's ack deletes nothing. The other worker
    has a driver of its own, as another process would: this process's driver leaves a
    job its worker still runs to that worker."""
    async with open_env(db_url, retry_after=0.4) as env:
        env.driver.heartbeat_interval = 3600  # this worker looks dead to the others
        other = type(env.driver)(
            "db", dict(env.driver.settings), AppDriverContext(env.app, "db", "'database'")
        )
        await dbx_sem_long.dispatch({"secs": 0.8})
        slow = Worker(env.app, "db", ["default"], 1, sleep=0.05, max_sleep=0.05, max_jobs=1)
        slow.start()
        await until(lambda: runs("long:start"))
        await asyncio.sleep(0.5)
        again = await other.reserve(["default"], 0)  # the other worker
        assert again is not None and again.attempt == 2
        await slow.run()  # the slow run finishes and acks with its stale reserved_at
        [row] = await env.rows()
        assert float(row["reserved_at"]) == again.token[1], "the reclaimed row survived"
        await other.ack(again)
        assert await env.rows() == []


async def test_a_claim_slower_than_retry_after_is_not_run_by_two_workers(env: Env) -> None:
    """A claim whose statement took long (a pool opening, a loaded server) writes a
    reserved_at that is already old, so another worker may take the row over before the
    first heartbeat. The slow claimer refreshes the heartbeat first and, finding the row
    taken, does not run it. (The slow claim is simulated by an older claim timestamp.)"""
    await dbx_sem_record.dispatch({"n": 1})
    other = type(env.driver)(
        "db", dict(env.driver.settings), AppDriverContext(env.app, "db", "'database'")
    )
    real_execute = env.db.execute
    stolen: list[Any] = []
    refresh = env.driver.sql["heartbeat_many"].replace("{ids}", "?")  # the claim's one row

    async def execute(sql: str, params: Any = ()) -> int:
        if sql == refresh and not stolen:
            stolen.append(await other.reserve(["default"], 0))  # between claim and refresh
        return await real_execute(sql, params)

    env.driver._token = lambda: time.time() - 0.6  # the claim "took" 0.6 s > retry_after
    env.db.execute = execute  # type: ignore[method-assign]
    try:
        assert await env.reserve() is None, "the slow claimer lost the row: it must not run it"
    finally:
        env.db.execute = real_execute  # type: ignore[method-assign]
        del env.driver._token
    assert stolen and stolen[0] is not None and stolen[0].attempt == 2
    [row] = await env.rows()
    assert float(row["reserved_at"]) == stolen[0].token[1]


async def test_a_slow_claim_refreshes_its_heartbeat_at_once(env: Env) -> None:
    await dbx_sem_record.dispatch({"n": 1})
    env.driver._token = lambda: time.time() - 0.3  # slower than retry_after / 4
    try:
        claimed = await env.reserve()
    finally:
        del env.driver._token
    assert claimed is not None and claimed.attempt == 1
    [row] = await env.rows()
    assert float(row["reserved_at"]) == claimed.token[1], "reserved_at stays the token"
    assert float(row["heartbeat_at"]) >= float(row["reserved_at"]) + 0.29


async def test_exhausted_job_reclaimed_after_a_crash_goes_to_failed_jobs_unrun(env: Env) -> None:
    job_id = await dbx_sem_once.dispatch({"n": 1})  # tries=1
    await env.reserve()  # attempt 1 claimed; the worker crashes before running it
    await asyncio.sleep(0.6)
    again = await env.reserve()
    assert again is not None and again.attempt == 2
    assert await env.app.manager.process(again, env.driver) == "failed"
    assert runs("once") == [], "an exhausted job is not run again"
    assert await env.rows() == []
    [failed] = await env.failed_rows()
    assert failed["uuid"] == job_id and failed["connection"] == "db"
    assert failed["queue"] == "default"
    assert "MaxAttemptsExceededError" in failed["exception"]
    assert json.loads(failed["payload"])["job"] == "dbx_sem_once"
    [listed] = await Queue.failed()
    assert listed.id == job_id and listed.name == "dbx_sem_once"


async def test_heartbeats_keep_a_long_job_from_being_reclaimed(db_url: str) -> None:
    """The job runs 2.5 x retry_after; a second app polls for abandoned rows all along."""
    async with open_env(db_url, retry_after=0.6) as env:
        assert env.driver.heartbeat_interval <= 0.2
        await dbx_sem_long.dispatch({"secs": 1.5})
        worker = Worker(env.app, "db", ["default"], 1, sleep=0.05, max_sleep=0.05, max_jobs=1)
        worker.start()
        other = App(
            queue=define_queue_config(
                default="db",
                connections={
                    "db": {
                        "driver": "database",
                        "connection": "main",
                        "table": env.jobs,
                        "failed_table": env.failed,
                        "retry_after": 0.6,
                    }
                },
            ),
            database=define_database_config(default="main", connections={"main": {"url": db_url}}),
        )
        stolen: list[Any] = []
        beats: set[float] = set()
        reserved: set[float] = set()
        try:
            await until(lambda: runs("long:start"))
            while not runs("long:end"):
                r = await other.driver("db").reserve(["default"], 0)
                if r is not None:
                    stolen.append(r)
                for row in await env.rows():
                    beats.add(float(row["heartbeat_at"]))
                    reserved.add(float(row["reserved_at"]))
                await asyncio.sleep(0.1)
            await worker.run()
        finally:
            for c in other._connectors.values():
                await c.close()
        assert stolen == [], "a live worker's job was reclaimed"
        assert len(reserved) == 1, "reserved_at stays the ownership token"
        # the row's reserved_at grew older than retry_after; its heartbeat kept it alive
        assert max(beats) - reserved.pop() > 0.6, f"heartbeat_at was not refreshed: {beats}"
        assert len(runs("long:start")) == 1
        assert await env.rows() == []


# =========================================================================== polling


async def test_idle_polling_doubles_from_sleep_to_max_sleep(env: Env) -> None:
    waits: list[float] = []
    real = env.driver.reserve_many  # the worker claims through the batch call

    async def spy(queues: Any, limit: int, wait: float, **options: Any) -> Any:
        waits.append(wait)
        return await real(queues, limit, wait, **options)

    env.driver.reserve_many = spy
    worker = Worker(env.app, "db", ["default"], 1, sleep=0.02, max_sleep=0.15)
    worker.start()
    await until(lambda: len(waits) >= 6)
    await dbx_sem_record.dispatch({"n": 1})
    await until(lambda: runs("record"))
    await until(lambda: len(waits) >= 9)
    await worker.stop()
    assert waits[:6] == [0.02, 0.04, 0.08, 0.15, 0.15, 0.15]
    # after a job, the interval starts again at sleep
    i = next(i for i, w in enumerate(waits) if i > 0 and w == 0.02)
    assert waits[i : i + 3] == [0.02, 0.04, 0.08]


async def test_same_process_dispatch_wakes_an_idle_worker_at_once(env: Env) -> None:
    worker = Worker(env.app, "db", ["default"], 4, sleep=5.0, max_sleep=5.0)
    worker.start()
    try:
        await asyncio.sleep(0.3)  # every slot is idle, in a 5 s wait
        t = time.perf_counter()
        await dbx_sem_record.dispatch({"n": 1})
        await until(lambda: runs("record"), within=4.0, interval=0.005)
        latency = time.perf_counter() - t
        t = time.perf_counter()
        await Queue.bulk([dbx_sem_record.with_(i) for i in range(2, 6)])
        await until(lambda: len(runs("record")) == 5, within=4.0, interval=0.005)
        bulk_latency = time.perf_counter() - t
    finally:
        t = time.perf_counter()
        await worker.stop()
        stop = time.perf_counter() - t
    assert latency < 1.0, f"dispatch woke the worker after {latency:.2f}s"
    assert bulk_latency < 1.0, f"bulk dispatch woke the worker after {bulk_latency:.2f}s"
    assert stop < 2.0, f"stopping an idle worker took {stop:.2f}s (its wait is 5 s)"


# =========================================================================== tenancy


async def test_queue_tables_stay_central_under_a_tenant(env: Env) -> None:
    with haze.tenant("acme"):
        await dbx_sem_record.dispatch({"n": 1})
        await dbx_sem_tenant_fails.dispatch({"n": 2})
        assert await Queue.size() == 2, "size() inside a tenant reads the central table"
    with haze.tenant("globex"):
        await dbx_sem_record.dispatch({"n": 3})
    rows = await env.rows()
    assert len(rows) == 3, "every tenant's jobs are in the one central table"
    assert [json.loads(r["payload"]).get("tenant") for r in rows] == ["acme", "acme", "globex"]
    worker = Worker(env.app, "db", ["default"], 2, sleep=0.02, max_sleep=0.05, stop_when_empty=True)
    await worker.run()  # the worker itself runs outside any tenant
    assert sorted((p["n"], t) for p, _, t in runs("record")) == [(1, "acme"), (3, "globex")]
    assert runs("tenant_fails") == [({"n": 2}, 1, "acme")]
    [failed] = await env.failed_rows()
    assert "failed as acme" in failed["exception"]
    assert json.loads(failed["payload"])["tenant"] == "acme"
    with haze.tenant("acme"):
        assert [f.name for f in await Queue.failed()] == ["dbx_sem_tenant_fails"]
    assert [f.name for f in await Queue.failed()] == ["dbx_sem_tenant_fails"]


# =========================================================================== configuration


@pytest.mark.parametrize("key", ["table", "failed_table"])
@pytest.mark.parametrize("bad", ["jobs; drop", "jobs drop table x", "1jobs", "x" * 64, ""])
def test_table_names_are_validated_identifiers_at_config_time(key: str, bad: str) -> None:
    with pytest.raises(ConfigError, match=rf"connections\.db\.{key}"):
        App(
            queue=define_queue_config(
                default="db",
                connections={"db": {"driver": "database", "connection": "main", key: bad}},
            )
        )


def test_table_names_are_validated_by_the_driver_too() -> None:
    """A driver built from options that skipped config validation still refuses them."""
    from haze.drivers.sql import DatabaseDriver

    app = App(
        database=define_database_config(
            default="main", connections={"main": {"url": "sqlite:///x.db"}}
        )
    )
    context = AppDriverContext(app, "db", "'database'")
    with pytest.raises(ConfigError, match=r"connections\.db\.failed_table"):
        DatabaseDriver("db", {"failed_table": "f; DROP TABLE jobs"}, context)


# =========================================================================== corrupt rows


async def test_corrupt_rows_go_to_failed_jobs_with_a_clear_exception(env: Env) -> None:
    now = time.time()
    unknown = Message(id=new_id(), job="dbx_sem_no_such_job", payload={"x": 1}, queue="default")
    bodies = ["{not json", encode(unknown), json.dumps({"v": 1, "payload": 1})]
    for body in bodies:
        await env.db.execute(
            f"INSERT INTO {env.jobs} (queue, payload, attempts, available_at, created_at) "
            "VALUES (?, ?, 0, ?, ?)",
            ("default", body, now, now),
        )
    await dbx_sem_record.dispatch({"n": "after"})
    worker = Worker(env.app, "db", ["default"], 1, sleep=0.02, max_sleep=0.05, stop_when_empty=True)
    assert await worker.run() == 4, "corrupt rows do not stop the worker"
    assert runs("record") == [({"n": "after"}, 1, None)]
    assert await env.rows() == []
    failed = await env.failed_rows()
    assert [f["payload"] for f in failed] == bodies, "the raw body is kept"
    bad_json, no_job, no_name = (f["exception"] for f in failed)
    assert "MessageDecodeError" in bad_json
    assert "UnknownJobError" in no_job and "dbx_sem_no_such_job" in no_job
    assert "MessageDecodeError" in no_name
    assert failed[1]["uuid"] == unknown.id
    listed = await Queue.failed()
    assert len(listed) == 3 and listed[0].name == "<undecodable>"


# =========================================================================== encryption at rest


async def test_encrypted_payload_is_not_stored_in_plaintext(db_url: str) -> None:
    from haze._base.crypto import generate_key

    async with open_env(db_url, key=generate_key()) as env:
        await dbx_sem_secret.dispatch({"card": "4111-1111-1111-1111"})
        [row] = await env.rows()
        assert "4111" not in row["payload"]
        assert "enc" in json.loads(row["payload"]) and "payload" not in json.loads(row["payload"])
        worker = Worker(env.app, "db", ["default"], 1, sleep=0.02, stop_when_empty=True)
        await worker.run()
        assert runs("secret") == [({"card": "4111-1111-1111-1111"}, 1, None)]


# =========================================================================== schema


async def test_make_queue_tables_and_migrate_are_idempotent(db_url: str, tmp_path: Path) -> None:
    n = next(_names)
    jobs, failed = f"dbx_mig_jobs_{os.getpid()}_{n}", f"dbx_mig_failed_{os.getpid()}_{n}"
    (tmp_path / "config").mkdir()  # an app root holds config/ or app/
    app = App(
        root=tmp_path,
        queue=define_queue_config(
            default="db",
            connections={
                "db": {
                    "driver": "database",
                    "connection": "main",
                    "table": jobs,
                    "failed_table": failed,
                }
            },
        ),
        database=define_database_config(default="main", connections={"main": {"url": db_url}}),
    )
    async with app:
        db = app.database()
        try:
            path = make_queue_tables(app)
            assert path.parent == tmp_path / "database" / "migrations"
            text = path.read_text()
            # a migration that picks its DDL for the database it is applied to
            assert path.suffix == ".py" and "up = queue_tables(" in text
            assert jobs in text and failed in text
            assert make_queue_tables(app) == path, "written once"
            assert path.read_text() == text
            assert len(list(path.parent.glob("*.py"))) == 1

            first = await migrate(app)
            assert first.applied == [path.name] and first.skipped == []
            second = await migrate(app)
            assert second.applied == [] and second.skipped == [path.name]
            ledger = await db.fetchall(
                "SELECT name, applied_at FROM haze_migrations WHERE name = ?", (path.name,)
            )
            assert len(ledger) == 1 and float(ledger[0][1]) <= time.time()

            # the migrated tables are the driver's tables
            await dbx_sem_record.dispatch({"n": 1})
            assert (await db.fetchone(f"SELECT COUNT(*) FROM {jobs}"))[0] == 1
            assert await app.driver("db").reserve(["default"], 0) is not None
        finally:
            for t in (jobs, failed):
                await db.execute(f"DROP TABLE IF EXISTS {t}")
            await db.execute("DELETE FROM haze_migrations WHERE name LIKE ?", (f"%{jobs}%",))
