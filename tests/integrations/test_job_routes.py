"""Job routes end to end on a real backend: a SQLite ``database`` connection. A job the
``routes`` of ``config/queue.py`` send to the ``mail`` queue lands in that queue's rows
(dispatched in code and through the HTTP dispatch endpoint), a worker of ``default``
alone leaves it there, and a worker of ``mail`` runs it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from haze import (
    App,
    JobContext,
    define_database_config,
    define_job,
    define_queue_config,
)
from haze._workers.worker import Worker
from haze.connectors.migrations import ensure_queue_tables
from haze.integrations.http_dispatch import DispatchApp, signed_headers

ran: list[tuple[Any, str]] = []
SECRET = "routes-e2e-secret"


@define_job(name="routes_e2e.mail.send")
async def routes_send(payload: Any, job: JobContext) -> None:
    ran.append((payload, job.queue))


@pytest.fixture
async def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[App]:
    monkeypatch.setenv("HAZE_HTTP_SECRET", SECRET)
    ran.clear()
    a = App(
        queue=define_queue_config(
            default="db",
            connections={"db": {"driver": "database", "sleep": "10ms", "max_sleep": "50ms"}},
            routes={"routes_e2e.mail.*": {"queue": "mail"}},
        ),
        database=define_database_config(
            default="main", connections={"main": {"url": f"sqlite:///{tmp_path}/q.db"}}
        ),
    )
    async with a:
        await ensure_queue_tables(a)
        yield a


async def test_a_routed_job_lands_on_its_queue_and_a_worker_of_it_runs_it(app: App) -> None:
    await routes_send.dispatch({"n": 1})
    body = json.dumps({"job": "routes_e2e.mail.send", "payload": {"n": 2}}).encode()
    transport = httpx.ASGITransport(app=DispatchApp(app))
    async with httpx.AsyncClient(transport=transport, base_url="http://haze.test") as c:
        r = await c.post("/dispatch", content=body, headers=signed_headers(body, SECRET))
        assert r.status_code == 202, r.text
    driver = app.driver("db")
    assert await driver.size("mail") == 2
    assert await driver.size("default") == 0

    await Worker(app, "db", ["default"], sleep=0.01, stop_when_empty=True).run()
    assert ran == []  # not its queue
    await Worker(app, "db", ["mail"], sleep=0.01, stop_when_empty=True).run()
    assert sorted(p["n"] for p, _ in ran) == [1, 2]
    assert {q for _, q in ran} == {"mail"}
    assert await driver.size("mail") == 0
