"""The dashboard over HTTP (Starlette's TestClient), against a real SQLite file and a
real Redis: access control, CSRF, read-only, escaping, numbers, retry, cancel.

The jobs are dispatched and run by one ``App`` (as a worker process would) and the
dashboard reads them through another, as in production.
"""

from __future__ import annotations

import asyncio
import contextlib
import html as html_lib
import json
import os
import re
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from haze import (
    App,
    JobContext,
    Queue,
    define_cache_config,
    define_database_config,
    define_job,
    define_queue_config,
    define_redis_config,
)
from haze._base.message import FailedJob
from haze._engine.control import paused_queues
from haze._workers.worker import Worker
from haze.connectors.migrations import ensure_queue_tables
from haze.contracts.failed import FailedPages
from haze.dashboard import create_app
from starlette.testclient import TestClient

sys.path.insert(0, str(Path(__file__).parent.parent / "drivers"))
from redis_spec import REDIS_URL, delete_prefix, redis_reachable, unique_prefix

sys.path.insert(0, str(Path(__file__).parent.parent / "database"))
from harness import mysql_database, pg_database
from services import server_missing

T = TypeVar("T")

XSS = "<script>alert('pwn')</script>"
#: The overview lists a connection's configured queues and those its jobs name.
QUEUES = ["default", "emails", "reports"]


@define_job(name="dash_boom", tries=1)
async def dash_boom(payload: Any) -> None:
    raise ValueError(f"dash boom {payload.get('n') if isinstance(payload, dict) else payload}")


@define_job(name="dash_ok")
async def dash_ok(payload: Any) -> None:
    return None


class Backend:
    """Makes fresh ``App``s on one shared backend (each process has its own App)."""

    def __init__(self, kind: str, tmp: Path, url: str = "") -> None:
        self.kind = kind
        self.tmp = tmp
        self.prefix = unique_prefix("dash") if kind == "redis" else ""
        #: The database's URL (sqlite, postgres, mariadb).
        self.url = url or f"sqlite:///{tmp / 'q.db'}"
        self._opened: list[tuple[TestClient, App]] = []

    def open(self, asgi: Callable[[App], Any], **options: Any) -> TestClient:
        """A test client of the dashboard ``asgi(app)`` builds on a fresh App. It runs
        every request on one event loop, where the App's connections are closed at the
        end (a connection left open on a loop that closed fails the test)."""
        app = self.app()
        c = TestClient(asgi(app), **options)
        c.__enter__()
        self._opened.append((c, app))
        return c

    def close(self) -> None:
        for c, app in reversed(self._opened):
            try:
                assert c.portal is not None
                c.portal.call(app.stop)
            finally:
                c.__exit__(None, None, None)
        self._opened.clear()

    def app(self) -> App:
        if self.kind != "redis":
            return App(
                queue=define_queue_config(
                    default="main",
                    connections={"main": {"driver": "database", "sleep": 0.05, "queues": QUEUES}},
                ),
                database=define_database_config(
                    default="db", connections={"db": {"url": self.url}}
                ),
            )
        conn = {"driver": "redis", "url": REDIS_URL, "prefix": self.prefix, "queues": QUEUES}
        # The store's keys (pauses, worker records, per-minute counts) under this test's
        # prefix too, so that tests do not see each other's.
        store = {"driver": "redis", "connection": "r", "prefix": f"{self.prefix}:store:"}
        return App(
            queue=define_queue_config(default="main", connections={"main": conn}, store="locks"),
            cache=define_cache_config(default="locks", stores={"locks": store}),
            redis=define_redis_config(default="r", connections={"r": {"url": REDIS_URL}}),
        )

    def run(self, fn: Callable[[App], Awaitable[T]]) -> T:
        async def go() -> T:
            async with self.app() as app:
                return await fn(app)

        return asyncio.run(go())


@pytest.fixture(params=["sqlite", "postgres", "mariadb", "redis"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "redis" and not redis_reachable():
        server_missing("Redis", REDIS_URL)
    with contextlib.ExitStack() as stack:
        url = ""
        if request.param in ("postgres", "mariadb"):
            # A database of its own for each test, dropped after it.
            make = pg_database if request.param == "postgres" else mysql_database
            databases = make("dash_http")
            url = next(databases)
            stack.callback(lambda: next(databases, None))
        b = Backend(request.param, tmp_path, url)
        if b.kind != "redis":
            b.run(ensure_queue_tables)
        try:
            yield b
        finally:
            b.close()
            if b.prefix:
                delete_prefix(b.prefix + ":")


async def drain(app: App, queues: list[str] | None = None) -> None:
    await Worker(app, "main", queues or ["default"], stop_when_empty=True, sleep=0.05).run()


def fail_jobs(backend: Backend, payloads: list[Any], queue: str = "default") -> None:
    async def go(app: App) -> None:
        for p in payloads:
            await dash_boom.dispatch(p, queue=queue)
        await drain(app, [queue])

    backend.run(go)


def client(backend: Backend, **options: Any) -> TestClient:
    options.setdefault("authorize", lambda request: True)
    return backend.open(lambda app: create_app(app, **options), follow_redirects=False)


def csrf(page_html: str) -> str:
    m = re.search(r'name="_csrf" value="([^"]+)"', page_html)
    assert m, "no CSRF field in the page"
    return m.group(1)


# --------------------------------------------------------------------------- access


def test_unauthorised_requests_get_403_on_every_path(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HAZE_ENV", raising=False)
    monkeypatch.delenv("APP_ENV", raising=False)
    denied = backend.open(create_app, follow_redirects=False)
    for path in ("/", "/failed", "/batches", "/jobs?id=x", "/metrics", "/static/haze.css", "/nope"):
        r = denied.get(path)
        assert r.status_code == 403, path
        assert "dash_" not in r.text and "<html" not in r.text
    assert denied.post("/failed/retry", data={"all": "1"}).status_code == 403
    refused = backend.open(lambda app: create_app(app, authorize=lambda request: False))
    assert refused.get("/").status_code == 403
    # An authorize that returns something truthy but not True does not open it.
    truthy = backend.open(lambda app: create_app(app, authorize=lambda request: "yes"))
    assert truthy.get("/").status_code == 403

    def broken(request: Any) -> bool:
        raise RuntimeError("session store down")

    r = backend.open(lambda app: create_app(app, authorize=broken)).get("/")
    assert r.status_code == 403 and "session store" not in r.text


def test_async_authorize_and_local_environment(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def allow(request: Any) -> bool:
        return request.headers.get("x-admin") == "1"

    c = backend.open(lambda app: create_app(app, authorize=allow))
    assert c.get("/").status_code == 403
    assert c.get("/", headers={"x-admin": "1"}).status_code == 200

    monkeypatch.setenv("HAZE_ENV", "local")
    local = backend.open(create_app, base_url="http://127.0.0.1:8000", client=("127.0.0.1", 50000))
    assert local.get("/").status_code == 200
    assert local.get("/", headers={"host": "localhost:8000"}).status_code == 200
    assert local.get("/", headers={"host": "[::1]:8000"}).status_code == 200
    # A web page whose name was re-pointed at 127.0.0.1 (DNS rebinding) reaches the
    # loopback port from the user's own browser, but with its own name in Host: denied.
    assert local.get("/", headers={"host": "evil.example:8000"}).status_code == 403
    # Local environment but a remote client (e.g. the port published by mistake): denied.
    remote = backend.open(create_app, client=("203.0.113.9", 50000))
    assert remote.get("/").status_code == 403
    monkeypatch.setenv("HAZE_ENV", "production")
    monkeypatch.setenv("APP_ENV", "local")  # HAZE_ENV wins
    assert local.get("/").status_code == 403


def test_failed_sign_ins_are_limited_per_client(backend: Backend) -> None:
    from haze.dashboard._security import FREE_ATTEMPTS, MAX_ATTEMPTS, basic_auth

    if backend.kind != "sqlite":
        pytest.skip("the limit is the dashboard's own, the same on every backend")

    def with_client(host: str) -> TestClient:
        return backend.open(
            lambda app: create_app(app, authorize=basic_auth("ops", "right")),
            client=(host, 50000),
        )

    guesser, other = with_client("203.0.113.7"), with_client("203.0.113.8")
    statuses = [
        guesser.get("/", auth=("ops", f"guess{i}")).status_code for i in range(MAX_ATTEMPTS + 3)
    ]
    assert statuses == [403] * MAX_ATTEMPTS + [429] * 3
    refused = guesser.get("/", auth=("ops", "right"))  # even the right password now
    assert refused.status_code == 429
    assert "Too many failed sign-ins" in refused.text
    assert int(refused.headers["retry-after"]) > 0
    assert other.get("/", auth=("ops", "right")).status_code == 200  # per client
    assert FREE_ATTEMPTS < MAX_ATTEMPTS


def test_post_without_valid_csrf_token_is_403_whatever_the_path(backend: Backend) -> None:
    fail_jobs(backend, [{"n": 1}])
    c = client(backend)
    page = c.get("/failed")
    token = csrf(page.text)
    for path in ("/failed/retry", "/failed/forget", "/queues/pause", "/batches/x/cancel", "/nope"):
        assert c.post(path, data={"all": "1"}).status_code == 403, path
        assert c.post(path, data={"all": "1", "_csrf": "forged.token"}).status_code == 403, path
    # The cookie's token without the form field, or a field that differs from the cookie.
    assert c.post("/failed/retry", data={"all": "1", "_csrf": token + "x"}).status_code == 403
    other = client(backend)
    other_token = csrf(other.get("/").text)
    assert c.post("/failed/retry", data={"all": "1", "_csrf": other_token}).status_code == 403
    assert len(backend.run(lambda app: Queue.failed())) == 1  # nothing was retried
    # With the page's own token it works.
    r = c.post("/failed/forget", data={"all": "1", "_csrf": token})
    assert r.status_code == 303
    assert backend.run(lambda app: Queue.failed()) == []


def test_read_only_hides_and_refuses_every_action(backend: Backend) -> None:
    fail_jobs(backend, [{"n": 1}])
    c = client(backend, read_only=True)
    pages = [c.get(p).text for p in ("/", "/failed", "/batches", "/jobs")]
    job = backend.run(lambda app: Queue.failed())[0]
    pages.append(c.get(f"/failed/main/{job.id}").text)
    for html in pages:
        assert 'method="post"' not in html
        assert "<button" not in html or "Search" in html or "Look up" in html
    token = csrf(client(backend).get("/").text)  # no form, so borrow a valid token
    c.cookies.set("haze_csrf", token)
    r = c.post("/failed/retry", data={"all": "1", "_csrf": token})
    assert r.status_code == 403
    assert "read-only" in r.text
    assert len(backend.run(lambda app: Queue.failed())) == 1


# --------------------------------------------------------------------------- content


def test_user_data_is_escaped_everywhere(backend: Backend) -> None:
    fail_jobs(backend, [{"n": XSS, "note": XSS}], queue="default")
    c = client(backend)
    job = backend.run(lambda app: Queue.failed())[0]
    pages = {
        "list": c.get("/failed", params={"job": "dash"}).text,
        "detail": c.get(f"/failed/main/{job.id}").text,
        "search": c.get("/failed", params={"exception": XSS}).text,
        "lookup": c.get("/jobs", params={"id": XSS}).text,
        "flash": c.get("/", params={"done": XSS, "error": XSS}).text,
    }
    for name, html in pages.items():
        assert "<script>alert" not in html, name
    assert "&lt;script&gt;alert(" in pages["detail"]
    assert "&lt;script&gt;alert(" in pages["search"]


def test_no_app_key_or_secret_in_any_page(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    from haze._base.crypto import generate_key

    key = generate_key()
    monkeypatch.setenv("APP_KEY", key)
    fail_jobs(backend, [{"n": 1}])
    c = client(backend)
    job = backend.run(lambda app: Queue.failed())[0]
    for path in ("/", "/failed", f"/failed/main/{job.id}", "/batches", "/jobs?id=x", "/metrics"):
        text = c.get(path).text
        assert key not in text and key.partition(":")[2][:16] not in text, path


def test_overview_numbers_match_the_queue(backend: Backend) -> None:
    async def fill(app: App) -> tuple[int, int, int]:
        for i in range(3):
            await dash_ok.dispatch({"i": i}, queue="default")
        dispatched.append(time.time())
        await dash_ok.dispatch({"i": 9}, queue="default", delay=3600)
        for i in range(2):
            await dash_ok.dispatch({"i": i}, queue="emails")
        for i in range(2):
            await dash_boom.dispatch({"n": i}, queue="reports")
        for i in range(3):
            await dash_ok.dispatch({"i": i}, queue="reports")
        await drain(app, ["reports"])
        return (
            await Queue.size("default"),
            await Queue.size("emails"),
            len(await Queue.failed(queue="reports")),
        )

    dispatched: list[float] = []
    default_size, emails_size, failed = backend.run(fill)
    assert (default_size, emails_size, failed) == (4, 2, 2)
    c = client(backend)
    html = c.get("/").text
    rows = _rows(html)
    assert rows[("main", "default")]["waiting"] == "4"
    assert rows[("main", "emails")]["waiting"] == "2"
    assert rows[("main", "reports")]["failed"] == "2"
    assert rows[("main", "reports")]["waiting"] == "0"
    # The workers' per-minute counts (written when the worker's app stopped): 5 jobs
    # finished on reports, 2 of them failed for good.
    assert rows[("main", "reports")]["finished-hour"] == "5"
    assert rows[("main", "reports")]["failure-rate"] == "40.0%"
    assert rows[("main", "default")]["finished-hour"] == "0"
    assert float(rows[("main", "reports")]["per-minute"]) > 0
    assert rows[("main", "reports")]["wait"].startswith("≤ ")
    assert rows[("main", "default")]["wait"] == "—"
    # The oldest ready job's wait as an age ("12s"); none ready on reports.
    oldest = rows[("main", "default")]["oldest-ready"]
    assert re.fullmatch(r"\d+s", oldest), oldest
    assert int(oldest[:-1]) <= time.time() - dispatched[0] + 1
    assert rows[("main", "reports")]["oldest-ready"] == "—"
    runtimes = dict(re.findall(r'<tr data-job="(dash_\w+)">.*?<td class="n runs">(\d+)</td>', html))
    assert runtimes == {"dash_boom": "2", "dash_ok": "3"}
    partial = c.get("/", params={"partial": 1}).text
    assert "<html" not in partial and _rows(partial) == rows
    metrics = c.get("/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    assert 'haze_queue_failed{connection="main",queue="reports"} 2' in metrics.text
    assert 'haze_queue_oldest_ready_seconds{connection="main",queue="reports"} 0' in metrics.text
    aged = re.search(
        r'^haze_queue_oldest_ready_seconds\{connection="main",queue="default"\} (\S+)$',
        metrics.text,
        re.M,
    )
    assert aged is not None and 0 <= float(aged.group(1)) <= time.time() - dispatched[0] + 1


def _rows(html: str) -> dict[tuple[str, str], dict[str, str]]:
    out: dict[tuple[str, str], dict[str, str]] = {}
    for m in re.finditer(
        r'<tr data-connection="([^"]+)" data-queue="([^"]+)">(.*?)</tr>', html, re.S
    ):
        cells = dict(
            re.findall(
                r'<(?:td|span) class="(?:n |muted )?(waiting|failed|per-minute|failure-rate|finished-hour|wait|oldest-ready)"[^>]*>(.*?)</(?:td|span)>',
                m.group(3),
                re.S,
            )
        )
        out[(m.group(1), m.group(2))] = {
            k: re.sub(r"<[^>]+>", "", v).strip() for k, v in cells.items()
        }
    return out


# --------------------------------------------------------------------------- actions


def test_search_then_retry_one_and_all_matching(backend: Backend) -> None:
    fail_jobs(backend, [{"n": "alpha"}, {"n": "beta"}, {"n": "gamma"}])
    c = client(backend)
    page = c.get("/failed", params={"exception": "dash boom beta"})
    assert page.status_code == 200
    assert "1 failed job(s) match." in page.text
    token = csrf(page.text)
    beta = next(j for j in backend.run(lambda app: Queue.failed()) if "beta" in j.exception)
    r = c.post("/failed/retry", data={"_csrf": token, "connection": "main", "id": beta.id})
    assert r.status_code == 303
    assert "Retried 1 failed job(s)." in c.get(r.headers["location"]).text
    assert backend.run(lambda app: Queue.size("default")) == 1
    left = {j.exception.strip().splitlines()[-1] for j in backend.run(lambda app: Queue.failed())}
    assert left == {"ValueError: dash boom alpha", "ValueError: dash boom gamma"}
    # Every job matching a filter (job name + time range).
    r = c.post(
        "/failed/retry",
        data={"_csrf": token, "connection": "main", "all": "1", "job": "dash_b", "since": "1h"},
    )
    assert r.status_code == 303
    assert backend.run(lambda app: Queue.failed()) == []
    assert backend.run(lambda app: Queue.size("default")) == 3
    # A bad time range is one line, not a traceback.
    bad = c.get("/failed", params={"since": "yesterday-ish"})
    assert bad.status_code == 400
    assert "since: expected a duration ago" in bad.text


def _plant_failed(backend: Backend, n: int, exception_size: int) -> None:
    """``n`` failed jobs recorded straight into the connection's failed-job store, one
    second apart (job ``dash_boom``, payload ``{"n": i}``), each with a long exception."""

    async def go(app: App) -> None:
        failed = app.driver("main").failed
        assert isinstance(failed, FailedPages)  # counted and paged by the backend
        for i in range(n):
            body = json.dumps(
                {"v": 1, "id": f"planted{i:04d}", "job": "dash_boom", "payload": {"n": i}}
            )
            text = f"ValueError: planted {i}\n" + "x" * exception_size
            job = FailedJob.from_body(
                body,
                id=f"planted{i:04d}",
                connection="main",
                queue="default",
                exception=text,
                failed_at=1_700_000_000.0 + i,
            )
            await failed.record(job)

    backend.run(go)


def test_failed_jobs_are_paged_and_their_exceptions_trimmed(backend: Backend) -> None:
    # 120 failures of 20 KB each: a page lists 50, newest first, and its size does not
    # carry every exception in full.
    _plant_failed(backend, 120, 20_000)
    c = client(backend)
    ids = lambda text: re.findall(r'data-id="(planted\d+)"', text)  # noqa: E731
    first = c.get("/failed")
    assert first.status_code == 200
    assert "120 failed job(s) match." in first.text
    assert ids(first.text) == [f"planted{i:04d}" for i in range(119, 69, -1)]
    assert len(first.text) < 200_000
    second = c.get("/failed", params={"page": "2"})
    assert ids(second.text) == [f"planted{i:04d}" for i in range(69, 19, -1)]
    third = c.get("/failed", params={"page": "3"})
    assert ids(third.text) == [f"planted{i:04d}" for i in range(19, -1, -1)]
    assert 'href="/failed?connection=main&amp;page=2"' in third.text  # back a page
    # Filters page too: a time range and a text search.
    since = c.get("/failed", params={"since": "2023-11-14T22:13:40+00:00"})
    assert "100 failed job(s) match." in since.text
    text = c.get("/failed", params={"exception": "planted 11"})
    assert "11 failed job(s) match." in text.text  # 11 and 110 to 119
    assert ids(text.text) == [*(f"planted{i:04d}" for i in range(119, 109, -1)), "planted0011"]
    bad = c.get("/failed", params={"page": "0"})
    assert bad.status_code == 400
    assert "page" in bad.text
    # The overview counts them without listing them.
    assert c.get("/").status_code == 200


def test_failed_detail_shows_payload_traceback_and_ids(backend: Backend) -> None:
    fail_jobs(backend, [{"n": "detail"}])
    job = backend.run(lambda app: Queue.failed())[0]
    html = client(backend).get(f"/failed/main/{job.id}").text
    assert job.id in html
    assert "dash_boom" in html
    assert "Traceback" in html and "ValueError: dash boom detail" in html
    # tries=1: it failed on its first attempt (kept in the stored message)
    assert re.search(r'<dd id="attempts">failed on attempt 1</dd>', html), html
    assert "&#34;n&#34;: &#34;detail&#34;" in html or "&quot;n&quot;: &quot;detail&quot;" in html
    assert client(backend).get("/failed/main/nope").status_code == 404


def test_pause_and_continue_a_queue(backend: Backend) -> None:
    c = client(backend)
    token = csrf(c.get("/").text)
    r = c.post("/queues/pause", data={"_csrf": token, "connection": "main", "queue": "default"})
    assert r.status_code == 303
    assert backend.run(lambda app: paused_queues(app, "main", ["default"])) == {"default"}
    assert "paused" in c.get("/").text
    c.post("/queues/continue", data={"_csrf": token, "connection": "main", "queue": "default"})
    assert backend.run(lambda app: paused_queues(app, "main", ["default"])) == set()


def test_batches_list_detail_cancel_and_retry_failed(backend: Backend) -> None:
    async def make(app: App) -> tuple[str, str]:
        running = (
            await Queue.batch([dash_ok.with_({"i": 1}), dash_ok.with_({"i": 2})])
            .name("import <b>csv</b>")
            .dispatch()
        )
        failing = (
            await Queue.batch([dash_boom.with_({"n": "b1"}), dash_ok.with_({"i": 3})])
            .allow_failures()
            .on_queue("reports")
            .dispatch()
        )
        await drain(app, ["reports"])
        return running.id, failing.id

    running_id, failing_id = backend.run(make)
    c = client(backend)
    listing = c.get("/batches").text
    assert running_id in listing and failing_id in listing
    assert "import &lt;b&gt;csv&lt;/b&gt;" in listing
    detail = c.get(f"/batches/{running_id}").text
    assert "Cancel batch" in detail
    token = csrf(detail)
    r = c.post(f"/batches/{running_id}/cancel", data={"_csrf": token})
    assert r.status_code == 303
    batch = backend.run(lambda app: Queue.find_batch(running_id))
    assert batch is not None and batch.cancelled
    assert "cancelled" in c.get(f"/batches/{running_id}").text

    failed_detail = c.get(f"/batches/{failing_id}").text
    assert "Retry failed jobs" in failed_detail
    r = c.post(f"/batches/{failing_id}/retry", data={"_csrf": token})
    assert r.status_code == 303
    assert backend.run(lambda app: Queue.failed()) == []
    assert backend.run(lambda app: Queue.size("reports")) == 1
    assert c.get("/batches/unknown-batch").status_code == 404


def test_batch_page_lists_its_jobs_with_their_state(backend: Backend) -> None:
    async def make(app: App) -> tuple[str, list[str]]:
        batch = (
            await Queue.batch(
                [dash_ok.with_({"i": 1}), dash_boom.with_({"n": "m"}), dash_ok.with_({"i": 2})]
            )
            .allow_failures()
            .on_queue("reports")
            .dispatch()
        )
        await drain(app, ["reports"])
        return batch.id, [j.id for j in await Queue.failed()]

    batch_id, failed_ids = backend.run(make)
    page = client(backend).get(f"/batches/{batch_id}").text
    rows = dict(
        re.findall(r'<tr data-job="([^"]+)">.*?<span class="badge[^"]*">(\w+)<', page, re.S)
    )
    assert len(rows) == 3, page
    assert [rows[i] for i in failed_ids] == ["failed"]
    assert sorted(rows.values()) == ["done", "done", "failed"]
    assert "3 of 3 jobs have ended" in page


def test_job_lookup_by_full_and_short_id(backend: Backend) -> None:
    fail_jobs(backend, [{"n": "look"}])
    job = backend.run(lambda app: Queue.failed())[0]
    c = client(backend)
    for token in (job.id, job.id[:8]):
        html = c.get("/jobs", params={"id": token}).text
        assert f"<code>{job.id}</code>" in html, token
    assert "Nothing found" in c.get("/jobs", params={"id": "zzzzzzzz"}).text


def test_job_lookup_finds_untracked_jobs_through_the_driver(backend: Backend) -> None:
    async def go(app: App) -> tuple[str, str, str, str]:
        done = await dash_ok.dispatch({"i": 1})
        await drain(app)
        ready = await dash_ok.dispatch({"i": 2}, queue="emails")
        later = await dash_ok.dispatch({"i": 3}, delay=3600)
        chained = await Queue.chain([dash_ok.with_({"i": 4}), dash_boom.with_({"n": 5})]).dispatch()
        return done, ready, later, chained.id

    done_id, ready_id, later_id, chained_id = backend.run(go)
    c = client(backend)

    def state(job_id: str) -> str:
        page = c.get("/jobs", params={"id": job_id}).text
        m = re.search(r'id="job-queued".*?<span class="badge[^"]*">(\w+)<', page, re.S)
        assert "<script>" not in page
        return m.group(1) if m else page

    ready_page = c.get("/jobs", params={"id": ready_id}).text
    assert f"<code>{ready_id}</code>" in ready_page and "emails" in ready_page
    assert state(ready_id) == "ready"
    assert state(later_id) == "delayed"
    # A chain's first link: its position and the links still to run.
    chain_page = c.get("/jobs", params={"id": chained_id}).text
    assert state(chained_id) == "ready"
    assert "1 more link" in chain_page and "dash_boom" in chain_page
    if backend.kind == "redis":
        # BullMQ keeps the newest completed jobs (keep_completed).
        assert state(done_id) == "done"
    else:
        # The database driver deletes a job when it ends: the page says so.
        page = c.get("/jobs", params={"id": done_id}).text
        assert "Nothing found" in page and "deletes a job" in page


def test_mounted_under_a_prefix(backend: Backend) -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    fail_jobs(backend, [{"n": 1}])

    def outer(app: App) -> Starlette:
        return Starlette(routes=[Mount("/ops/haze", app=create_app(app, authorize=lambda r: True))])

    c = backend.open(outer, follow_redirects=False)
    html = c.get("/ops/haze/failed").text
    assert 'href="/ops/haze/static/haze.css"' in html
    assert 'action="/ops/haze/failed/retry"' in html
    assert c.get("/ops/haze/static/haze.js").status_code == 200
    token = csrf(html)
    r = c.post(
        "/ops/haze/failed/forget",
        data={"_csrf": token, "all": "1", "next": "https://evil.example/"},
    )
    assert r.status_code == 303
    assert r.headers["location"].startswith("/ops/haze/failed")


def test_base_path_when_served_alone(backend: Backend) -> None:
    c = backend.open(
        lambda app: create_app(app, authorize=lambda r: True, base_path="/haze/"),
        follow_redirects=False,
    )
    html = c.get("/haze/").text
    assert 'href="/haze/static/haze.css"' in html
    assert 'href="/haze/failed"' in html
    assert c.get("/haze/metrics").status_code == 200
    assert c.get("/").status_code == 404
    assert c.cookies.get("haze_csrf")


# --------------------------------------------------------------------------- workers


@define_job(name="dash_slow")
async def dash_slow(payload: Any) -> None:
    await asyncio.sleep(payload["s"])


def test_workers_page_lists_live_workers_and_drops_dead_ones(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    from haze._workers import presence as presence

    monkeypatch.setattr(presence, "LEASE", 1.0)
    monkeypatch.setattr(presence, "BEAT_EVERY", 0.1)
    c = client(backend)

    async def scenario(app: App) -> None:
        slow_id = await dash_slow.dispatch({"s": 1.5}, queue="emails")
        w = Worker(app, "main", ["emails", "default"], concurrency=3, sleep=0.05, control=True)
        w.start()
        # The page is read by another process's App, as the dashboard would.
        deadline = time.monotonic() + 10
        while "dash_slow" not in (html := await asyncio.to_thread(c.get, "/workers")).text:
            assert time.monotonic() < deadline, html.text
            await asyncio.sleep(0.1)
        text = html.text
        assert socket.gethostname() in text and f">{os.getpid()}<" in text
        assert "emails, default" in text and ">3<" in text
        # Job lookup finds it running on this worker, by its short id too.
        found = (await asyncio.to_thread(c.get, "/jobs", params={"id": slow_id[-8:]})).text
        assert f"<code>{slow_id}</code>" in found and ">running<" in found
        assert f"pid {os.getpid()}" in found
        # A clean stop removes the record at once.
        await w.stop()
        await w.run()
        assert "No worker is running" in (await asyncio.to_thread(c.get, "/workers")).text

        # A worker that dies (stops renewing, leaves nothing behind) drops out after
        # its lease.
        dead = Worker(app, "main", ["default"], sleep=0.05, control=True)
        dead.start()
        while "No worker is running" in (await asyncio.to_thread(c.get, "/workers")).text:
            await asyncio.sleep(0.1)
        dead._stop_heartbeat()  # its control task (the renewals) ends, as in a crash
        dead._presence = None
        seen_gone = time.monotonic()
        while "No worker is running" not in (await asyncio.to_thread(c.get, "/workers")).text:
            assert time.monotonic() - seen_gone < 5, "a dead worker stayed listed"
            await asyncio.sleep(0.2)
        await dead.stop()

    backend.run(scenario)


@define_job(name="dash_secret", tries=1, encrypted=True)
async def dash_secret(payload: Any) -> None:
    raise ValueError("dash secret failed")


def test_encrypted_payload_hidden_unless_decrypted_with_the_app_key(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    from haze._base.crypto import generate_key

    monkeypatch.setenv("APP_KEY", generate_key())

    async def go(app: App) -> None:
        await dash_secret.dispatch({"card": "4242-SECRET"})
        await drain(app)

    backend.run(go)
    job = backend.run(lambda app: Queue.failed())[0]
    c = client(backend)
    html = c.get(f"/failed/main/{job.id}").text
    assert "4242-SECRET" not in html
    assert "encrypted with the app key and hidden" in html
    assert "Show it decrypted" in html
    assert "4242-SECRET" in c.get(f"/failed/main/{job.id}", params={"decrypt": 1}).text
    # A dashboard without the key cannot show it, and says so.
    monkeypatch.delenv("APP_KEY")
    keyless = client(backend).get(f"/failed/main/{job.id}", params={"decrypt": 1}).text
    assert "4242-SECRET" not in keyless
    assert "no app key" in keyless


@define_job(name="dash_secret_text", tries=1, encrypted=True, track=True)
async def dash_secret_text(payload: Any) -> None:
    raise ValueError(f"card {payload['card']} declined")


@define_job(name="dash_secret_result", encrypted=True, keep_result="1h")
async def dash_secret_result(payload: Any, job: JobContext) -> Any:
    job.progress({"at": payload["card"]})
    return {"echo": payload["card"]}


def test_encrypted_exception_result_and_progress_hidden_unless_decrypted(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    from haze._base.crypto import generate_key

    monkeypatch.setenv("APP_KEY", generate_key())

    async def go(app: App) -> tuple[str, str]:
        failing = await dash_secret_text.dispatch({"card": "4242-FAIL"})
        kept = await dash_secret_result.dispatch({"card": "4242-KEPT"})
        await drain(app)
        return failing, kept

    failing, kept = backend.run(go)
    c = client(backend)
    assert "4242-FAIL" not in c.get("/failed").text
    html = c.get(f"/failed/main/{failing}").text
    assert "4242-FAIL" not in html and "ValueError (encrypted)" in html
    shown = c.get(f"/failed/main/{failing}", params={"decrypt": 1}).text
    assert "card 4242-FAIL declined" in shown and "Traceback" in shown
    for job_id, secret in ((failing, "4242-FAIL"), (kept, "4242-KEPT")):
        html = c.get("/jobs", params={"id": job_id}).text
        assert secret not in html and "encrypted with the app key and hidden" in html
        assert secret in c.get("/jobs", params={"id": job_id, "decrypt": 1}).text
    monkeypatch.delenv("APP_KEY")
    keyless = client(backend)
    html = keyless.get("/jobs", params={"id": kept, "decrypt": 1}).text
    assert "4242-KEPT" not in html and "no app key" in html
    html = keyless.get(f"/failed/main/{failing}", params={"decrypt": 1}).text
    assert "4242-FAIL" not in html and "no app key" in html


def test_pages_forbid_framing_and_foreign_scripts(backend: Backend) -> None:
    r = client(backend).get("/")
    policy = r.headers["content-security-policy"]
    assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert r.headers["cache-control"] == "no-store"


def test_wait_and_runtime_percentiles_from_the_workers_counts(backend: Backend) -> None:
    from haze._engine.throughput import Tally

    async def record(app: App) -> None:
        tally = Tally(app)
        for _ in range(9):
            tally.add("main", "emails", "done", job="dash_ok", wait=0.3, runtime=0.02)
        tally.add("main", "emails", "failed", job="dash_boom", wait=20, runtime=4000)
        await tally.flush()

    backend.run(record)
    c = client(backend)
    html = c.get("/").text
    row = _rows(html)[("main", "emails")]
    # 10 jobs: the 5th wait is in the 0.25-0.5 s bucket, the 10th (p95) in 10-30 s.
    assert row["wait"] == "≤ 500 ms / ≤ 30 s"
    assert row["failure-rate"] == "10.0%"
    found = re.findall(
        r'<tr data-job="(dash_\w+)">.*?<td class="n runs">(\d+)</td><td class="n p50">(.*?)</td>'
        r'<td class="n p95">(.*?)</td>',
        html,
    )
    assert found == [
        ("dash_boom", "1", "&gt; 1 h", "&gt; 1 h"),
        ("dash_ok", "9", "≤ 50 ms", "≤ 50 ms"),
    ]


def test_actions_redirect_only_inside_the_dashboard_and_flash_is_not_a_link(
    backend: Backend,
) -> None:
    c = client(backend)
    token = csrf(c.get("/").text)
    for evil in ("//evil.example/", "/\\evil.example/", "https://evil.example/", "/%5Cevil", "x"):
        r = c.post(
            "/queues/pause",
            data={"_csrf": token, "connection": "main", "queue": "q1", "next": evil},
        )
        assert r.status_code == 303
        location = r.headers["location"]
        assert location.startswith("/") and not location.startswith(("//", "/\\")), evil
        assert "evil" not in location, evil
    # The message after an action travels in a cookie, not in a URL anyone could craft.
    r = c.post("/queues/continue", data={"_csrf": token, "connection": "main", "queue": "q1"})
    assert "Resumed" not in r.headers["location"]
    assert 'Resumed "q1" on "main".' in html_lib.unescape(c.get(r.headers["location"]).text)
    assert "Resumed" not in c.get("/").text  # shown once
    crafted = c.get("/", params={"done": "Session expired: log in at evil.example"}).text
    assert "evil.example" not in crafted


def test_failed_chain_member_shows_the_links_not_run(backend: Backend) -> None:
    async def go(app: App) -> str:
        chain = Queue.chain(
            [dash_boom.with_({"n": "link"}), dash_ok.with_({"i": 1}), dash_slow.with_({"s": 0})]
        )
        await chain.dispatch()
        await drain(app)
        return (await Queue.failed())[0].id

    job_id = backend.run(go)
    page = client(backend).get(f"/failed/main/{job_id}").text
    assert "dash_ok → dash_slow" in page


def test_failed_list_shows_the_newest_and_actions_cover_every_match(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    from haze.dashboard import _data

    monkeypatch.setattr(_data, "PAGE_SIZE", 2)
    fail_jobs(backend, [{"n": 1}, {"n": 2}, {"n": 3}])
    c = client(backend)
    page = c.get("/failed").text
    assert "3 failed job(s) match. Page 1 of 2, newest first." in page
    assert page.count('<tr data-id="') == 2
    c.post("/failed/forget", data={"_csrf": csrf(page), "all": "1", "connection": "main"})
    assert backend.run(lambda app: Queue.failed()) == []


@define_job(name="dash_tracked", keep_result="1h")
async def dash_tracked(payload: Any) -> Any:
    return {"rows": payload["rows"], "note": XSS}


def test_job_lookup_shows_a_tracked_jobs_status_and_result(backend: Backend) -> None:
    async def go(app: App) -> tuple[str, str]:
        done = await dash_tracked.dispatch({"rows": 1200})
        await drain(app)
        waiting = await dash_tracked.dispatch({"rows": 1})
        return done, waiting

    done_id, waiting_id = backend.run(go)
    c = client(backend)
    page = c.get("/jobs", params={"id": done_id}).text
    assert f"<code>{done_id}</code>" in page and ">done<" in page
    assert "&#34;rows&#34;: 1200" in page or "&quot;rows&quot;: 1200" in page
    assert "<script>alert" not in page
    assert ">queued<" in c.get("/jobs", params={"id": waiting_id}).text


def test_a_deeply_nested_failed_record_breaks_no_failed_page(backend: Backend) -> None:
    """A record whose body is nested too deeply to parse: listed, shown, never retried
    as a job, and forgettable by id; the other failed jobs stay workable."""
    from haze._base.message import FailedJob

    fail_jobs(backend, [{"n": 1}])
    deep = "[" * 100_000 + "]" * 100_000

    async def plant(app: App) -> None:
        record = FailedJob.from_body(
            deep,
            id="deep-1",
            connection="main",
            queue="default",
            exception="RecursionError: too deep",
            failed_at=time.time(),
        )
        await app.driver().failed.record(record)

    backend.run(plant)
    # redis names a record whose body holds no haze id by its BullMQ id
    [deep_id] = [j.id for j in backend.run(lambda app: Queue.failed()) if j.name[0] == "<"]
    c = client(backend)
    listing = c.get("/failed")
    assert listing.status_code == 200
    assert "deep-1" in listing.text
    assert c.get("/failed", params={"job": "dash"}).status_code == 200
    assert c.get("/failed", params={"exception": "too deep"}).status_code == 200
    detail = c.get(f"/failed/main/{deep_id}")
    assert detail.status_code == 200 and "too deep" in detail.text
    token = csrf(listing.text)
    retried = c.post("/failed/retry", data={"all": "1", "_csrf": token})
    assert retried.status_code == 303
    left = backend.run(lambda app: Queue.failed())
    assert [j.id for j in left] == [deep_id]  # the plain one was retried, the deep one kept
    forgot = c.post("/failed/forget", data={"id": deep_id, "_csrf": token})
    assert forgot.status_code == 303
    assert backend.run(lambda app: Queue.failed()) == []
