"""Workflow events over the signed HTTP dispatch endpoint (``http_events``), through the
real ``DispatchApp`` ASGI app: a webhook's event resumes the run waiting for it, an
event sent before the wait is kept for it, and each bad request is one clear status."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from haze import App, Workflow, define_queue_config, workflow
from haze.integrations.http_dispatch import DispatchApp, signed_headers

SECRET = "s3cret-for-events"


@workflow(name="http_events.pay")
async def pay(run: Any, order: str) -> Any:
    await run.step("intent", lambda: order)
    if order == "early":
        await run.sleep("settle", 0.3)  # the webhook arrives during this sleep
    return await run.wait_for_event("paid", timeout="1d")


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HAZE_HTTP_SECRET", SECRET)
    monkeypatch.delenv("HAZE_HTTP_MAX_BODY", raising=False)
    monkeypatch.delenv("HAZE_HTTP_JOBS", raising=False)


@pytest.fixture
async def app() -> AsyncIterator[App]:
    a = App(
        queue=define_queue_config(default="memory", connections={"memory": {"driver": "memory"}})
    )
    async with a:
        yield a


async def post(app: App, body: dict[str, Any]) -> httpx.Response:
    raw = json.dumps(body).encode()
    transport = httpx.ASGITransport(app=DispatchApp(app))
    async with httpx.AsyncClient(transport=transport, base_url="http://haze.test") as c:
        return await c.post("/dispatch", content=raw, headers=signed_headers(raw, SECRET))


async def waiting(rid: str, state: str = "waiting") -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        st = await Workflow.status(rid)
        if st is not None and st.state == state:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"run {rid} never reached {state}: {st}")


async def test_a_webhook_event_resumes_the_waiting_run(app: App) -> None:
    rid = await Workflow.start(pay, order="A-1")
    await waiting(rid)
    r = await post(app, {"event": "paid", "run": rid, "payload": {"amount": 1200}})
    assert r.status_code == 202, r.text
    assert r.json() == {"run": rid, "event": "paid", "kept": True}
    st = await Workflow.wait(rid, timeout=10)
    assert st.state == "done" and st.result == {"amount": 1200}

    again = await post(app, {"event": "paid", "run": rid, "payload": {}})
    assert again.status_code == 409 and "is done" in again.json()["error"]


async def test_an_event_sent_before_its_wait_is_kept_and_delivered(app: App) -> None:
    rid = await Workflow.start(pay, order="early")
    await waiting(rid, "sleeping")
    r = await post(app, {"event": "paid", "run": rid, "payload": "early bird"})
    assert r.status_code == 202 and r.json()["kept"] is True
    st = await Workflow.wait(rid, timeout=10)
    assert st.state == "done" and st.result == "early bird"


@pytest.mark.parametrize(
    ("body", "status", "text"),
    [
        ({"event": "paid", "run": "no-such-run"}, 404, "no workflow run 'no-such-run'"),
        ({"event": "paid"}, 400, '"run"'),
        ({"event": "", "run": "x"}, 400, '"event"'),
        ({"event": "paid", "run": "x", "delay": 5}, 400, "unknown key(s) delay"),
        ({"event": "paid", "run": 7}, 400, '"run"'),
    ],
)
async def test_bad_event_requests_are_one_clear_status(
    app: App, body: dict[str, Any], status: int, text: str
) -> None:
    r = await post(app, body)
    assert r.status_code == status, r.text
    assert text in r.json()["error"]


async def test_an_event_needs_the_same_credentials_as_a_dispatch(app: App) -> None:
    raw = json.dumps({"event": "paid", "run": "x"}).encode()
    transport = httpx.ASGITransport(app=DispatchApp(app))
    async with httpx.AsyncClient(transport=transport, base_url="http://haze.test") as c:
        r = await c.post("/dispatch", content=raw, headers=signed_headers(raw, "wrong"))
    assert r.status_code == 403
