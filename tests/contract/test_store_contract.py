"""The Store contract (SPEC §9 "Stores"; haze.stores.base.Store): what unique locks,
middleware state and batches rely on. Parametrised over stores; adding one is one
entry in ``STORES``."""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from haze.stores import Store, create_store
from services import needs_server


async def _memory(tmp_path: Path) -> Store:
    return create_store("contract", {"driver": "memory"}, None, "test_store_contract")


_PG_URL = os.environ.get("HAZE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
_MYSQL_URL = os.environ.get("HAZE_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/")
_store_tables = itertools.count()


def _database(kind: str) -> Callable[[Path], Awaitable[Store]]:
    """A DatabaseStore on a fresh table (SQLite: a fresh file; servers: a new table in the
    server's own database, dropped when the store closes)."""

    async def factory(tmp_path: Path) -> Store:
        from haze import App, define_database_config
        from haze.stores.database import DatabaseStore

        url = {
            "sqlite": f"sqlite:///{tmp_path}/store.db",
            "postgres": _PG_URL,
            "mysql": _MYSQL_URL.rstrip("/") + "/mysql",
        }[kind]
        table = f"haze_store_contract_{os.getpid()}_{next(_store_tables)}"

        class OwningDatabaseStore(DatabaseStore):
            async def close(self) -> None:  # this test's app owns the connector: close it too
                try:
                    await self.db.execute(f"DROP TABLE IF EXISTS {self.table}")
                finally:
                    await super().close()
                    await self.db.close()

        app = App(
            database=define_database_config(default="main", connections={"main": {"url": url}})
        )
        return OwningDatabaseStore(
            "contract", {"driver": "database", "connection": "main", "table": table}, app
        )

    return factory


_needs_pg = needs_server("PostgreSQL", _PG_URL)
_needs_mysql = needs_server("MySQL/MariaDB", _MYSQL_URL)

#: id -> async factory(tmp_path) returning a fresh, empty store. Later:
#: ("redis", _redis, (needs_redis,)), ("database", _database, ()), ("kv", _kv, (...)).
STORES: list[tuple[str, Callable[[Path], Awaitable[Store]], tuple[Any, ...]]] = [
    ("memory", _memory, ()),
    ("database-sqlite", _database("sqlite"), ()),
    ("database-postgres", _database("postgres"), (_needs_pg,)),
    ("database-mariadb", _database("mysql"), (_needs_mysql,)),
    __import__("runpy").run_path(f"{Path(__file__).parent.parent}/drivers/redis_spec.py")["STORE"],
]


@pytest.fixture(params=[pytest.param(f, id=i, marks=m) for i, f, m in STORES])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    s = await request.param(tmp_path)
    try:
        yield s
    finally:
        await s.close()


# A key set with TTL is read back before it expires even on a loaded 2-core box (the
# suite runs in 4 processes next to the database servers: a round trip to MariaDB can
# take a tenth of a second there); PAST_TTL later it is gone.
TTL = 0.5
PAST_TTL = 0.7


async def test_protocol_attributes(store):
    assert isinstance(store, Store)
    assert isinstance(store.name, str)
    assert store.name
    assert isinstance(store.atomic, bool)
    assert isinstance(store.shared, bool)


async def test_get_put_roundtrip_json_values(store):
    assert await store.get("k:absent") is None
    values = {
        "k:str": "v",
        "k:int": 42,
        "k:float": 1.5,
        "k:list": [1, "a", None],
        "k:dict": {"a": {"b": [1, 2]}},
        "k:bool": True,
    }
    for k, v in values.items():
        await store.put(k, v)
    for k, v in values.items():
        assert await store.get(k) == v
    await store.put("k:str", "w")
    assert await store.get("k:str") == "w"


async def test_put_ttl_expires(store):
    await store.put("k:ttl", "v", TTL)
    ttl = await store.ttl("k:ttl")
    assert ttl is not None
    assert 0 < ttl <= TTL
    assert await store.get("k:ttl") == "v"
    await asyncio.sleep(PAST_TTL)
    assert await store.get("k:ttl") is None
    assert await store.ttl("k:ttl") is None


async def test_ttl_none_without_expiry_or_when_absent(store):
    await store.put("k:forever", 1)
    assert await store.ttl("k:forever") is None
    assert await store.ttl("k:absent") is None
    await store.put("k:forever", 2, 60)
    ttl = await store.ttl("k:forever")
    assert ttl is not None
    assert 59 < ttl <= 60


async def test_add_only_when_absent(store):
    assert await store.add("k:add", "first", 60) is True
    assert await store.add("k:add", "second", 60) is False
    assert await store.get("k:add") == "first"


async def test_add_succeeds_again_after_expiry(store):
    assert await store.add("k:lock", "a", TTL) is True
    assert await store.add("k:lock", "b", TTL) is False
    await asyncio.sleep(PAST_TTL)
    assert await store.add("k:lock", "b", TTL) is True
    assert await store.get("k:lock") == "b"


async def test_add_is_atomic_under_concurrency(store):
    results = await asyncio.gather(*(store.add("k:race", f"owner-{i}", 60) for i in range(50)))
    assert results.count(True) == 1
    winner = f"owner-{results.index(True)}"
    assert await store.get("k:race") == winner


async def test_increment(store):
    assert await store.increment("k:n") == 1
    assert await store.increment("k:n") == 2
    assert await store.increment("k:n", 5) == 7
    assert await store.increment("k:n", -10) == -3
    assert await store.get("k:n") == -3
    assert await store.increment("k:neg", -2) == -2


async def test_increment_ttl_applies_on_create_only(store):
    assert await store.increment("k:win", 1, TTL) == 1
    first = await store.ttl("k:win")
    assert first is not None
    assert 0 < first <= TTL
    assert await store.increment("k:win", 1, 60) == 2
    later = await store.ttl("k:win")
    assert later is not None
    assert later <= first, "an existing key keeps its expiry"
    await asyncio.sleep(PAST_TTL)
    assert await store.get("k:win") is None
    assert await store.increment("k:win", 3, TTL) == 3, "an expired counter starts over"


async def test_increment_without_ttl_does_not_expire(store):
    await store.increment("k:plain")
    assert await store.ttl("k:plain") is None


async def test_concurrent_increments_sum_exactly(store):
    await asyncio.gather(*(store.increment("k:sum", 1, 60) for _ in range(200)))
    await asyncio.gather(*(store.increment("k:sum", -1) for _ in range(50)))
    assert await store.get("k:sum") == 150
    values = await asyncio.gather(*(store.increment("k:seq") for _ in range(100)))
    assert sorted(values) == list(range(1, 101)), "every caller sees a distinct value"


async def test_delete(store):
    await store.put("k:del", "v")
    assert await store.delete("k:del") is True
    assert await store.get("k:del") is None
    assert await store.delete("k:del") is False


async def test_delete_checks_the_owner(store):
    await store.add("k:owned", "job-1", 60)
    assert await store.delete("k:owned", owner="job-2") is False
    assert await store.get("k:owned") == "job-1"
    assert await store.delete("k:owned", owner="job-1") is True
    assert await store.get("k:owned") is None
    assert await store.delete("k:owned", owner="job-1") is False


async def test_owner_checked_delete_does_not_release_a_new_holder(store):
    await store.add("k:relock", "old", TTL)
    await asyncio.sleep(PAST_TTL)
    assert await store.add("k:relock", "new", 60) is True
    assert await store.delete("k:relock", owner="old") is False
    assert await store.get("k:relock") == "new"


async def test_get_many(store):
    await store.put("k:m1", 1)
    await store.put("k:m2", {"x": 2})
    await store.put("k:m3", "gone", TTL)
    await asyncio.sleep(PAST_TTL)
    assert await store.get_many(["k:m1", "k:absent", "k:m2", "k:m3"]) == [1, None, {"x": 2}, None]
    assert await store.get_many([]) == []


async def test_get_many_reads_hundreds_of_keys_in_order(store):
    # A workflow run's page of step records is hundreds of keys; D1 binds at most 100
    # values a statement, so a store there must read them in parts.
    keys = [f"k:many:{i}" for i in range(250)]
    for i in range(0, 250, 3):
        await store.put(keys[i], i)
    got = await store.get_many(keys)
    assert got == [i if i % 3 == 0 else None for i in range(250)]


async def test_keys_are_independent(store):
    await store.add("k:a", 1, 60)
    assert await store.add("k:b", 2, 60) is True
    await store.increment("k:c")
    assert await store.get_many(["k:a", "k:b", "k:c"]) == [1, 2, 1]


async def test_keys_differing_in_case_accent_or_space_are_distinct(store):
    # Unique keys are often user input: Alice and alice are two users.
    keys = ["k:Alice", "k:alice", "k:jose", "k:josé", "k:tenant", "k:tenant "]
    for i, key in enumerate(keys):
        assert await store.add(key, i, 60) is True, key
    assert await store.get_many(keys) == list(range(len(keys)))
    assert await store.increment("k:Count") == 1
    assert await store.increment("k:count") == 1


async def test_long_keys_are_kept_whole(store):
    # Keys longer than any column width: never cut, so two that share a long prefix stay
    # two keys, and what add() took, delete() releases. (LONG is local: the D1 run takes
    # each test function's own source into Pyodide, without the module's globals.)
    LONG = "k:" + "x" * 300
    a, b = LONG + ":a", LONG + ":b"
    assert await store.add(a, "owner-a", 60) is True
    assert await store.add(b, "owner-b", 60) is True
    assert await store.get_many([a, b, LONG]) == ["owner-a", "owner-b", None]
    assert await store.touch(a, "owner-a", 30) is True
    ttl = await store.ttl(a)
    assert ttl is not None and ttl <= 30
    assert await store.delete(a, "owner-a") is True
    assert await store.get(a) is None
    assert await store.add(a, "again", 60) is True
    assert await store.increment(LONG + ":n", 2) == 2
    assert await store.increment(LONG + ":n", 3) == 5
    await store.put(LONG, [1])
    assert await store.get(LONG) == [1]
    assert await store.delete(LONG) is True


async def test_keys_holding_nul_are_kept_apart(store):
    # A unique, debounce or without_overlapping key is made of a payload, which may hold
    # NUL: every store takes such a key, and no two keys share a lock (PostgreSQL text
    # cannot hold NUL, so its stored form must not meet another key's).
    keys = ["k:a\x00b", "k:a\u24000b", "k:a\u2400\u24000b", "k:a\u2400\x00b", "k:a0b", "k:ab"]
    for i, key in enumerate(keys):
        assert await store.add(key, f"owner-{i}", 60) is True, repr(key)
    assert await store.add(keys[0], "other", 60) is False
    assert await store.get_many(keys) == [f"owner-{i}" for i in range(len(keys))]
    assert await store.touch(keys[0], "owner-0", 30) is True
    assert await store.delete(keys[0], "owner-0") is True
    assert await store.get(keys[0]) is None
    assert await store.get(keys[1]) == "owner-1"
    assert await store.increment("k:n\x00", 2) == 2
    await store.put("k:p\x00", {"v": "\x00"})
    assert await store.get("k:p\x00") == {"v": "\x00"}


# --------------------------------------------------------------------------- settle_batch_job
# One job of a batch counted in one atomic step (haze.batches): the per-job marker, the
# processed/failed counters and the pending decrement never exist one without the other.

B = "haze:batch:contract"


async def _batch(store: Store, pending: int) -> None:
    await store.put(f"{B}:pending", pending, 60)


async def _counters(store: Store) -> dict[str, Any]:
    names = ("pending", "processed", "failed", "cancelled", "recovered")
    values = await store.get_many([f"{B}:{n}" for n in names])
    return dict(zip(names, values, strict=True))


async def test_settle_batch_job_counts_a_job_once(store):
    await _batch(store, 2)
    first = await store.settle_batch_job(B, "j1", "done", now=1.0, ttl=60)
    assert first == (True, 1, "done")
    again = await store.settle_batch_job(B, "j1", "done", now=1.0, ttl=60)
    assert again == (False, 1, "done")
    assert await store.get(f"{B}:done:j1") == "done"
    assert await _counters(store) == {
        "pending": 1,
        "processed": 1,
        "failed": None,
        "cancelled": None,
        "recovered": None,
    }
    assert 0 < (await store.ttl(f"{B}:processed") or 0) <= 60
    assert 0 < (await store.ttl(f"{B}:done:j1") or 0) <= 60


async def test_settle_batch_job_failed_records_the_job_and_cancels(store):
    await _batch(store, 3)
    assert await store.settle_batch_job(B, "j1", "failed", cancel=True, now=5.5, ttl=60) == (
        True,
        2,
        "failed",
    )
    assert await store.settle_batch_job(B, "j2", "failed", cancel=True, now=9.0, ttl=60) == (
        True,
        1,
        "failed",
    )
    c = await _counters(store)
    assert (c["pending"], c["processed"], c["failed"]) == (1, None, 2)
    assert c["cancelled"] == 5.5, "the first failure cancels; a later one keeps that time"
    assert await store.get_many([f"{B}:failed:1", f"{B}:failed:2"]) == ["j1", "j2"]
    # a skipped job (the batch was cancelled) counts as processed
    assert await store.settle_batch_job(B, "j3", "skipped", count=1, ttl=60) == (True, 0, "skipped")
    assert (await _counters(store))["processed"] == 1


async def test_settle_batch_job_failed_then_retried_moves_to_processed_once(store):
    await _batch(store, 1)
    await store.settle_batch_job(B, "j1", "failed", ttl=60)
    for _ in range(2):  # the retried job, and a redelivery of it
        assert await store.settle_batch_job(B, "j1", "done", ttl=60) == (False, 0, "failed")
    c = await _counters(store)
    assert (c["pending"], c["processed"], c["failed"], c["recovered"]) == (0, 1, 1, 1)
    assert await store.get(f"{B}:recovered:j1") is not None
    # a job counted done that ends failed on a redelivery stays done
    await _batch(store, 1)
    await store.settle_batch_job(B, "j2", "done", ttl=60)
    assert await store.settle_batch_job(B, "j2", "failed", cancel=True, ttl=60) == (
        False,
        0,
        "done",
    )
    assert (await _counters(store))["failed"] == 1


async def test_settle_batch_job_counts_several(store):
    await _batch(store, 5)
    assert await store.settle_batch_job(B, "j1:rest", "skipped", count=3, ttl=60) == (
        True,
        2,
        "skipped",
    )
    assert await store.settle_batch_job(B, "j1:rest", "skipped", count=3, ttl=60) == (
        False,
        2,
        "skipped",
    )
    assert (await _counters(store))["processed"] == 3


async def test_settle_batch_job_is_atomic_under_concurrency(store):
    n = 40
    await _batch(store, n)
    # every job settled twice at once (a redelivery racing the first run)
    calls = [store.settle_batch_job(B, f"j{i % n}", "done", ttl=60) for i in range(2 * n)]
    results = await asyncio.gather(*calls)
    counted = [r for r in results if r.counted]
    assert len(counted) == n, "each job counted exactly once"
    assert sorted(r.pending for r in counted) == list(range(n)), "every decrement seen once"
    c = await _counters(store)
    assert (c["pending"], c["processed"]) == (0, n)


async def test_settle_batch_job_lists_the_first_jobs_it_counts(store):
    # keep=n: the n first jobs counted are listed under <batch>:jobs:<i> (the dashboard's
    # batch page), in the same atomic step; a job counted again is not listed again.
    await _batch(store, 5)
    await store.settle_batch_job(B, "j1", "done", ttl=60, keep=2)
    await store.settle_batch_job(B, "j1", "done", ttl=60, keep=2)
    await store.settle_batch_job(B, "j2", "failed", cancel=True, now=1.0, ttl=60, keep=2)
    await store.settle_batch_job(B, "j2", "done", ttl=60, keep=2)  # retried: not relisted
    await store.settle_batch_job(B, "j3", "skipped", ttl=60, keep=2)  # beyond keep
    await store.settle_batch_job(B, "j4", "done", ttl=60)  # keep=0: not listed
    assert await store.get(f"{B}:jobs") == 3
    listed = await store.get_many([f"{B}:jobs:1", f"{B}:jobs:2", f"{B}:jobs:3"])
    assert listed == ["j1", "j2", None]
    assert 0 < (await store.ttl(f"{B}:jobs:1") or 0) <= 60
    assert 0 < (await store.ttl(f"{B}:jobs") or 0) <= 60


async def test_settle_batch_job_lists_each_job_once_under_concurrency(store):
    n = 20
    await _batch(store, n)
    calls = [store.settle_batch_job(B, f"j{i % n}", "done", ttl=60, keep=n) for i in range(2 * n)]
    await asyncio.gather(*calls)
    listed = await store.get_many([f"{B}:jobs:{i}" for i in range(1, n + 1)])
    assert sorted(str(x) for x in listed) == sorted(f"j{i}" for i in range(n))
    assert await store.get(f"{B}:jobs") == n


# --------------------------------------------------------------------------- touch
# A lease renewal (limit_concurrency's slots): only the holder extends its key.


async def test_touch_renews_the_owners_lease(store):
    assert await store.add("k:lease", "run-1", TTL) is True
    assert await store.touch("k:lease", "run-1", 60) is True
    ttl = await store.ttl("k:lease")
    assert ttl is not None
    assert 59 < ttl <= 60
    await asyncio.sleep(PAST_TTL)
    assert await store.get("k:lease") == "run-1", "the renewed lease outlived its first TTL"
    assert await store.add("k:lease", "run-2", 60) is False


async def test_touch_checks_the_owner(store):
    await store.add("k:lease2", "run-1", 60)
    assert await store.touch("k:lease2", "run-2", 600) is False
    ttl = await store.ttl("k:lease2")
    assert ttl is not None
    assert ttl <= 60, "another owner's touch left the expiry alone"
    assert await store.get("k:lease2") == "run-1"


async def test_touch_does_not_revive_an_expired_or_absent_lease(store):
    assert await store.touch("k:none", "run-1", 60) is False
    assert await store.get("k:none") is None
    await store.add("k:gone", "run-1", TTL)
    await asyncio.sleep(PAST_TTL)
    assert await store.touch("k:gone", "run-1", 60) is False
    assert await store.get("k:gone") is None
    assert await store.add("k:gone", "run-2", 60) is True, "an expired lease is free to take"


async def test_touch_can_shorten_a_lease(store):
    await store.add("k:short", "run-1", 60)
    assert await store.touch("k:short", "run-1", TTL) is True
    await asyncio.sleep(PAST_TTL)
    assert await store.get("k:short") is None
