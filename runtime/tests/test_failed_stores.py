"""haze._failed: the failed-job layouts, the one ``failed_store`` resolution, and the one
envelope parser of failed rows (``FailedJob.from_body``)."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest
from haze import App, define_cache_config, define_database_config, define_queue_config
from haze._base.message import FailedJob
from haze._failed import SqlFailedJobs, StoreFailedJobs, WarningFailedJobs, failed_target
from haze._failed import failed_store as resolve_failed_store
from haze.errors import ConfigError
from haze.stores.memory import MemoryStore


def _failed(id: str, queue: str = "default", at: float | None = None) -> FailedJob:
    body = json.dumps({"v": 1, "id": id, "job": "j", "payload": {"id": id}, "batch_id": "b1"})
    return FailedJob.from_body(
        body,
        id=id,
        connection="c",
        queue=queue,
        exception="boom",
        failed_at=time.time() if at is None else at,
    )


def test_from_body_reads_name_payload_chain_and_batch_from_the_envelope() -> None:
    body = '{"v":1,"id":"a1","job":"ping","payload":[1],"chain_id":"c","batch_id":"b"}'
    job = FailedJob.from_body(
        body, id="a1", connection="x", queue="q", exception="E", failed_at=1.0
    )
    assert (job.name, job.payload, job.chain_id, job.batch_id, job.body) == (
        "ping",
        [1],
        "c",
        "b",
        body,
    )


def test_from_body_of_a_body_that_is_no_envelope() -> None:
    def parse(body: str, name: str | None = None) -> FailedJob:
        return FailedJob.from_body(
            body, id=None, connection="x", queue="q", exception="E", failed_at=0.0, name=name
        )

    assert (parse("not json").name, parse("not json").payload) == ("<undecodable>", "not json")
    assert (parse("[1]").name, parse("[1]").payload) == ("<unknown>", "[1]")
    assert parse('{"payload": 1}').name == "<unknown>"
    assert parse('{"payload": 1}', name="bull").name == "bull"
    assert parse('{"id": "e1", "job": "j"}').id == "e1"
    assert parse('{"job": "j"}').id == ""


def test_a_bare_failed_store_name_is_a_database_connection_first() -> None:
    both = {"main": {}}
    assert failed_target("main", both, both) == ("database", "main")
    assert failed_target("store:main", both, both) == ("store", "main")
    assert failed_target("database:main", both, {}) is None
    assert failed_target("cache", {"cache": {}}, both) == ("store", "cache")
    assert failed_target("nowhere", both, both) is None


def _app(tmp_path: Path, failed_store: str) -> App:
    return App(
        queue=define_queue_config(
            default="q",
            connections={
                "q": {"driver": "sqs", "queue_url": "https://x/1/q", "failed_store": failed_store}
            },
        ),
        database=define_database_config(
            default="main", connections={"main": {"url": f"sqlite:///{tmp_path}/db.sqlite"}}
        ),
        cache=define_cache_config(
            default="main",
            stores={
                "main": {"driver": "database", "connection": "main"},
                "mem": {"driver": "memory"},
            },
        ),
    )


def test_the_resolver_picks_the_layout(tmp_path: Path) -> None:
    app = _app(tmp_path, "main")
    log = logging.getLogger("test")
    assert isinstance(resolve_failed_store("q", "main", app, log), SqlFailedJobs)
    assert isinstance(resolve_failed_store("q", "store:main", app, log), StoreFailedJobs)
    assert isinstance(resolve_failed_store("q", "mem", app, log), WarningFailedJobs)
    assert isinstance(resolve_failed_store("q", None, app, log), WarningFailedJobs)
    with pytest.raises(ConfigError, match="neither a cache store"):
        resolve_failed_store("q", "nowhere", app, log)


async def test_a_database_failed_store_keeps_its_connection_rows(tmp_path: Path) -> None:
    app = _app(tmp_path, "main")
    db = app.database("main")
    mine = SqlFailedJobs(lambda: db, connection="c", create=True)
    other = SqlFailedJobs(lambda: db, connection="d", create=True)
    await mine.record(_failed("a", at=1.0))
    await mine.record(_failed("b", "high", at=2.0))
    await other.record(FailedJob("z", "j", "d", "default", None, "x", 3.0, body="{}"))
    await mine.record(_failed("a", at=4.0))  # failed again after a retry: replaced
    assert [(j.id, j.failed_at) for j in await mine.list()] == [("b", 2.0), ("a", 4.0)]
    assert [j.id for j in await mine.list("high")] == ["b"]
    assert await mine.find("z") is None
    found = await mine.find("a")
    assert found is not None and found.batch_id == "b1" and found.payload == {"id": "a"}
    assert not await mine.forget("z")
    assert await mine.flush() == 2
    assert [j.id for j in await other.list()] == ["z"]
    await db.close()


async def test_the_store_layout_still_reads_the_cloudflare_drivers_older_index() -> None:
    store = MemoryStore()
    prefix = "haze:failed:cf:"
    # As the cloudflare driver wrote them before: one key per job, a read-modify-write index.
    for i, at in (("old1", 1.0), ("old2", 2.0)):
        body = json.dumps({"v": 1, "id": i, "job": "j", "payload": i, "chain_id": "ch"})
        row = {"id": i, "connection": "cf", "queue": "default", "body": body}
        await store.put(prefix + i, {**row, "exception": "E", "failed_at": at})
    await store.put(prefix + "index", ["old1", "old2"])

    failed = StoreFailedJobs(store, "cf")
    await failed.record(_failed("new", at=3.0))
    jobs = await failed.list()
    assert [(j.id, j.name, j.payload, j.chain_id) for j in jobs] == [
        ("old1", "j", "old1", "ch"),
        ("old2", "j", "old2", "ch"),
        ("new", "j", {"id": "new"}, None),
    ]
    old = await failed.find("old2")
    assert old is not None and old.exception == "E"
    assert await failed.forget("old1")
    assert not await failed.forget("old1")
    assert [j.id for j in await failed.list()] == ["old2", "new"]
    assert await failed.flush() == 2
    assert await failed.list() == []
    assert await store.get(prefix + "index") is None
    assert await StoreFailedJobs(store, "cf").list() == []
