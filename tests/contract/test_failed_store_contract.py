"""The failed-job store contract, on every layout and backend: a repeated id keeps one
record, a retry's claim is won by exactly one of several callers and is crash-safe,
and an unreadable record (a body nested too deeply to parse) is still listed and
forgettable, and never claimed for a retry.

Parametrised over ``FAILED_STORES``: the memory store, the SQL ``failed_jobs`` table
of a ``failed_store`` database connection (SQLite, PostgreSQL, MariaDB), the cache-store
key layout on every store of the store contract (memory, database, redis), and the
failover union. The database driver's own table and the redis driver's BullMQ sets
are covered through the drivers in test_failure_path.py."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from haze import App, define_database_config
from haze._base.message import FailedJob
from haze._failed import FailedJobsUnion, MemoryFailedJobs, SqlFailedJobs, StoreFailedJobs
from haze.contracts.failed import FailedJobStore, RetryClaims
from services import needs_server

_STORES = __import__("runpy").run_path(f"{Path(__file__).parent}/test_store_contract.py")["STORES"]
_PG_URL = os.environ.get("HAZE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
_MYSQL_URL = os.environ.get("HAZE_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/")
_tables = itertools.count()

Opened = tuple[FailedJobStore, Callable[[], Awaitable[None]]]


async def _memory(tmp_path: Path) -> Opened:
    async def close() -> None:
        return None

    return MemoryFailedJobs(), close


def _sql(kind: str) -> Callable[[Path], Awaitable[Opened]]:
    """A failed_store table on a fresh table name, limited to one connection's rows."""

    async def factory(tmp_path: Path) -> Opened:
        url = {
            "sqlite": f"sqlite:///{tmp_path}/failed.db",
            "postgres": _PG_URL,
            "mysql": _MYSQL_URL.rstrip("/") + "/mysql",
        }[kind]
        table = f"haze_failed_contract_{os.getpid()}_{next(_tables)}"
        app = App(database=define_database_config(default="m", connections={"m": {"url": url}}))
        store = SqlFailedJobs(lambda: app.database("m"), table=table, connection="c", create=True)

        async def close() -> None:
            db = app.database("m")
            await db.execute(f"DROP TABLE IF EXISTS {table}")
            await db.close()

        return store, close

    return factory


def _layout(factory: Callable[[Path], Awaitable[Any]]) -> Callable[[Path], Awaitable[Opened]]:
    async def opened(tmp_path: Path) -> Opened:
        store = await factory(tmp_path)
        return StoreFailedJobs(store, "c"), store.close

    return opened


async def _union(tmp_path: Path) -> Opened:
    first, close = await _sql("sqlite")(tmp_path)
    second = MemoryFailedJobs()
    return FailedJobsUnion(lambda: [first, second]), close


FAILED_STORES: list[tuple[str, Callable[[Path], Awaitable[Opened]], tuple[Any, ...]]] = [
    ("memory", _memory, ()),
    ("sql-sqlite", _sql("sqlite"), ()),
    ("sql-postgres", _sql("postgres"), (needs_server("PostgreSQL", _PG_URL),)),
    ("sql-mariadb", _sql("mysql"), (needs_server("MySQL/MariaDB", _MYSQL_URL),)),
    *[(f"store-{name}", _layout(factory), marks) for name, factory, marks in _STORES],
    ("union", _union, ()),
]


@pytest.fixture(params=[pytest.param(f, id=i, marks=m) for i, f, m in FAILED_STORES])
async def failed(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    store, close = await request.param(tmp_path)
    try:
        yield store
    finally:
        await close()


def _job(id: str, exception: str = "boom", body: str | None = None) -> FailedJob:
    if body is None:
        body = json.dumps({"v": 1, "id": id, "job": "j", "payload": {"n": 1}, "queue": "q"})
    return FailedJob.from_body(
        body, id=id, connection="c", queue="q", exception=exception, failed_at=time.time()
    )


async def test_a_repeated_id_keeps_one_record(failed: Any) -> None:
    await failed.record(_job("a1", "first"))
    await failed.record(_job("a1", "second"))
    listed = await failed.list()
    assert [(j.id, j.exception) for j in listed] == [("a1", "second")]
    found = await failed.find("a1")
    assert found is not None and found.exception == "second"
    assert await failed.forget("a1")
    assert await failed.find("a1") is None


async def test_one_of_three_concurrent_claims_wins(failed: Any) -> None:
    assert isinstance(failed, RetryClaims)
    await failed.record(_job("b1"))
    won = await asyncio.gather(*(failed.claim_retry("b1", f"t{i}", 60.0) for i in range(3)))
    winners = [i for i, job in enumerate(won) if job is not None]
    assert len(winners) == 1
    assert await failed.claim_retry("b1", "late", 60.0) is None  # the claim holds
    assert not await failed.retried("b1", "late")  # a loser deletes nothing
    assert await failed.find("b1") is not None
    assert await failed.retried("b1", f"t{winners[0]}")
    assert await failed.find("b1") is None
    assert not await failed.retried("b1", f"t{winners[0]}")  # the job's run: a no-op now


async def test_a_record_written_after_the_claim_stays(failed: Any) -> None:
    await failed.record(_job("c1", "first"))
    assert await failed.claim_retry("c1", "t1", 60.0) is not None
    await asyncio.sleep(0.01)  # a later failed_at
    await failed.record(_job("c1", "failed again"))  # the retried job failed before retried()
    assert not await failed.retried("c1", "t1")
    found = await failed.find("c1")
    assert found is not None and found.exception == "failed again"
    assert await failed.claim_retry("c1", "t2", 60.0) is not None  # and it can be retried


async def test_a_claim_past_its_lease_can_be_taken_over(failed: Any) -> None:
    await failed.record(_job("d1"))
    assert await failed.claim_retry("d1", "dead", 0.2) is not None  # its caller died
    assert await failed.claim_retry("d1", "alive", 0.2) is None
    await asyncio.sleep(0.3)  # past the dead claim's lease
    assert await failed.claim_retry("d1", "alive", 60.0) is not None
    assert not await failed.retried("d1", "dead")
    assert await failed.retried("d1", "alive")


def _deep(depth: int = 100_000) -> str:
    return "[" * depth + "]" * depth


async def test_an_unreadable_record_is_listed_forgettable_and_never_claimed(failed: Any) -> None:
    await failed.record(_job("e1", body=_deep()))
    await failed.record(_job("e2"))
    listed = {j.id: j for j in await failed.list()}
    assert set(listed) == {"e1", "e2"}
    assert listed["e1"].name == "<undecodable>"
    assert listed["e1"].attempt is None
    assert (await failed.find("e1")) is not None
    if isinstance(failed, (SqlFailedJobs, FailedJobsUnion)):
        assert await failed.claim_retry("e1", "t", 60.0) is None  # no envelope to claim in
    assert await failed.forget("e1")
    assert [j.id for j in await failed.list()] == ["e2"]


class _Interleaved:
    """The layout's own store, with another caller's whole retry run just before this
    caller's claim is written: the window between reading a record and claiming it."""

    def __init__(self, inner: Any, other: Callable[[], Awaitable[None]]) -> None:
        self._inner = inner
        self._other: Callable[[], Awaitable[None]] | None = other

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def add(self, key: str, value: Any, ttl: float | None = None) -> bool:
        other, self._other = self._other, None
        if other is not None and ":claim:" in key:
            await other()
        return bool(await self._inner.add(key, value, ttl))


async def test_a_record_retried_while_being_claimed_is_not_won_again(failed: Any) -> None:
    if not isinstance(failed, StoreFailedJobs):
        pytest.skip("the window between reading and claiming is the cache-store layout's")
    await failed.record(_job("f1"))
    real = failed.store
    other = StoreFailedJobs(real, "c")

    async def retry_by_another() -> None:
        assert await other.claim_retry("f1", "first", 60.0) is not None
        assert await other.retried("f1", "first")

    failed.store = _Interleaved(real, retry_by_another)
    try:
        assert await failed.claim_retry("f1", "second", 60.0) is None
    finally:
        failed.store = real
    assert await failed.find("f1") is None
