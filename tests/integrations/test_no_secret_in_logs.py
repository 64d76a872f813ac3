"""No log line and no error text carries a secret: the app key, the HTTP dispatch
secret, a database or Redis password in a URL, or an encrypted job's plaintext.

One representative run captures every log record (DEBUG, every logger, with its
traceback) and every error text haze hands back (exceptions, HTTP error bodies, failed
job records): jobs dispatched over the HTTP endpoint (bearer and signed, right and
wrong credentials), run, failed, retried and failed for good; an encrypted job taken
by a worker with another key; then connections to PostgreSQL, MariaDB, Redis and libSQL
URLs with passwords whose servers refuse them or do not answer, and config errors
about such URLs. The libSQL and wrong-key paths are checked as they are today (clean);
changes to their error texts are made elsewhere, and must keep this test green.
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from haze import (
    App,
    Queue,
    define_database_config,
    define_job,
    define_queue_config,
    define_redis_config,
)
from haze._base.crypto import generate_key
from haze.integrations.http_dispatch import DispatchApp, signed_headers

APP_KEY = generate_key()
HTTP_SECRET = "http-secret-7Qv2LmZ"
DB_PASSWORD = "db-pass-Xk41Rw9"
PLAINTEXT = "card-4111-PLAINTEXT"
SECRETS = {
    "app key": APP_KEY,
    "app key bytes": APP_KEY.removeprefix("base64:"),
    "HTTP secret": HTTP_SECRET,
    "database password": DB_PASSWORD,
    "plaintext": PLAINTEXT,
}

calls: dict[str, int] = {}


@define_job(name="secret_flaky", encrypted=True, tries=2)
async def secret_flaky(payload: dict[str, Any]) -> None:
    calls["flaky"] = calls.get("flaky", 0) + 1
    if calls["flaky"] == 1:
        raise RuntimeError("the card was declined")  # no payload in the error: haze's own text


@define_job(name="secret_final", encrypted=True, tries=1)
async def secret_final(payload: dict[str, Any]) -> None:
    raise RuntimeError("declined for good")


class Texts:
    """Every text this test saw: log records with their tracebacks, and errors."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str]] = []

    def error(self, where: str, e: BaseException) -> None:
        self.items.append((where, "".join(traceback.format_exception(e))))

    def add(self, where: str, text: str) -> None:
        self.items.append((where, text))

    def leaks(self) -> list[str]:
        return [
            f"{what} in {where}: {text[:300]!r}"
            for where, text in self.items
            for what, secret in SECRETS.items()
            if secret in text
        ]


@pytest.fixture
def texts(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> Iterator[Texts]:
    monkeypatch.setenv("HAZE_HTTP_SECRET", HTTP_SECRET)
    monkeypatch.delenv("HAZE_HTTP_JOBS", raising=False)
    calls.clear()
    caplog.set_level(logging.DEBUG)
    seen = Texts()
    yield seen
    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
    for record in caplog.get_records("setup") + caplog.get_records("call"):
        seen.add(f"log {record.name}", formatter.format(record))
    assert not seen.leaks(), "\n".join(seen.leaks())


async def _http_requests(app: App, texts: Texts) -> None:
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=DispatchApp(app)), base_url="http://haze.test"
    )
    flaky = b'{"job": "secret_flaky", "payload": {"card": "%s"}}' % PLAINTEXT.encode()
    final = b'{"job": "secret_final", "payload": {"card": "%s"}}' % PLAINTEXT.encode()
    async with client:
        bearer = {"authorization": f"Bearer {HTTP_SECRET}"}
        requests: list[tuple[bytes, dict[str, str], int]] = [
            (flaky, bearer, 202),
            (final, signed_headers(final, HTTP_SECRET), 202),
            (flaky, {"authorization": f"Bearer {HTTP_SECRET}x"}, 403),
            (flaky, signed_headers(flaky, HTTP_SECRET, timestamp=1), 401),
            (flaky.replace(b"secret_flaky", b"secret_nope"), bearer, 404),
            (b'{"job": "secret_flaky", "payload": {"card": "' + PLAINTEXT.encode(), bearer, 400),
        ]
        for raw, headers, status in requests:
            r = await client.post("/dispatch", content=raw, headers=headers)
            assert r.status_code == status, r.text
            texts.add(f"HTTP {status}", r.text)


async def test_dispatch_work_fail_and_retry_log_no_secret(
    texts: Texts, caplog: pytest.LogCaptureFixture
) -> None:
    app = App(
        key=APP_KEY,
        queue=define_queue_config(default="memory", connections={"memory": {"driver": "memory"}}),
    )
    async with app:
        await _http_requests(app, texts)
        await Queue.idle()
        failed = await Queue.failed()
        assert [f.name for f in failed] == ["secret_final"]
        await app.manager.retry([failed[0].id])
        await Queue.idle()
        for f in await Queue.failed():
            texts.add("failed record", f"{f.exception} {f.payload!r}")
    assert calls["flaky"] == 2
    debug = [r for r in caplog.records if r.levelno == logging.DEBUG]
    assert debug and len(caplog.records) > 5, "the capture sees too little of the run"


def _urls(port: int) -> dict[str, str]:
    return {
        "postgres": f"postgresql://haze:{DB_PASSWORD}@127.0.0.1:{port}/haze",
        "mariadb": f"mysql://root:{DB_PASSWORD}@127.0.0.1:{port}/haze",
    }


async def _try(texts: Texts, where: str, action: Any) -> None:
    try:
        await asyncio.wait_for(action(), 20)
    except Exception as e:  # what a user sees: the text of whatever it raised
        texts.error(where, e)
    else:
        raise AssertionError(f"{where}: expected an error")


@pytest.mark.parametrize(
    ("name", "url"),
    [
        *[(f"{n} closed port", u) for n, u in _urls(1).items()],
        ("postgres wrong password", f"postgresql://postgres:{DB_PASSWORD}@127.0.0.1:5432/nope"),
        ("mariadb wrong password", f"mysql://root:{DB_PASSWORD}@127.0.0.1:3306/haze"),
        ("bad scheme", f"postgress://haze:{DB_PASSWORD}@127.0.0.1/haze"),
        ("libsql closed port", f"libsql://haze:{DB_PASSWORD}@127.0.0.1:1"),
    ],
)
async def test_a_database_that_refuses_logs_no_password(texts: Texts, name: str, url: str) -> None:
    async def dispatch() -> None:
        app = App(
            key=APP_KEY,
            database=define_database_config(default="main", connections={"main": {"url": url}}),
            queue=define_queue_config(
                default="db", connections={"db": {"driver": "database", "connection": "main"}}
            ),
        )
        async with app:
            await secret_flaky.dispatch({"card": PLAINTEXT})

    await _try(texts, name, dispatch)


async def test_a_redis_that_refuses_logs_no_password(texts: Texts) -> None:
    for where, url in [
        ("redis closed port", f"redis://:{DB_PASSWORD}@127.0.0.1:1/0"),
        ("redis wrong password", f"redis://nobody:{DB_PASSWORD}@127.0.0.1:6379/0"),
    ]:

        async def dispatch(url: str = url) -> None:
            app = App(
                key=APP_KEY,
                redis=define_redis_config(default="r", connections={"r": {"url": url}}),
                queue=define_queue_config(
                    default="q", connections={"q": {"driver": "redis", "connection": "r"}}
                ),
            )
            async with app:
                await secret_flaky.dispatch({"card": PLAINTEXT})

        await _try(texts, where, dispatch)


async def test_an_encrypted_job_under_another_key_logs_no_key_or_plaintext(
    texts: Texts, tmp_path: Path
) -> None:
    """A worker whose APP_KEY is not the one the job was encrypted with fails it: the
    failure names the job, not either key, and cannot show the plaintext."""
    from haze._workers.worker import Worker
    from haze.connectors.migrations import ensure_queue_tables

    other = generate_key()
    SECRETS["other app key"] = other

    def app(key: str) -> App:
        url = f"sqlite:///{tmp_path}/q.db"
        return App(
            key=key,
            database=define_database_config(default="main", connections={"main": {"url": url}}),
            queue=define_queue_config(
                default="db", connections={"db": {"driver": "database", "connection": "main"}}
            ),
        )

    try:
        async with app(APP_KEY) as producer:
            await ensure_queue_tables(producer)
            await secret_final.dispatch({"card": PLAINTEXT})
        async with app(other) as consumer:
            await Worker(consumer, "db", ["default"], stop_when_empty=True).run()
            failed = await consumer.driver("db").failed.list()
        assert len(failed) == 1 and "cannot decrypt" in failed[0].exception
        texts.add("failed record", failed[0].exception)
    finally:
        SECRETS.pop("other app key")
