"""The dashboard in headless Chromium (Debian's ``chromium``, driven by Python's
playwright), served by a real ``haze dashboard`` process over a SQLite file and over
PostgreSQL: the pages load with no error and no request leaving the server, the numbers
match the queue and refresh live, a failed job is searched and retried, a batch is
cancelled, a queue is paused, and a ``<script>`` payload never runs.

``HAZE_SCREENSHOTS=docs/img`` also saves the screenshots used in docs/operations.md.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import pytest
from haze import App, Queue, define_job
from haze._engine.control import paused_queues
from haze._workers.worker import Worker
from haze.connectors.migrations import ensure_queue_tables

sys.path.insert(0, str(Path(__file__).parent.parent / "database"))
from harness import mysql_database, pg_database

T = TypeVar("T")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
HAZE = Path(sys.executable).with_name("haze")
PASSWORD = "s3cret-for-tests"
XSS = "<script>alert('pwn')</script>"


@pytest.fixture(autouse=True)
def _chromium() -> None:
    # Skipped on a machine without chromium, but never in CI, where scripts/_services.sh
    # installs it: a browser test that silently skipped would prove nothing.
    if not Path(CHROMIUM).exists():
        message = "chromium is not installed (scripts/_services.sh ensure_tools installs it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


@define_job(name="web_boom", tries=1)
async def web_boom(payload: Any) -> None:
    raise ValueError(f"web boom {payload['n']}")


@define_job(name="web_ok")
async def web_ok(payload: Any) -> None:
    return None


@define_job(name="web_slow")
async def web_slow(payload: Any) -> None:  # pragma: no cover - runs in the worker process
    raise AssertionError("web_slow runs in the haze queue:work process only")


# The job definitions as the dashboard's process imports them (it never runs them).
DASHBOARD_JOBS = """\
from haze import define_job

@define_job(name="web_boom", tries=1)
async def web_boom(payload: dict) -> None: ...

@define_job(name="web_ok")
async def web_ok(payload: dict) -> None: ...

@define_job(name="web_slow")
async def web_slow(payload: dict) -> None: ...
"""

# The worker process's own web_slow (its app root holds this and the same config).
SLOW_JOB = """\
import asyncio
from haze import define_job

@define_job(name="web_slow")
async def web_slow(payload: dict) -> None:
    await asyncio.sleep(payload["s"])
"""


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from pg_database("dash_web")


@pytest.fixture
def mysql_url() -> Iterator[str]:
    yield from mysql_database("dash_web")


@pytest.fixture(params=["sqlite", "postgres", "mariadb"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    url = (
        f"sqlite:///{tmp_path / 'q.db'}"
        if request.param == "sqlite"
        else request.getfixturevalue("pg_url" if request.param == "postgres" else "mysql_url")
    )
    root = tmp_path / "app"
    (root / "config").mkdir(parents=True)
    (root / "config" / "database.py").write_text(
        textwrap.dedent(f"""\
            from haze import define_database_config
            config = define_database_config(default="db", connections={{"db": {{"url": {url!r}}}}})
            """)
    )
    (root / "config" / "queue.py").write_text(
        textwrap.dedent("""\
            from haze import define_queue_config
            config = define_queue_config(default="main", connections={"main": {
                "driver": "database", "sleep": 0.05, "queues": ["default", "reports"]}})
            """)
    )
    in_app(root, ensure_queue_tables)
    return root


def in_app(root: Path, fn: Callable[[App], Awaitable[T]]) -> T:
    async def go() -> T:
        async with App(root=root) as app:
            return await fn(app)

    # playwright's sync API keeps an event loop running in this thread.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, go()).result()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def server(root: Path) -> Iterator[str]:
    # The dashboard's own root: the same config, and the job modules (the runtime table
    # lists the jobs registered in the dashboard's process).
    dash_root = root.parent / "dashboard"
    shutil.copytree(root / "config", dash_root / "config")
    (dash_root / "app" / "job").mkdir(parents=True)
    (dash_root / "app" / "job" / "web.py").write_text(DASHBOARD_JOBS)
    port = free_port()
    env = {**os.environ, "HAZE_DASHBOARD_PASSWORD": PASSWORD, "HAZE_ENV": "production"}
    proc = subprocess.Popen(
        [str(HAZE), "--root", str(dash_root), "dashboard", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    out = proc.stdout.read().decode() if proc.stdout else ""
                    pytest.fail(f"haze dashboard did not start: {out}")
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


class Page:
    """A page that fails the test on a script error, an alert, or a request that leaves
    the dashboard's own server (no CDN: it works offline)."""

    def __init__(self, browser: Any, base: str) -> None:
        self.base = base
        self.context = browser.new_context(
            http_credentials={"username": "haze", "password": PASSWORD},
            viewport={"width": 1280, "height": 800},
        )
        self.page = self.context.new_page()
        self.problems: list[str] = []
        host = urlsplit(base).netloc
        self.page.on("pageerror", lambda e: self.problems.append(f"script error: {e}"))
        self.page.on(
            "console",
            lambda m: (
                self.problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None
            ),
        )
        self.page.on(
            "request",
            lambda r: (
                None
                if urlsplit(r.url).netloc == host
                else self.problems.append(f"request left the server: {r.url}")
            ),
        )

        def dialog(d: Any) -> None:
            if d.type == "confirm":
                d.accept()
            else:
                self.problems.append(f"unexpected {d.type}: {d.message}")
                d.dismiss()

        self.page.on("dialog", dialog)

    def goto(self, path: str) -> Any:
        response = self.page.goto(self.base + path)
        assert response is not None and response.status == 200, path
        return self.page

    def shot(self, name: str) -> None:
        folder = os.environ.get("HAZE_SCREENSHOTS")
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
            self.page.screenshot(path=str(Path(folder) / f"dashboard-{name}.png"), full_page=True)


def cell(page: Any, queue: str, column: str) -> str:
    text: str = page.locator(f'tr[data-queue="{queue}"] td.{column}').inner_text()
    return text.strip()


def test_dashboard_in_chromium(root: Path, server: str, browser: Any) -> None:
    async def setup(app: App) -> str:
        for n in ("alpha", "beta", XSS):
            await web_boom.dispatch({"n": n}, queue="reports")
        await Worker(app, "main", ["reports"], stop_when_empty=True, sleep=0.05).run()
        for i in range(3):
            await web_ok.dispatch({"i": i})
        batch = (
            await Queue.batch([web_ok.with_({"i": 10}), web_ok.with_({"i": 11})])
            .name("nightly import")
            .on_queue("reports")
            .dispatch()
        )
        return batch.id

    batch_id = in_app(root, setup)
    p = Page(browser, server)

    # Overview: the numbers are the queue's, and they refresh without a reload.
    page = p.goto("/")
    assert cell(page, "default", "waiting") == "3"
    assert cell(page, "reports", "waiting") == "2"
    assert cell(page, "reports", "failed") == "3"
    assert page.locator('#runtimes tr[data-job="web_boom"] td.runs').inner_text() == "3"
    p.shot("overview")
    in_app(root, lambda app: web_ok.dispatch({"i": 99}))
    page.wait_for_function(
        """() => document.querySelector('tr[data-queue="default"] td.waiting')
              .innerText.trim() === '4'""",
        timeout=15000,
    )

    # Failed jobs: search by exception text, retry the one found.
    page = p.goto("/failed")
    assert page.locator("#failed-jobs tbody tr").count() == 3
    p.shot("failed")
    page.fill('input[name="exception"]', "web boom beta")
    page.click("#failed-search button[type=submit]")
    page.wait_for_url("**/failed?*exception=web+boom+beta*")
    rows = page.locator("#failed-jobs tbody tr")
    assert rows.count() == 1
    rows.first.locator("button", has_text="Retry").click()
    page.wait_for_selector(".flash")
    assert "Retried 1 failed job(s)." in page.inner_text(".flash")
    left = in_app(root, lambda app: Queue.failed())
    assert sorted(j.payload["n"] for j in left) == sorted(["alpha", XSS])
    assert in_app(root, lambda app: Queue.size("reports")) == 3

    # The <script> payload is shown as text and never runs.
    xss = next(j for j in left if j.payload["n"] == XSS)
    page = p.goto(f"/failed/main/{xss.id}")
    assert XSS in page.inner_text("#payload")
    assert "ValueError: web boom" in page.inner_text("#traceback")
    p.shot("failed-detail")

    # Batches: cancel one from its page.
    page = p.goto("/batches")
    page.click(f'tr[data-id="{batch_id}"] a')
    page.wait_for_selector("#cancel-batch")
    p.shot("batch")
    page.click("#cancel-batch")
    page.wait_for_selector(".flash")
    assert "cancelled" in page.inner_text("#batch-state")
    batch = in_app(root, lambda app: Queue.find_batch(batch_id))
    assert batch is not None and batch.cancelled

    # Queues: pause from the overview.
    page = p.goto("/")
    page.locator('tr[data-queue="default"] button', has_text="Pause").click()
    page.wait_for_selector(".flash")
    assert in_app(root, lambda app: paused_queues(app, "main", ["default"])) == {"default"}
    assert "paused" in cell(page, "default", "state")

    page = p.goto(f"/jobs?id={xss.id[:8]}")
    assert xss.id in page.inner_text("main")

    # Workers: a real `haze queue:work` process, listed with the job it runs now.
    worker_root = root.parent / "worker"
    shutil.copytree(root / "config", worker_root / "config")
    (worker_root / "app" / "job").mkdir(parents=True)
    (worker_root / "app" / "job" / "slow.py").write_text(SLOW_JOB)
    in_app(root, lambda app: web_slow.dispatch({"s": 30}, queue="slow"))
    worker = subprocess.Popen(
        [str(HAZE), "--root", str(worker_root), "queue:work", "--queue", "slow,default"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            page = p.goto("/workers")
            if page.locator("#workers td.running", has_text="web_slow").count():
                break
            assert time.monotonic() < deadline, page.inner_text("main")
            time.sleep(0.5)
        row = page.locator("#workers tbody tr").first
        assert str(worker.pid) in row.inner_text()
        assert "slow, default" in row.inner_text()
        p.shot("workers")
    finally:
        worker.kill()  # not worth waiting for its 30-second job
        worker.wait(10)
    assert p.problems == []


def test_unauthorised_browser_gets_401_and_a_post_without_token_403(
    root: Path, server: str, browser: Any
) -> None:
    async def fail_one(app: App) -> None:
        await web_boom.dispatch({"n": "hidden"}, queue="reports")
        await Worker(app, "main", ["reports"], stop_when_empty=True, sleep=0.05).run()

    in_app(root, fail_one)
    for credentials in (None, {"username": "haze", "password": "wrong"}):
        context = browser.new_context(http_credentials=credentials)
        response = context.request.get(server + "/failed?connection=main")
        assert response.status == 401
        assert response.headers["www-authenticate"].startswith("Basic ")
        assert "web_boom" not in response.text()
        context.close()
    context = browser.new_context(http_credentials={"username": "haze", "password": PASSWORD})
    assert context.request.get(server + "/").status == 200
    # Signed in, but a POST without the page's CSRF token (a cross-site form) is refused.
    refused = context.request.post(
        server + "/queues/pause", form={"connection": "main", "queue": "default"}
    )
    assert refused.status == 403
    assert in_app(root, lambda app: paused_queues(app, "main", ["default"])) == set()
