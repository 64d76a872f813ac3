"""``haze.integrations.http_dispatch``: the request rules every HTTP entrypoint shares
(the server and Vercel presets, ``haze_lambda.http_handler``, the Worker's ``fetch()``),
driven through the real ``DispatchApp`` ASGI app with httpx's ASGI transport.

The presets' and adapters' own tests send the same requests through uvicorn, the Vercel
shim, awslambdaric and Pyodide; these cover the rules themselves: signed requests
(timestamp window, what the HMAC covers), env settings read at start-up, deep JSON.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from haze import App, ConfigError, Queue, define_job, define_queue_config
from haze._app.env import env_duration, env_size, parse_size
from haze._base.json_text import MAX_PAYLOAD_DEPTH
from haze.integrations.http_dispatch import (
    MAX_SKEW,
    DispatchApp,
    authorize_headers,
    max_body,
    signed_headers,
)

SECRET = "s3cret-for-tests"

ran: list[Any] = []


@define_job(name="http_dispatch_ok")
async def http_dispatch_ok(payload: Any) -> None:
    ran.append(payload)


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HAZE_HTTP_SECRET", SECRET)
    monkeypatch.delenv("HAZE_HTTP_MAX_BODY", raising=False)
    monkeypatch.delenv("HAZE_HTTP_JOBS", raising=False)
    ran.clear()


@pytest.fixture
async def app() -> AsyncIterator[App]:
    a = App(
        queue=define_queue_config(default="memory", connections={"memory": {"driver": "memory"}})
    )
    async with a:
        yield a


def client(app: App) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=DispatchApp(app)), base_url="http://haze.test"
    )


def sign(raw: bytes, timestamp: int | str, secret: str = SECRET) -> dict[str, str]:
    """Written out here (not ``signed_headers``) so that the test pins the wire format."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + raw, hashlib.sha256)
    return {"x-haze-timestamp": str(timestamp), "x-haze-signature": f"sha256={mac.hexdigest()}"}


BODY = json.dumps({"job": "http_dispatch_ok", "payload": {"n": 1}}).encode()


# --------------------------------------------------------------------------- signed requests


async def test_a_signed_request_with_a_fresh_timestamp_is_accepted(app: App) -> None:
    async with client(app) as c:
        r = await c.post("/dispatch", content=BODY, headers=sign(BODY, int(time.time())))
        assert r.status_code == 202, r.text
        # a client's clock a little behind or ahead is fine
        r = await c.post("/dispatch", content=BODY, headers=sign(BODY, int(time.time()) - 290))
        assert r.status_code == 202, r.text
        r = await c.post("/dispatch", content=BODY, headers=sign(BODY, int(time.time()) + 290))
        assert r.status_code == 202, r.text
    await Queue.idle()
    assert ran == [{"n": 1}] * 3


@pytest.mark.parametrize("skew", [-(MAX_SKEW + 5), MAX_SKEW + 5, -86400])
async def test_a_signed_request_outside_five_minutes_is_refused_with_401(
    app: App, skew: int
) -> None:
    async with client(app) as c:
        r = await c.post("/dispatch", content=BODY, headers=sign(BODY, int(time.time()) + skew))
    assert r.status_code == 401, r.text
    assert "X-Haze-Timestamp" in r.json()["error"]
    assert "5 minutes" in r.json()["error"]
    await Queue.idle()
    assert ran == []


async def test_a_captured_request_cannot_be_replayed_later(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = time.time()
    headers = sign(BODY, int(now))
    async with client(app) as c:
        assert (await c.post("/dispatch", content=BODY, headers=headers)).status_code == 202
        monkeypatch.setattr(time, "time", lambda: now + MAX_SKEW + 1)
        again = await c.post("/dispatch", content=BODY, headers=headers)
    assert again.status_code == 401


async def test_a_signed_request_without_a_timestamp_is_refused_with_401(app: App) -> None:
    old_style = hmac.new(SECRET.encode(), BODY, hashlib.sha256).hexdigest()
    async with client(app) as c:
        r = await c.post(
            "/dispatch", content=BODY, headers={"x-haze-signature": f"sha256={old_style}"}
        )
    assert r.status_code == 401, r.text
    assert "X-Haze-Timestamp" in r.json()["error"]
    await Queue.idle()
    assert ran == []


@pytest.mark.parametrize("timestamp", ["soon", "1.5e9", "", "-5", "9" * 5000])
async def test_a_malformed_timestamp_is_refused_with_401(app: App, timestamp: str) -> None:
    headers = sign(BODY, int(time.time()))
    headers["x-haze-timestamp"] = timestamp
    async with client(app) as c:
        r = await c.post("/dispatch", content=BODY, headers=headers)
    assert r.status_code == 401, r.text
    assert "X-Haze-Timestamp" in r.json()["error"]


@pytest.mark.parametrize("timestamp", ["²", "１２３", "9" * 5000])
def test_a_timestamp_of_other_digits_is_refused_with_401(timestamp: str) -> None:
    """What str.isdigit() takes and int() refuses or reads (a superscript, full-width
    digits, over Python's 4300-digit limit): a Lambda event's headers are any JSON text,
    so these reach the check without an HTTP client's ASCII encoding in between."""
    refused = authorize_headers(
        {"x-haze-timestamp": timestamp, "x-haze-signature": "sha256=00"}, SECRET
    )
    assert refused is not None and refused.status == 401
    assert "X-Haze-Timestamp must be whole Unix seconds" in refused.body["error"]


async def test_the_signature_covers_the_timestamp_and_the_body(app: App) -> None:
    now = int(time.time())
    async with client(app) as c:
        moved = sign(BODY, now - 1)
        moved["x-haze-timestamp"] = str(now)  # a fresh timestamp on an old signature
        r = await c.post("/dispatch", content=BODY, headers=moved)
        assert r.status_code == 403, r.text
        other = json.dumps({"job": "http_dispatch_ok", "payload": {"n": 2}}).encode()
        r = await c.post("/dispatch", content=other, headers=sign(BODY, now))
        assert r.status_code == 403, r.text
        assert (
            await c.post("/dispatch", content=BODY, headers=sign(BODY, now, secret="other"))
        ).status_code == 403
    await Queue.idle()
    assert ran == []


async def test_signed_headers_helper_matches_the_wire_format(app: App) -> None:
    headers = signed_headers(BODY, SECRET)
    assert headers == sign(BODY, headers["x-haze-timestamp"])
    assert abs(int(headers["x-haze-timestamp"]) - time.time()) < 5
    async with client(app) as c:
        r = await c.post("/dispatch", content=BODY, headers=headers)
    assert r.status_code == 202, r.text


async def test_bearer_tokens_are_unchanged(app: App) -> None:
    async with client(app) as c:
        ok = await c.post("/dispatch", content=BODY, headers={"authorization": f"Bearer {SECRET}"})
        assert ok.status_code == 202, ok.text
        bad = await c.post("/dispatch", content=BODY, headers={"authorization": "Bearer nope"})
        assert bad.status_code == 403
        none = await c.post("/dispatch", content=BODY)
        assert none.status_code == 401


# --------------------------------------------------------------------------- deep JSON


@pytest.mark.parametrize("depth", [200_000, 5_000, 990, MAX_PAYLOAD_DEPTH])
async def test_deeply_nested_json_is_a_400_not_a_500(app: App, depth: int) -> None:
    # the body object is one level, so a payload of MAX_PAYLOAD_DEPTH levels is one too many
    payload = "[" * depth + "]" * depth
    raw = ('{"job": "http_dispatch_ok", "payload": ' + payload + "}").encode()
    async with client(app) as c:
        r = await c.post("/dispatch", content=raw, headers={"authorization": f"Bearer {SECRET}"})
    assert r.status_code == 400, r.text
    assert "nested too deeply" in r.json()["error"]
    await Queue.idle()
    assert ran == []


async def test_nesting_up_to_the_limit_and_brackets_in_strings_are_fine(app: App) -> None:
    depth = MAX_PAYLOAD_DEPTH - 1
    nested = json.loads("[" * depth + "]" * depth)
    brackets = '[[{"\\"' * 1000  # in a string: no nesting at all
    bearer = {"authorization": f"Bearer {SECRET}"}
    async with client(app) as c:
        for payload in (nested, {"text": brackets}):
            raw = json.dumps({"job": "http_dispatch_ok", "payload": payload}).encode()
            r = await c.post("/dispatch", content=raw, headers=bearer)
            assert r.status_code == 202, r.text
    await Queue.idle()
    assert ran == [nested, {"text": brackets}]


# --------------------------------------------------------------------------- env settings


@pytest.mark.parametrize(
    ("value", "size"),
    [
        ("1048576", 1048576),
        ("10MB", 10_000_000),
        ("10mb", 10_000_000),
        ("512KiB", 524288),
        ("1.5 MiB", 1572864),
        ("1GiB", 1024**3),
        ("2kb", 2000),
        ("64B", 64),
    ],
)
def test_sizes(value: str, size: int) -> None:
    assert parse_size(value, "X") == size


@pytest.mark.parametrize("value", ["10XB", "ten", "-5", "0", "0.1B", "10 M B", "1e9"])
def test_bad_sizes_name_the_option_and_value(value: str) -> None:
    with pytest.raises(ValueError, match=f"X={value!r}"):
        parse_size(value, "X")


async def test_a_max_body_with_a_unit_is_honoured(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HAZE_HTTP_MAX_BODY", "10MB")
    assert max_body() == 10_000_000
    async with client(app) as c:
        r = await c.post("/dispatch", content=BODY, headers={"authorization": f"Bearer {SECRET}"})
        assert r.status_code == 202, r.text
    monkeypatch.setenv("HAZE_HTTP_MAX_BODY", "1KiB")
    async with client(app) as c:
        big = json.dumps({"job": "http_dispatch_ok", "payload": "x" * 1100}).encode()
        r = await c.post("/dispatch", content=big, headers={"authorization": f"Bearer {SECRET}"})
        assert r.status_code == 413, r.text
        assert "1024-byte limit" in r.json()["error"]


async def test_a_bad_max_body_stops_the_app_at_start_with_one_line(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HAZE_HTTP_MAX_BODY", "10XB")
    with pytest.raises(ConfigError) as info:
        DispatchApp(app)
    message = str(info.value)
    assert "HAZE_HTTP_MAX_BODY='10XB'" in message
    assert "512KiB" in message and "\n" not in message
    with pytest.raises(ConfigError, match="HAZE_HTTP_MAX_BODY"):
        DispatchApp(root=".")


@pytest.mark.parametrize("value", ["0", "0s", "soon"])
async def test_a_body_timeout_that_would_refuse_every_body_stops_the_app_at_start(
    app: App, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    # 0 is a duration, but a deadline of 0 answers 408 to every request with a body
    monkeypatch.setenv("HAZE_HTTP_BODY_TIMEOUT", value)
    with pytest.raises(ConfigError) as info:
        DispatchApp(app)
    assert f"HAZE_HTTP_BODY_TIMEOUT={value!r}" in str(info.value)


def test_env_durations_name_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HAZE_TEST_WAIT", "90s")
    assert env_duration("HAZE_TEST_WAIT", 5.0) == 90.0
    monkeypatch.setenv("HAZE_TEST_WAIT", "")
    assert env_duration("HAZE_TEST_WAIT", 5.0) == 5.0
    monkeypatch.setenv("HAZE_TEST_WAIT", "soon")
    with pytest.raises(ConfigError, match="HAZE_TEST_WAIT='soon'"):
        env_duration("HAZE_TEST_WAIT", 5.0)
    monkeypatch.setenv("HAZE_TEST_SIZE", "3KB")
    assert env_size("HAZE_TEST_SIZE", 1) == 3000


# --------------------------------------------------------------------------- missing tables


async def test_a_dispatch_before_the_migration_is_a_json_503_naming_the_tables(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Like /health: the database queue's tables are missing (a fresh SQLite file), so
    the answer says what to run, with no traceback in the log."""
    from haze import define_database_config

    a = App(
        queue=define_queue_config(
            default="database", connections={"database": {"driver": "database"}}
        ),
        database=define_database_config(
            default="main", connections={"main": {"url": f"sqlite:///{tmp_path}/fresh.db"}}
        ),
    )
    async with a, client(a) as c:
        health = await c.get("/health")
        r = await c.post("/dispatch", content=BODY, headers={"authorization": f"Bearer {SECRET}"})
    assert health.status_code == 503
    assert r.status_code == 503, r.text
    assert r.headers["content-type"].startswith("application/json")
    assert r.json() == {
        "error": 'the queue tables are missing on database "main": run haze '
        "make:queue-tables, then haze db:migrate"
    }
    assert not [rec for rec in caplog.records if rec.exc_info], "no traceback in the log"


async def test_a_dispatch_whose_outcome_is_unknown_is_a_504_naming_the_job(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SQL dispatch whose INSERT lost its connection while the server still ran it, and
    whose row never showed up: not a 503 saying nothing was queued (a caller retrying on
    it would queue the job twice) but a 504 saying it may be queued, with its id. The
    lost connection is injected into the real SQLite connector's execute (no server can
    lose a reply on cue)."""
    from haze import DatabaseConnectionError, define_database_config
    from haze.connectors.migrations import ensure_queue_tables
    from haze.drivers.sql import landed

    a = App(
        queue=define_queue_config(
            default="database", connections={"database": {"driver": "database"}}
        ),
        database=define_database_config(
            default="main", connections={"main": {"url": f"sqlite:///{tmp_path / 'q.db'}"}}
        ),
    )
    async with a:
        await ensure_queue_tables(a)
        db: Any = a.database("main")
        real = db.execute

        async def execute(sql: str, params: Any = ()) -> int:
            if sql.lstrip().upper().startswith("INSERT"):
                raise DatabaseConnectionError(
                    "the server still runs it (injected)", write="unsettled"
                )
            return int(await real(sql, params))

        monkeypatch.setattr(db, "execute", execute)
        monkeypatch.setattr(landed, "RESOLVE_SECONDS", 0.1)
        async with client(a) as c:
            r = await c.post(
                "/dispatch", content=BODY, headers={"authorization": f"Bearer {SECRET}"}
            )
    assert r.status_code == 504, r.text
    assert "may be" in r.json()["error"] and r.json()["id"]


async def test_a_dispatch_to_an_unreachable_backend_is_a_json_503_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A stopped PostgreSQL (a closed port): /health already says 503; dispatch answers
    the same way, one log line, and the body names no URL (it may hold a password)."""
    import socket

    from haze import define_database_config

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    a = App(
        queue=define_queue_config(
            default="database", connections={"database": {"driver": "database"}}
        ),
        database=define_database_config(
            default="main",
            connections={"main": {"url": f"postgresql://u:pw@127.0.0.1:{port}/nowhere"}},
        ),
    )
    async with a, client(a) as c:
        health = await c.get("/health")
        r = await c.post("/dispatch", content=BODY, headers={"authorization": f"Bearer {SECRET}"})
    assert health.status_code == 503
    assert r.status_code == 503, r.text
    assert r.headers["content-type"].startswith("application/json")
    assert r.json() == {
        "error": "the queue backend is unavailable (DatabaseConnectionError); nothing "
        "was queued, try again later"
    }
    assert not [rec for rec in caplog.records if rec.exc_info], "no traceback in the log"
    assert any("DatabaseConnectionError" in rec.getMessage() for rec in caplog.records)


@define_job(name="http_keyed", unique={"key": lambda p: p["order_id"]})
async def http_keyed(payload: Any) -> None:
    ran.append(payload)


async def test_a_payload_its_unique_key_function_cannot_read_is_a_400_naming_it(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    """The key function reads the caller's payload: a field it lacks is the caller's
    mistake, not a 500 with a traceback."""
    raw = json.dumps({"job": "http_keyed", "payload": {"n": 1}}).encode()
    async with client(app) as c:
        r = await c.post("/dispatch", content=raw, headers={"authorization": f"Bearer {SECRET}"})
    assert r.status_code == 400, r.text
    assert r.json() == {
        "error": "Job \"http_keyed\": its unique key function raised KeyError: 'order_id' "
        "for this payload; nothing was queued"
    }
    assert not [rec for rec in caplog.records if rec.exc_info], "no traceback in the log"
    assert ran == []


async def test_a_key_function_error_in_code_keeps_the_functions_own_error(app: App) -> None:
    from haze.errors import KeyFunctionError

    with pytest.raises(KeyFunctionError, match="unique key function raised KeyError") as e:
        await http_keyed.dispatch({"n": 1})
    assert isinstance(e.value.__cause__, KeyError)
