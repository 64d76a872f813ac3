"""Harness (d): the REST clients outside a Worker, against a local STAND-IN of the API.

What is real here: haze's REST producer, HTTP pull consumer (driven by the real
``haze.worker.Worker`` and by the real ``haze queue:work`` CLI in a subprocess), the D1
REST connector and the database driver on top of it, all over real HTTP (httpx).

What is a stand-in: the server. ``cf_standin.py`` implements the documented Cloudflare
endpoints (``queues/{id}/messages``, ``/messages/batch``, ``/messages/pull`` with
base64 JSON bodies, ``/messages/ack`` with acks and retries, ``d1/database/{id}/query``
on a real SQLite file) and their envelopes; it is not Cloudflare, and anything Cloudflare
does beyond those documented shapes is not checked here.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cf_standin import ACCOUNT, D1_ID, QUEUE_ID, TOKEN, StandIn
from haze import (
    App,
    JobContext,
    Queue,
    define_database_config,
    define_job,
    define_queue_config,
)
from haze._base.errors import (
    ConfigError,
    DatabaseConnectionError,
    DelayTooLongError,
    PayloadTooLargeError,
)
from haze._workers.worker import Worker
from haze.connectors.d1 import D1Connector, D1Error

ROOT = Path(__file__).resolve().parents[3]

seen: dict[str, list[int]] = {}


def _note(name: str, job: JobContext) -> None:
    seen.setdefault(name, []).append(job.attempt)


@define_job()
async def cf_rest_ok(payload: dict[str, Any], job: JobContext) -> None:
    _note("ok", job)


@define_job(tries=3, backoff=1)
async def cf_rest_flaky(payload: dict[str, Any], job: JobContext) -> None:
    _note("flaky", job)
    if job.attempt == 1:
        raise RuntimeError("first attempt fails")


@define_job(tries=3, backoff=1)
async def cf_rest_release(payload: dict[str, Any], job: JobContext) -> None:
    _note("release", job)
    n = len(seen["release"])
    if n == 1:
        raise RuntimeError("fails once: a retry uses a try")
    if n == 2:
        job.release(1)  # re-sent as a new message, no try used


@define_job(tries=2, backoff=1)
async def cf_rest_dead(payload: dict[str, Any], job: JobContext) -> None:
    _note("dead", job)
    raise ValueError(f"always fails {payload['n']}")


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[StandIn]:
    seen.clear()
    with StandIn(str(tmp_path / "d1.sqlite"), max_retries=5) as s:
        yield s


def d1_connection(standin: StandIn) -> dict[str, Any]:
    return {
        "url": f"d1://{ACCOUNT}/{D1_ID}",
        "api_token": TOKEN,
        "options": {"api_url": standin.api_url, "timeout": 5},
    }


def cf_connection(standin: StandIn, **extra: Any) -> dict[str, Any]:
    return {
        "driver": "cloudflare",
        "account_id": ACCOUNT,
        "queue_id": QUEUE_ID,
        "api_token": TOKEN,
        "api_url": standin.api_url,
        "failed_store": "d1",
        "visibility_timeout": "10s",
        **extra,
    }


def make_app(standin: StandIn, **extra: Any) -> App:
    return App(
        queue=define_queue_config(
            default="cloudflare", connections={"cloudflare": cf_connection(standin, **extra)}
        ),
        database=define_database_config(default="d1", connections={"d1": d1_connection(standin)}),
    )


def sent(standin: StandIn, path: str) -> list[dict[str, Any]]:
    return [body for rest, body in standin.queue.requests if rest == path]


async def wait_for(cond: Callable[[], bool], limit: float = 15.0) -> None:
    deadline = time.monotonic() + limit
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        await asyncio.sleep(0.05)


# --------------------------------------------------------------------------- producer


async def test_rest_producer_send_delay_and_limits(standin: StandIn) -> None:
    async with make_app(standin):
        job_id = await cf_rest_ok.dispatch({"n": 1, "none": None})
        await cf_rest_ok.dispatch({"n": 2}, delay=90)
        await cf_rest_ok.dispatch({"n": 3}, delay="200ms")  # whole seconds, rounded up

        with pytest.raises(DelayTooLongError, match=r"12-hour \(43200 s\) limit"):
            await cf_rest_ok.dispatch({"n": 4}, delay="13h")
        with pytest.raises(PayloadTooLargeError, match="128000-byte limit"):
            await cf_rest_ok.dispatch({"blob": "x" * 132_000})

    one = sent(standin, "/messages")
    assert len(one) == 3, "nothing may be enqueued for the refused dispatches"
    first = one[0]
    assert first["content_type"] == "json"
    assert "delay_seconds" not in first
    assert first["body"]["id"] == job_id
    assert first["body"]["job"] == "cf_rest_ok"
    assert first["body"]["payload"] == {"n": 1, "none": None}
    assert [m.get("delay_seconds") for m in one[1:]] == [90, 1]


async def test_rest_producer_bulk_uses_messages_batch(standin: StandIn) -> None:
    async with make_app(standin):
        ids = await Queue.bulk([cf_rest_ok.with_({"i": i}) for i in range(150)])
    batches = sent(standin, "/messages/batch")
    assert [len(b["messages"]) for b in batches] == [100, 50]  # Cloudflare: 100 per call
    bodies = [m["body"] for b in batches for m in b["messages"]]
    assert [b["id"] for b in bodies] == ids
    assert [b["payload"]["i"] for b in bodies] == list(range(150))
    assert all(m["content_type"] == "json" for b in batches for m in b["messages"])
    assert sent(standin, "/messages") == []


async def test_rest_bulk_a_refused_call_after_another_names_the_messages_not_queued(
    standin: StandIn,
) -> None:
    from haze import DispatchIncompleteError

    push = standin.queue.push

    def refusing(msg: dict[str, Any], default_delay: int = 0) -> None:
        if msg["body"]["payload"].get("refuse"):  # the first message of the second call
            raise ValueError("refused by the stand-in")  # answered 400
        push(msg, default_delay)

    standin.queue.push = refusing  # type: ignore[method-assign]
    async with make_app(standin):
        jobs = [cf_rest_ok.with_({"i": i, "refuse": i == 100}) for i in range(150)]
        with pytest.raises(DispatchIncompleteError) as e:
            await Queue.bulk(jobs)
    assert len(e.value.failed) == 50 and "100 of 150" in str(e.value), str(e.value)[:300]
    assert len(standin.queue.messages) == 100


# --------------------------------------------------------------------------- pull consumer


async def test_pull_consumer_success_retry_release_and_failure(standin: StandIn) -> None:
    async with make_app(standin, concurrency=2) as app:
        await cf_rest_ok.dispatch({"n": 1})
        await cf_rest_flaky.dispatch({"n": 2})
        await cf_rest_release.dispatch({"n": 3})
        dead_id = await cf_rest_dead.dispatch({"n": 4})

        worker = Worker(app, "cloudflare", None, 2, sleep=0.05, max_sleep=0.2)
        worker.start()
        try:
            await wait_for(
                lambda: (
                    len(seen.get("release", [])) == 3
                    and len(seen.get("dead", [])) == 2
                    and len(seen.get("flaky", [])) == 2
                    and not standin.queue.messages
                )
            )
        finally:
            await worker.stop()

        failed = await Queue.failed()

    assert seen["ok"] == [1]
    assert seen["flaky"] == [1, 2]
    # retry (attempt 1 → 2), then release at attempt 2 re-runs as attempt 2 (no try used)
    assert seen["release"] == [1, 2, 2]
    assert seen["dead"] == [1, 2]

    q = standin.queue
    assert not q.messages
    assert not q.dead_letter
    # every retry carried haze's backoff as delay_seconds
    assert sorted(d for _, d in q.retried) == [1, 1, 1]
    # the release went out as a new message carrying the try already used
    (resent,) = sent(standin, "/messages")[4:]
    assert resent["body"]["job"] == "cf_rest_release"
    assert resent["body"]["attempts"] == 1
    assert resent["delay_seconds"] == 1
    # pulls asked for the configured visibility timeout
    pulls = sent(standin, "/messages/pull")
    assert pulls
    assert all(p["visibility_timeout_ms"] == 10_000 for p in pulls)

    # the final failure is in the failed store (D1 over REST), and was acked
    (f,) = failed
    assert f.id == dead_id
    assert f.name == "cf_rest_dead"
    assert f.payload == {"n": 4}
    assert "always fails 4" in f.exception
    assert any("INSERT INTO failed_jobs" in s for s in standin.d1.statements)


async def test_failed_job_retry_goes_back_through_rest(standin: StandIn) -> None:
    async with make_app(standin) as app:
        dead_id = await cf_rest_dead.dispatch({"n": 5})
        worker = Worker(app, "cloudflare", None, 1, sleep=0.05, max_sleep=0.2)
        worker.start()
        try:
            await wait_for(lambda: len(seen.get("dead", [])) == 2 and not standin.queue.messages)
        finally:
            await worker.stop()
        assert [f.id for f in await Queue.failed()] == [dead_id]
        assert await Queue.retry(dead_id) == [dead_id]
        assert await Queue.failed() == []
    again = sent(standin, "/messages")[-1]
    assert again["body"]["id"] == dead_id
    assert "attempts" not in again["body"]


async def test_pulled_body_is_base64_json(standin: StandIn) -> None:
    async with make_app(standin) as app:
        job_id = await cf_rest_ok.dispatch({"n": "é"})
        raw = standin.queue.pull(1, 1000)["messages"][0]
        assert json.loads(base64.b64decode(raw["body"]))["id"] == job_id
        driver = app.driver("cloudflare")
        reserved = driver.reserved_from_pull(raw, driver.rest())  # type: ignore[attr-defined]
        assert reserved.message is not None
        assert reserved.message.payload == {"n": "é"}
        assert reserved.attempt == 1


# --------------------------------------------------------------------------- D1 REST


async def test_d1_rest_connector(standin: StandIn) -> None:
    db = D1Connector("d1", d1_connection(standin))
    try:
        await db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, n INTEGER, x REAL, s TEXT)")
        assert await db.execute("INSERT INTO t (n, x, s) VALUES (?, ?, ?)", (42, 1.5, None)) == 1
        assert (
            await db.executemany(
                "INSERT INTO t (n, x, s) VALUES (?, ?, ?)", [(1, 2.0, "a"), (2, 3.25, "b")]
            )
            == 2
        )
        rows = await db.fetchall("SELECT n, x, s FROM t ORDER BY id")
        assert rows == [(42, 1.5, None), (1, 2.0, "a"), (2, 3.25, "b")]
        assert type(rows[0][0]) is int  # the query endpoint keeps integers (raw would not)
        assert await db.fetchone("SELECT COUNT(*) FROM t WHERE s IS NULL") == (1,)
        assert await db.fetchone("SELECT n FROM t WHERE n = ?", (999,)) is None
        with pytest.raises(D1Error, match="no such table"):
            await db.fetchall("SELECT * FROM missing")
        bad = D1Connector("d1", {**d1_connection(standin), "api_token": "wrong"})
        with pytest.raises(D1Error) as e:
            await bad.fetchall("SELECT 1")
        assert e.value.status == 401
        assert "wrong" not in str(e.value)
        # a refused token is a configuration error (waiting does not fix it), naming the
        # setting; not an outage
        assert isinstance(e.value, ConfigError)
        assert not isinstance(e.value, DatabaseConnectionError)
        assert "connections.d1.api_token" in str(e.value)
        await bad.close()
    finally:
        await db.close()


@contextlib.asynccontextmanager
async def d1_queue_app(standin: StandIn) -> AsyncIterator[App]:
    """An app whose default queue connection is the database driver over D1's REST API,
    its tables made."""
    from haze.connectors.migrations import ensure_queue_tables

    app = App(
        queue=define_queue_config(
            default="database",
            connections={
                "database": {"driver": "database", "connection": "d1", "queues": ["default"]}
            },
        ),
        database=define_database_config(default="d1", connections={"d1": d1_connection(standin)}),
    )
    async with app:
        await ensure_queue_tables(app)
        yield app


async def test_database_driver_over_d1_rest(standin: StandIn) -> None:
    async with d1_queue_app(standin) as app:
        await cf_rest_ok.dispatch({"n": 1})
        await Queue.bulk([cf_rest_ok.with_({"n": i}) for i in range(3)])
        assert await app.driver("database").size("default") == 4
        worker = Worker(app, "database", ["default"], 1, stop_when_empty=True)
        await worker.run()
    assert seen["ok"] == [1, 1, 1, 1]
    assert any("RETURNING" in s for s in standin.d1.statements)  # the atomic claim


@pytest.mark.parametrize("how", ["cut", "504"])
async def test_a_d1_insert_whose_reply_was_lost_and_that_ran_later_queues_once(
    standin: StandIn, how: str
) -> None:
    """When a backend is down: a dispatch that returns queued its job once. The API takes
    the INSERT, then its reply is lost (the connection closes unanswered, or the gateway
    answers 504) and D1 runs it 0.8 s later. Before the fix the dispatch looked for its
    row once, found none, sent the INSERT again, and the job was queued twice."""
    async with d1_queue_app(standin) as app:
        standin.d1.lose_next = ("INSERT INTO", how, 0.8)
        await cf_rest_ok.dispatch({"n": 1})
        assert standin.d1.lose_next is None  # the reply was lost
        await asyncio.sleep(1.2)  # the late INSERT has run
        assert await app.driver("database").size("default") == 1


# --------------------------------------------------------------------------- haze queue:work


def write_app(root: Path, queue: dict[str, Any], database: dict[str, Any]) -> None:
    """An app folder whose default queue connection is ``queue`` over the D1 ``database``."""
    (root / "config").mkdir(parents=True)
    (root / "app" / "job").mkdir(parents=True)
    (root / "config" / "queue.py").write_text(
        textwrap.dedent(f"""
        from haze import define_queue_config
        config = define_queue_config(default="main", connections={{"main": {queue!r}}})
    """)
    )
    (root / "config" / "database.py").write_text(
        textwrap.dedent(f"""
        from haze import define_database_config
        config = define_database_config(default="d1", connections={{"d1": {database!r}}})
    """)
    )


def run_cli(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    haze = Path(sys.executable).with_name("haze")
    env = {**os.environ, "HAZE_APP_ROOT": str(root)}
    return subprocess.run(
        [str(haze), *args], cwd=root, env=env, capture_output=True, text=True, timeout=60
    )


def test_a_refused_d1_token_stops_the_worker_with_one_line(
    standin: StandIn, tmp_path: Path
) -> None:
    root = tmp_path / "d1app"
    write_app(
        root,
        {"driver": "database", "connection": "d1"},
        {**d1_connection(standin), "api_token": "wrong-token-xyz"},
    )
    proc = run_cli(root, "queue:work", "--connection", "main", "--stop-when-empty")
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output
    assert "Traceback" not in output
    assert "unavailable" not in output  # not an outage to wait out
    [line] = [line for line in output.splitlines() if "HTTP 401" in line]
    assert "connections.d1.api_token" in line
    assert "wrong-token-xyz" not in output


def test_queue_work_cli_pull_consumer(standin: StandIn, tmp_path: Path) -> None:
    root = tmp_path / "cfapp"
    out = tmp_path / "ran.txt"
    write_app(root, cf_connection(standin), d1_connection(standin))
    (root / "app" / "job" / "cf_cli_job.py").write_text(
        textwrap.dedent(f"""
        from haze import define_job

        @define_job()
        async def cf_cli_job(payload):
            with open({str(out)!r}, "a") as f:
                f.write(str(payload["n"]) + "\\n")
    """)
    )
    # Produce over REST as a web process would.
    for n in (1, 2, 3):
        standin.queue.push(
            {
                "body": {
                    "v": 1,
                    "id": f"cli{n}",
                    "job": "cf_cli_job",
                    "payload": {"n": n},
                    "queue": "default",
                    "connection": "main",
                },
                "content_type": "json",
            }
        )
    proc = run_cli(root, "queue:work", "--connection", "main", "--stop-when-empty", "-v")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(out.read_text().split()) == ["1", "2", "3"]
    assert standin.queue.messages == []
    assert sorted(standin.queue.acked) == ["m0001", "m0002", "m0003"]


@define_job(tries=2, backoff="13h")
async def cf_rest_long_backoff(payload: dict[str, Any], job: JobContext) -> None:
    _note("long", job)
    raise RuntimeError("fails, to wait 13 hours")


async def test_a_backoff_over_12_hours_is_capped_before_the_retry_line_names_it(
    standin: StandIn, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    async with make_app(standin) as app:
        await cf_rest_long_backoff.dispatch({"n": 1})
        worker = Worker(app, "cloudflare", None, 1, sleep=0.05, max_sleep=0.2)
        with caplog.at_level(logging.INFO, logger="haze"):
            worker.start()
            try:
                await wait_for(lambda: bool(standin.queue.retried))
            finally:
                await worker.stop()
    assert [d for _, d in standin.queue.retried] == [43200]
    lines = [r.getMessage() for r in caplog.records]
    retry = [i for i, ln in enumerate(lines) if "retrying in" in ln]
    cap = [i for i, ln in enumerate(lines) if "12-hour limit" in ln]
    assert len(retry) == 1 and len(cap) == 1, lines
    assert cap[0] < retry[0], lines  # the warning first, then the line with the wait
    assert "retrying in 43200s" in lines[retry[0]], lines
    assert "46800" in lines[cap[0]] and "46800" not in lines[retry[0]]
