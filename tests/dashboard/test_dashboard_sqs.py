"""The dashboard over an ``sqs`` connection (moto in server mode stands in for Amazon
SQS, as in tests/drivers/test_sqs.py): SQS cannot list or split its messages the way a
database can, and the page says so instead of guessing."""

from __future__ import annotations

import asyncio
import re
import runpy
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from haze import (
    App,
    define_cache_config,
    define_database_config,
    define_job,
    define_queue_config,
)
from haze.dashboard import create_app
from starlette.testclient import TestClient

SPEC: dict[str, Any] = runpy.run_path(str(Path(__file__).parent.parent / "drivers" / "sqs_spec.py"))


@define_job(name="dash_sqs_ok")
async def dash_sqs_ok(payload: Any) -> None:
    return None


@pytest.fixture
def make_app(tmp_path: Path) -> Iterator[Any]:
    prefix = SPEC["unique_prefix"]("dash")
    urls = SPEC["create_queues"]([f"{prefix}-default", f"{prefix}-emails"])

    def make() -> App:
        conn = {
            "driver": "sqs",
            "queue_url": f"{SPEC['endpoint']()}/{SPEC['ACCOUNT']}/{prefix}-{{queue}}",
            "endpoint_url": SPEC["endpoint"](),
            "region": SPEC["REGION"],
            "credentials": dict(SPEC["CREDENTIALS"]),
            "queues": ["default", "emails"],
        }
        return App(
            queue=define_queue_config(default="sqs", connections={"sqs": conn}, store="memory"),
            database=define_database_config(
                default="main", connections={"main": {"url": f"sqlite:///{tmp_path}/s.db"}}
            ),
        )

    yield make
    SPEC["delete_queues"](list(urls.values()))


def test_overview_on_sqs_says_what_sqs_cannot_tell(make_app: Any) -> None:
    async def fill() -> None:
        async with make_app() as app:
            for i in range(3):
                await dash_sqs_ok.dispatch({"i": i}, queue="emails")
            await app.stop()

    asyncio.run(fill())
    c = TestClient(create_app(make_app(), authorize=lambda r: True))
    html = c.get("/").text
    assert 'data-queue="emails"' in html
    assert "SQS counts are approximate" in html
    # A process-local store: no pause signal, worker record or throughput to read.
    assert "no shared store" in html
    assert "Pause" not in html
    workers = c.get("/workers").text
    assert "the queue store is local to each process" in workers
    assert c.get("/failed").status_code == 200
    assert c.get("/jobs", params={"id": "abcd1234"}).status_code == 200
    assert c.get("/metrics").status_code == 200
    # A pause posted anyway is refused with the reason (no worker could see it).
    token = re.search(r'name="csrf-token" content="([^"]+)"', c.get("/failed").text)
    r = c.post(
        "/queues/pause",
        data={"_csrf": token.group(1) if token else "", "connection": "sqs", "queue": "emails"},
        follow_redirects=False,
    )
    assert r.status_code == 303
    assert "store is local to each process" in c.get(r.headers["location"]).text


def test_overview_on_cloudflare_says_it_cannot_count(tmp_path: Path) -> None:
    # Configuration only: the page must not pretend to count a Cloudflare queue (its
    # driver only learns the backlog when it pulls), so nothing is sent anywhere.
    app = App(
        queue=define_queue_config(
            default="cf",
            connections={
                "cf": {
                    "driver": "cloudflare",
                    "account_id": "acc",
                    "queue_id": "q",
                    "api_token": "token-never-shown",
                    "failed_store": "main",
                }
            },
            store="main",
        ),
        database=define_database_config(
            default="db", connections={"db": {"url": f"sqlite:///{tmp_path}/cf.db"}}
        ),
        cache=define_cache_config(default="main", stores={"main": {"driver": "database"}}),
    )
    html = TestClient(create_app(app, authorize=lambda r: True)).get("/").text
    row = html[
        html.index('data-connection="cf"') : html.index("</tr>", html.index('data-connection="cf"'))
    ]
    assert '<td class="n waiting"><span class="na"' in row
    assert "Cloudflare Queues tell their backlog only to a consumer" in html
    assert "token-never-shown" not in html


@define_job(name="dash_sqs_slow")
async def dash_sqs_slow(payload: Any) -> None:
    await asyncio.sleep(payload["s"])


def test_lambda_sqs_handler_shows_on_the_workers_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The Lambda SQS handler has no process that outlives its invocations: its
    # environment is listed while it runs jobs, with a short lease, and drops off after.
    from haze._workers import presence
    from haze_lambda.sqs import _handle

    monkeypatch.setattr(presence, "SHORT_LEASE", 1.5)
    monkeypatch.setattr(presence, "BEAT_EVERY", 0.2)
    prefix = SPEC["unique_prefix"]("dashl")
    urls = SPEC["create_queues"]([f"{prefix}-emails"])
    url = urls[f"{prefix}-emails"] if f"{prefix}-emails" in urls else next(iter(urls.values()))

    def make() -> App:
        conn = {
            "driver": "sqs",
            "queue_url": f"{SPEC['endpoint']()}/{SPEC['ACCOUNT']}/{prefix}-{{queue}}",
            "endpoint_url": SPEC["endpoint"](),
            "region": SPEC["REGION"],
            "credentials": dict(SPEC["CREDENTIALS"]),
            "queues": ["emails"],
        }
        return App(
            queue=define_queue_config(default="sqs", connections={"sqs": conn}, store="main"),
            database=define_database_config(
                default="db", connections={"db": {"url": f"sqlite:///{tmp_path}/l.db"}}
            ),
            cache=define_cache_config(default="main", stores={"main": {"driver": "database"}}),
        )

    def workers_page() -> str:
        return c.get("/workers").text

    c = TestClient(create_app(make(), authorize=lambda r: True))
    try:

        async def invoke() -> None:
            async with make() as app:
                job_id = await dash_sqs_slow.dispatch({"s": 1.5}, queue="emails")
                got = SPEC["client"]().receive_message(
                    QueueUrl=url, MaxNumberOfMessages=1, WaitTimeSeconds=2, AttributeNames=["All"]
                )["Messages"]
                event = {
                    "Records": [
                        {
                            "messageId": m["MessageId"],
                            "receiptHandle": m["ReceiptHandle"],
                            "body": m["Body"],
                            "attributes": {"ApproximateReceiveCount": "1"},
                            "eventSourceARN": f"arn:aws:sqs:{SPEC['REGION']}:"
                            f"{SPEC['ACCOUNT']}:{prefix}-emails",
                        }
                        for m in got
                    ]
                }
                run = asyncio.ensure_future(_handle(app, event, None, time.monotonic()))
                deadline = asyncio.get_running_loop().time() + 10
                while "dash_sqs_slow" not in (page := await asyncio.to_thread(workers_page)):
                    assert asyncio.get_running_loop().time() < deadline, page
                    await asyncio.sleep(0.1)
                assert ">lambda<" in page and job_id[:8] in page
                assert (await run) == {"batchItemFailures": []}
                # Done: no longer shown running, and gone once the short lease ends.
                page = await asyncio.to_thread(workers_page)
                assert "dash_sqs_slow" not in page and ">lambda<" in page
                await asyncio.sleep(2.0)
                assert "No worker is running" in await asyncio.to_thread(workers_page)

        asyncio.run(invoke())
    finally:
        SPEC["delete_queues"](list(urls.values()))
