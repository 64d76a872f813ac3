"""The dashboard over a ``cloudflare`` connection that talks to Cloudflare's REST API,
against a local STAND-IN of that API (no real Cloudflare peer can run here).

What is real here: ``haze.dashboard.create_app`` (driven through starlette's TestClient),
haze's REST producer, the HTTP pull consumer (the real ``Worker``), and the D1 REST
connector under the failed-job store, all over real HTTP (httpx).

What is a stand-in: the server. ``cf_standin.py`` implements the documented Cloudflare
endpoints (``queues/{id}/messages``, ``/messages/pull``, ``/messages/ack``,
``d1/database/{id}/query`` on a real SQLite file) and their envelopes, as in
``test_cf_rest.py``; it is not Cloudflare, and anything Cloudflare does beyond those
documented shapes is not checked here.

A Cloudflare queue tells its backlog only to a consumer as it pulls, cannot split it by
state, and cannot find a job by id: the pages say so instead of guessing.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cf_standin import ACCOUNT, D1_ID, QUEUE_ID, TOKEN, StandIn
from haze import App, Queue, define_database_config, define_job, define_queue_config
from haze._engine.control import paused_queues
from haze._workers.worker import Worker
from haze.dashboard import create_app
from starlette.testclient import TestClient

ran: list[str] = []


@define_job(tries=1)
async def cf_dash_boom(payload: dict[str, Any]) -> None:
    ran.append(payload["n"])
    raise ValueError(f"cf dash boom {payload['n']}")


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[StandIn]:
    ran.clear()
    with StandIn(str(tmp_path / "d1.sqlite"), max_retries=5) as s:
        yield s


def make_app(standin: StandIn) -> App:
    return App(
        queue=define_queue_config(
            default="cloudflare",
            connections={
                "cloudflare": {
                    "driver": "cloudflare",
                    "account_id": ACCOUNT,
                    "queue_id": QUEUE_ID,
                    "api_token": TOKEN,
                    "api_url": standin.api_url,
                    "failed_store": "d1",
                    "visibility_timeout": "10s",
                }
            },
        ),
        database=define_database_config(
            default="d1",
            connections={
                "d1": {
                    "url": f"d1://{ACCOUNT}/{D1_ID}",
                    "api_token": TOKEN,
                    "options": {"api_url": standin.api_url, "timeout": 5},
                }
            },
        ),
    )


async def wait_for(cond: Callable[[], bool], limit: float = 15.0) -> None:
    deadline = time.monotonic() + limit
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        await asyncio.sleep(0.05)


def fail_jobs(standin: StandIn, names: list[str]) -> list[str]:
    """Dispatch one failing job per name over REST and let a pull consumer fail them
    for good (into the failed store on D1 over REST)."""

    async def go() -> list[str]:
        async with make_app(standin) as app:
            ids = [await cf_dash_boom.dispatch({"n": n}) for n in names]
            worker = Worker(app, "cloudflare", None, 1, sleep=0.05, max_sleep=0.2)
            worker.start()
            try:
                await wait_for(lambda: len(ran) == len(names) and not standin.queue.messages)
            finally:
                await worker.stop()
            assert sorted(j.id for j in await Queue.failed()) == sorted(ids)
            return ids

    return asyncio.run(go())


def client(standin: StandIn, **options: Any) -> TestClient:
    options.setdefault("authorize", lambda request: True)
    return TestClient(create_app(make_app(standin), **options), follow_redirects=False)


def csrf(page_html: str) -> str:
    m = re.search(r'name="_csrf" value="([^"]+)"', page_html)
    assert m, "no CSRF field in the page"
    return m.group(1)


def pushed(standin: StandIn) -> list[dict[str, Any]]:
    return [body["body"] for rest, body in standin.queue.requests if rest == "/messages"]


def test_overview_counts_what_cloudflare_can_answer(standin: StandIn) -> None:
    fail_jobs(standin, ["one", "two"])
    pulls = len([r for r, _ in standin.queue.requests if r == "/messages/pull"])
    with client(standin) as c:
        r = c.get("/")
        metrics = c.get("/metrics").text
    assert r.status_code == 200
    html = r.text
    assert "Traceback" not in html
    start = html.index('data-connection="cloudflare" data-queue="default"')
    row = html[start : html.index("</tr>", start)]
    # The failed count comes from the failed store (D1 over REST): it can be counted.
    assert re.search(r'<td class="n failed"><a href="[^"]*">2</a></td>', row), row
    # The backlog, and its ready/delayed/running split, cannot: shown as n/a, not 0.
    assert '<td class="n waiting"><span class="na"' in row
    assert row.count('title="this backend does not report it">n/a</span>') == 4, row
    assert "the cloudflare driver cannot count jobs by state" in row
    assert "Cloudflare Queues tell their backlog only to a consumer" in html
    # The queue store is the D1 database (over REST), shared with the worker: its
    # per-minute counts give the last hour (both finished jobs failed for good).
    assert '<span class="muted finished-hour">2</span>' in row
    assert 'title="2 failed of 2 finished">100.0%</td>' in row
    assert '<td class="state">running</td>' in row
    # The page did not pull (a pull would hide the messages from the real consumers).
    assert len([r for r, _ in standin.queue.requests if r == "/messages/pull"]) == pulls
    assert TOKEN not in html and TOKEN not in metrics


def test_pause_and_continue_through_the_d1_store(standin: StandIn) -> None:
    with client(standin) as c:
        token = csrf(c.get("/").text)
        form = {"_csrf": token, "connection": "cloudflare", "queue": "default"}
        assert c.post("/queues/pause", data=form).status_code == 303
        assert '<span class="badge warn">paused</span>' in c.get("/").text

        async def paused() -> bool:
            async with make_app(standin) as app:
                return "default" in await paused_queues(app, "cloudflare", ["default"])

        assert asyncio.run(paused()) is True
        assert c.post("/queues/continue", data=form).status_code == 303
        assert '<td class="state">running</td>' in c.get("/").text
        assert asyncio.run(paused()) is False


def test_failed_job_is_searched_and_retried_onto_the_queue(standin: StandIn) -> None:
    alpha, beta = fail_jobs(standin, ["alpha", "beta"])
    sent_before = len(pushed(standin))
    with client(standin) as c:
        listed = c.get("/failed")
        assert listed.status_code == 200
        assert alpha in listed.text and beta in listed.text
        page = c.get("/failed", params={"exception": "cf dash boom beta"})
        assert page.status_code == 200
        assert "1 failed job(s) match." in page.text
        assert beta in page.text and alpha not in page.text
        detail = c.get(f"/failed/cloudflare/{beta}").text
        assert "ValueError: cf dash boom beta" in detail
        token = csrf(page.text)
        # Without the token the retry is refused, and nothing is sent.
        assert (
            c.post("/failed/retry", data={"connection": "cloudflare", "id": beta}).status_code
            == 403
        )
        assert len(pushed(standin)) == sent_before
        r = c.post("/failed/retry", data={"_csrf": token, "connection": "cloudflare", "id": beta})
        assert r.status_code == 303
        assert "Retried 1 failed job(s)." in c.get(r.headers["location"]).text
        left = c.get("/failed").text
        assert alpha in left and beta not in left
    # The retried job went back onto the stand-in's queue over REST.
    (again,) = pushed(standin)[sent_before:]
    assert again["id"] == beta and again["job"] == "cf_dash_boom"
    assert again["payload"] == {"n": "beta"}
    assert [m.body["id"] for m in standin.queue.messages] == [beta]
    assert any("DELETE FROM failed_jobs" in s for s in standin.d1.statements)


def test_job_lookup_says_cloudflare_cannot_find_a_job_by_id(standin: StandIn) -> None:
    (failed_id,) = fail_jobs(standin, ["look"])

    async def queued() -> str:
        async with make_app(standin):
            return await cf_dash_boom.dispatch({"n": "queued"})

    queued_id = asyncio.run(queued())
    with client(standin) as c:
        html = c.get("/jobs", params={"id": queued_id}).text
        assert "Nothing found" in html
        limits = html[html.index('id="lookup-limits"') :]
        assert "&#34;cloudflare&#34; (cloudflare): this driver cannot look up a queued" in limits
        # The job is on the stand-in's queue all the same: the page does not guess.
        assert any(m.body["id"] == queued_id for m in standin.queue.messages)
        # A failed job is still found, through the failed store.
        found = c.get("/jobs", params={"id": failed_id[:8]}).text
        assert f"<code>{failed_id}</code>" in found


def test_unauthorised_request_gets_403(standin: StandIn, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HAZE_ENV", raising=False)
    monkeypatch.delenv("APP_ENV", raising=False)
    before = len(standin.queue.requests) + len(standin.d1.statements)
    with TestClient(create_app(make_app(standin)), follow_redirects=False) as denied:
        for path in ("/", "/failed", "/jobs?id=x", "/metrics"):
            r = denied.get(path)
            assert r.status_code == 403, path
            assert "<html" not in r.text
        assert denied.post("/failed/retry", data={"all": "1"}).status_code == 403
    refused = TestClient(create_app(make_app(standin), authorize=lambda request: False))
    assert refused.get("/failed").status_code == 403
    # Nothing reached the backend for a denied request.
    assert len(standin.queue.requests) + len(standin.d1.statements) == before
