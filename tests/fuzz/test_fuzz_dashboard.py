"""Fuzz the dashboard's form and query handlers through httpx's in-process ASGI
transport: the actions (retry, forget, pause, continue, cancel) with any form fields,
and the pages that read a filter or an id from the query string.

Every request is answered below 500 (a page, a redirect with the error in its flash,
or a 4xx), nothing escapes the app, and an action the dashboard does not have is a 404
that changes nothing. The app runs the memory driver, with one failed job to act on.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from fuzzing import fuzz
from haze import App, Queue, define_job, define_queue_config
from hypothesis import example, given
from hypothesis import strategies as st

pytest.importorskip("starlette")
from haze.dashboard import create_app


@define_job(name="fuzz_dash_boom", tries=1)
async def fuzz_dash_boom(payload: Any) -> None:
    raise ValueError("boom")


Served = tuple[asyncio.AbstractEventLoop, httpx.AsyncClient, str, App]


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    loop = asyncio.new_event_loop()
    app = App(
        queue=define_queue_config(default="memory", connections={"memory": {"driver": "memory"}})
    )

    async def start() -> tuple[httpx.AsyncClient, str]:
        await app.__aenter__()
        await fuzz_dash_boom.dispatch({"n": 1})
        await Queue.idle()
        dashboard = create_app(app, authorize=lambda request: True)
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=dashboard), base_url="http://127.0.0.1"
        )
        page = await client.get("/")
        token = re.search(r'name="csrf-token" content="([^"]+)"', page.text)
        assert token is not None, page.text[:500]
        return client, token.group(1)

    client, token = loop.run_until_complete(start())
    try:
        yield loop, client, token, app
    finally:
        loop.run_until_complete(client.aclose())
        loop.run_until_complete(app.__aexit__(None, None, None))
        loop.close()


FIELDS = ["connection", "queue", "id", "all", "job", "exception", "since", "until", "next", "x"]
values = st.sampled_from(
    ["memory", "default", "1", "", " ", "2h", "-1h", "9" * 400, "2026-01-31", "0001-01-01T00:00+14:00",
     "9999-12-31T23:59-14:00", "/failed", "//evil.test", "https://evil.test/", "/\\evil", "x" * 300]
) | st.text(max_size=20)  # fmt: skip
ACTIONS = ["/failed/retry", "/failed/forget", "/queues/pause", "/queues/continue",
           "/batches/b1/cancel", "/batches/b1/retry"]  # fmt: skip
UNKNOWN = ["/failed/purge", "/failed/retryx", "/queues/resume", "/batches/b1/delete"]


@st.composite
def posts(draw: st.DrawFn) -> tuple[str, list[tuple[str, str]]]:
    path = draw(st.sampled_from(ACTIONS + UNKNOWN))
    form = draw(st.lists(st.tuples(st.sampled_from(FIELDS), values), max_size=6))
    return path, form


@fuzz(250)
@given(posts())
@example(("/failed/purge", [("all", "1")]))
@example(("/failed/retry", [("all", "1"), ("since", "0001-01-01T00:00+14:00")]))
def test_an_action_with_any_form_is_answered_below_500(
    served: Served, post: tuple[str, list[tuple[str, str]]]
) -> None:
    loop, client, token, _ = served
    path, form = post
    body = urlencode([*form, ("_csrf", token)]).encode()
    kind = {"content-type": "application/x-www-form-urlencoded"}
    r = loop.run_until_complete(client.post(path, content=body, headers=kind))
    assert r.status_code < 500, (r.status_code, r.text[:300])
    if path in UNKNOWN:
        assert r.status_code == 404, (path, r.status_code)


@st.composite
def gets(draw: st.DrawFn) -> str:
    page = draw(st.sampled_from(["/failed", "/jobs", "/failed/memory/x", "/batches/b1", "/"]))
    query = draw(st.lists(st.tuples(st.sampled_from(FIELDS), values), max_size=5))
    return page + "?" + urlencode(query) if query else page


@fuzz(200)
@given(gets())
@example("/failed?since=0001-01-01T00%3A00%2B14%3A00")
@example("/failed?until=9999-12-31T23%3A59-14%3A00")
def test_a_page_with_any_query_is_answered_below_500(served: Served, path: str) -> None:
    loop, client, _, _ = served
    r = loop.run_until_complete(client.get(path))
    assert r.status_code < 500, (r.status_code, r.text[:300])
