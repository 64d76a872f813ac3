"""Consumers other than ``haze queue:work`` on the dashboard's Workers page: a
``run_in_server`` worker (a real Redis queue and store), and a Cloudflare Worker's
``queue()`` run on CPython (a SQLite store; the Cloudflare runtime's message objects
are stood in for by a small class with its ``body``/``attempts``/``ack``/``retry``).
The Lambda SQS handler's case is in test_dashboard_sqs.py. Also: job lookup on a
memory connection, from a dashboard in the same process."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from haze import (
    App,
    define_cache_config,
    define_database_config,
    define_job,
    define_queue_config,
    define_redis_config,
)
from haze._base.message import Message, encode, new_id
from haze.dashboard import create_app
from haze.integrations.asgi import ServerWorker
from starlette.testclient import TestClient

sys.path.insert(0, str(Path(__file__).parent.parent / "drivers"))
from redis_spec import REDIS_URL, delete_prefix, redis_reachable, unique_prefix
from services import server_missing


@define_job(name="dash_p_slow")
async def dash_p_slow(payload: Any) -> None:
    await asyncio.sleep(payload["s"])


async def _until(c: TestClient, text: str, within: float = 10.0) -> str:
    deadline = time.monotonic() + within
    while text not in (page := (await asyncio.to_thread(c.get, "/workers")).text):
        assert time.monotonic() < deadline, page
        await asyncio.sleep(0.1)
    return page


def test_run_in_server_worker_is_listed() -> None:
    if not redis_reachable():
        server_missing("Redis", REDIS_URL)
    prefix = unique_prefix("dashp")

    def make() -> App:
        conn = {"driver": "redis", "url": REDIS_URL, "prefix": prefix, "queues": ["default"]}
        store = {"driver": "redis", "connection": "r", "prefix": f"{prefix}:store:"}
        return App(
            queue=define_queue_config(
                default="main",
                connections={"main": conn},
                store="locks",
                run_in_server={"queues": ["default"], "concurrency": 2},
            ),
            cache=define_cache_config(default="locks", stores={"locks": store}),
            redis=define_redis_config(default="r", connections={"r": {"url": REDIS_URL}}),
        )

    c = TestClient(create_app(make(), authorize=lambda r: True))

    async def scenario() -> None:
        server = ServerWorker(make(), force=True)
        await server.start()
        try:
            job_id = await dash_p_slow.dispatch({"s": 1.5})
            page = await _until(c, "dash_p_slow")
            assert job_id[:8] in page and ">worker<" in page and ">2<" in page
        finally:
            await server.stop()
        await _until(c, "No worker is running")

    try:
        asyncio.run(scenario())
    finally:
        delete_prefix(prefix + ":")


class _CfMessage:
    """What the Cloudflare runtime hands ``queue()`` for one message."""

    def __init__(self, body: str) -> None:
        self.id = new_id()
        self.body = body
        self.attempts = 1
        self.acked = False

    def ack(self) -> None:
        self.acked = True

    def retry(self, **options: Any) -> None:
        raise AssertionError(f"retried: {options}")


class _CfBatch:
    def __init__(self, queue: str, messages: list[_CfMessage]) -> None:
        self.queue = queue
        self.messages = messages


def test_cloudflare_queue_invocations_are_listed_with_a_short_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from haze._workers import presence
    from haze_cloudflare.worker import QueueWorker

    monkeypatch.setattr(presence, "SHORT_LEASE", 1.5)
    monkeypatch.setattr(presence, "BEAT_EVERY", 0.2)

    def make() -> App:
        cf = {
            "driver": "cloudflare",
            "account_id": "acc",
            "queue_id": "q",
            "api_token": "token-never-used",
            "failed_store": "main",
        }
        return App(
            queue=define_queue_config(default="cf", connections={"cf": cf}, store="main"),
            database=define_database_config(
                default="db", connections={"db": {"url": f"sqlite:///{tmp_path}/cf.db"}}
            ),
            cache=define_cache_config(default="main", stores={"main": {"driver": "database"}}),
        )

    class Consumer(QueueWorker):
        haze_app = make()

    c = TestClient(create_app(make(), authorize=lambda r: True))

    async def scenario() -> None:
        message = Message(
            id=new_id(), job="dash_p_slow", payload={"s": 1.5}, queue="jobs", connection="cf"
        )
        cf = _CfMessage(encode(message))
        run = asyncio.ensure_future(Consumer().queue(_CfBatch("jobs", [cf])))
        page = await _until(c, "dash_p_slow")
        assert ">cloudflare<" in page and message.id[:8] in page
        await run
        assert cf.acked
        page = (await asyncio.to_thread(c.get, "/workers")).text
        assert "dash_p_slow" not in page and ">cloudflare<" in page
        await _until(c, "No worker is running", within=5)

    asyncio.run(scenario())


def test_job_lookup_on_a_memory_connection() -> None:
    # A dashboard mounted in the app that runs a memory queue sees its jobs by id.
    app = App(
        queue=define_queue_config(
            default="main", connections={"main": {"driver": "memory", "queues": ["default"]}}
        )
    )
    ready = Message(id=new_id(), job="dash_p_slow", payload={"s": 0}, queue="default")
    later = Message(id=new_id(), job="dash_p_slow", payload={"s": 0}, queue="default")

    async def fill() -> None:
        driver = app.driver("main")
        await driver.enqueue(encode(ready), ready, 0)
        await driver.enqueue(encode(later), later, 3600)

    asyncio.run(fill())
    c = TestClient(create_app(app, authorize=lambda r: True))
    for message, state in ((ready, "ready"), (later, "delayed")):
        page = c.get("/jobs", params={"id": message.id}).text
        assert '<span class="badge' in page and f">{state}<" in page, page
        assert f"<code>{message.id}</code>" in page
    assert "Nothing found" in c.get("/jobs", params={"id": new_id()}).text
