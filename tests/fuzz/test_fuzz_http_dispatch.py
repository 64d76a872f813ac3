"""Fuzz the HTTP dispatch endpoint (``DispatchApp``, the rules every HTTP entrypoint
shares) through httpx's in-process ASGI transport: the method, the authentication
headers (bearer token, signature, timestamp) and the body.

Every request is answered 202 (dispatched) or 4xx with a JSON error: never a 500 and
never an exception out of the app. Dispatched jobs run on the app's memory queue.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fuzzing import fuzz, json_values
from haze import App, define_job, define_queue_config
from haze.integrations.http_dispatch import DispatchApp
from hypothesis import example, given
from hypothesis import strategies as st

SECRET = "fuzz-http-secret"


@define_job(name="fuzz_http_ok")
async def fuzz_http_ok(payload: Any) -> None:
    return None


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[asyncio.AbstractEventLoop, httpx.AsyncClient]]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HAZE_HTTP_SECRET", SECRET)
        mp.delenv("HAZE_HTTP_JOBS", raising=False)
        mp.delenv("HAZE_HTTP_MAX_BODY", raising=False)
        loop = asyncio.new_event_loop()
        app = App(
            queue=define_queue_config(
                default="memory", connections={"memory": {"driver": "memory"}}
            )
        )
        loop.run_until_complete(app.__aenter__())
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=DispatchApp(app)), base_url="http://fuzz.test"
        )
        try:
            yield loop, client
        finally:
            loop.run_until_complete(client.aclose())
            loop.run_until_complete(app.__aexit__(None, None, None))
            loop.close()


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    kind = draw(st.integers(0, 3))
    if kind == 0:
        return draw(st.binary(max_size=60))
    if kind == 1:
        return json.dumps(draw(json_values)).encode()
    keys = st.sampled_from(["job", "payload", "delay", "queue", "group", "connection", "x"])
    values = json_values | st.sampled_from(["fuzz_http_ok", "10m", "-1", "400d", "q", "", "1e400"])
    request = draw(st.dictionaries(keys, values, max_size=5))
    if draw(st.booleans()):
        request["job"] = "fuzz_http_ok"
    return json.dumps(request).encode()


def _sign(raw: bytes, stamp: str) -> str:
    mac = hmac.new(SECRET.encode(), stamp.encode() + b"." + raw, hashlib.sha256)
    return f"sha256={mac.hexdigest()}"


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, dict[str, str], bytes]:
    raw = draw(bodies())
    method = draw(st.sampled_from(["POST", "POST", "POST", "GET", "PUT", "DELETE", "PATCH"]))
    printable = st.text(st.characters(min_codepoint=32, max_codepoint=255), max_size=40)
    headers: dict[str, str] = {}
    auth = draw(st.integers(0, 4))
    if auth == 1:
        headers["authorization"] = draw(
            st.sampled_from([f"Bearer {SECRET}", "Bearer", "Basic x"]) | printable
        )
    elif auth >= 2:
        now = str(int(time.time()))
        stamp = draw(
            st.sampled_from([now, "", "0", "-1", "1e9", "\u00b2", "9" * 5000, " " + now])
            | printable
        )
        headers["x-haze-timestamp"] = stamp
        headers["x-haze-signature"] = _sign(raw, stamp.strip()) if auth == 2 else draw(printable)
    return method, headers, raw


@fuzz(300)
@given(requests())
@example(("POST", {"x-haze-timestamp": "9" * 5000, "x-haze-signature": "sha256=00"}, b"{}"))
@example(("POST", {"x-haze-timestamp": "\u00b2", "x-haze-signature": "sha256=00"}, b"{}"))
def test_a_request_is_dispatched_or_refused_with_a_4xx(
    served: tuple[asyncio.AbstractEventLoop, httpx.AsyncClient],
    request: tuple[str, dict[str, str], bytes],
) -> None:
    loop, client = served
    method, headers, raw = request
    sent = [(k.encode(), v.encode("utf-8")) for k, v in headers.items()]  # any byte a header holds
    r = loop.run_until_complete(client.request(method, "/dispatch", headers=sent, content=raw))
    assert r.status_code == 202 or 400 <= r.status_code < 500, (r.status_code, r.text)
    body = r.json()
    assert r.status_code == 202 or (isinstance(body["error"], str) and body["error"]), body
