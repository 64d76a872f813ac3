"""``haze.integrations.asgi``: the ``run_in_server`` worker inside a real uvicorn, and
the cases where it must not start.

The uvicorn tests run a tiny app under ``tmp_path``: ``config/`` with the database
driver on a SQLite file, ``app/job/asgi_write.py`` (appends to a file, then sleeps) and
``server.py`` exposing ``app = run_in_server(starlette_app, App(root=...))``. uvicorn
runs in a subprocess whose environment has no pytest in it, because the integration
deliberately stays off whenever pytest is loaded in-process. The test process
dispatches into the same SQLite file with its own stand-in ``asgi_write`` definition
(registered here for dispatch only; the server's copy is the one that runs).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from haze import App, define_database_config, define_job, define_queue_config
from haze.connectors.migrations import ensure_queue_tables
from haze.integrations.asgi import ServerWorker, haze_lifespan, run_in_server
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

T = TypeVar("T")

posix = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

#: After a graceful shutdown uvicorn (0.29+) re-raises the signal it caught, so that the
#: parent sees how it ended: a clean SIGTERM exit is -SIGTERM, older versions exit 0.
CLEAN_EXIT = (0, -signal.SIGTERM)


@define_job(name="asgi_write")
async def asgi_write(payload: dict[str, Any]) -> None:  # pragma: no cover - runs in uvicorn
    raise AssertionError("asgi_write runs in the uvicorn subprocess only")


ran_in_process: list[Any] = []


@define_job(name="asgi_local")
async def asgi_local(payload: Any) -> None:
    ran_in_process.append(payload)


JOB = """\
import asyncio
from haze import define_job

@define_job(name="asgi_write")
async def asgi_write(payload: dict) -> None:
    with open(payload["file"], "a") as f:
        f.write(f"start {payload['tag']}\\n")
    await asyncio.sleep(payload.get("seconds", 0))
    with open(payload["file"], "a") as f:
        f.write(f"end {payload['tag']}\\n")
"""

SERVER = """\
from pathlib import Path

from haze import App
from haze.integrations.asgi import run_in_server
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route


async def home(request):
    return PlainTextResponse("ok")


app = run_in_server(Starlette(routes=[Route("/", home)]), App(root=Path(__file__).parent))
"""


def config_files(db: Path) -> dict[str, str]:
    return {
        "database.py": f"""\
            from haze import define_database_config
            config = define_database_config(
                default="main", connections={{"main": {{"url": "sqlite:///{db}"}}}}
            )
            """,
        "queue.py": """\
            from haze import define_queue_config
            config = define_queue_config(
                default="database",
                connections={
                    "database": {"driver": "database", "sleep": 0.05, "max_sleep": 0.2},
                },
                run_in_server=True,
            )
            """,
    }


def write_config(root: Path, db: Path) -> Path:
    for name, text in config_files(db).items():
        path = root / "config" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def in_app(root: Path, fn: Callable[[App], Awaitable[T]]) -> T:
    async def go() -> T:
        async with App(root=root) as app:
            return await fn(app)

    return asyncio.run(go())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Uvicorn:
    """``python -m uvicorn server:app`` in the app dir, its output collected by threads."""

    def __init__(self, root: Path, **env: str) -> None:
        self.port = free_port()
        clean = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
        clean.pop("HAZE_RUN_IN_SERVER", None)
        clean.pop("HAZE_APP_ROOT", None)
        clean.update(PYTHONUNBUFFERED="1", **env)
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "server:app",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--log-level",
                "info",
            ],
            cwd=root,
            env=clean,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self._pumping = threading.Thread(target=self._pump, daemon=True)
        self._pumping.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/", timeout=1).text == "ok":
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        self.kill()
        raise AssertionError(f"uvicorn did not start: {self.output}")

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._pumping.join(timeout=5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def server_app(tmp_path: Path) -> Path:
    """The uvicorn app dir; its SQLite file already holds the queue tables."""
    root = write_config(tmp_path / "site", tmp_path / "queue.db")
    (root / "app" / "job").mkdir(parents=True)
    (root / "app" / "job" / "asgi_write.py").write_text(JOB)
    (root / "server.py").write_text(SERVER)
    # The test process dispatches through a config-only twin (no app/job to import).
    write_config(tmp_path / "cfg", tmp_path / "queue.db")
    in_app(tmp_path / "cfg", ensure_queue_tables)
    return root


@pytest.fixture
def servers() -> Iterator[list[Uvicorn]]:
    started: list[Uvicorn] = []
    yield started
    for s in started:
        s.kill()


def dispatch(cfg: Path, file: Path, *jobs: tuple[str, float]) -> None:
    async def go(app: App) -> None:
        for tag, seconds in jobs:
            await asgi_write.dispatch({"file": str(file), "tag": tag, "seconds": seconds})

    in_app(cfg, go)


def log_of(file: Path) -> list[str]:
    return file.read_text().splitlines() if file.exists() else []


def wait_until(check: Callable[[], bool], timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


def waiting_jobs(cfg: Path) -> int:
    async def size(app: App) -> int:
        return await app.manager.size("default", "database")

    return in_app(cfg, size)


@posix
def test_uvicorn_runs_the_worker_and_drains_it_on_sigterm(
    server_app: Path, servers: list[Uvicorn], tmp_path: Path
) -> None:
    cfg, file = tmp_path / "cfg", tmp_path / "ran.txt"
    server = Uvicorn(server_app)
    servers.append(server)
    dispatch(cfg, file, ("a", 0), ("b", 0), ("c", 0))
    assert wait_until(lambda: len([ln for ln in log_of(file) if ln.startswith("end")]) == 3), (
        log_of(file),
        server.output,
    )
    assert sorted(log_of(file)) == ["end a", "end b", "end c", "start a", "start b", "start c"]

    # A job still running when uvicorn gets SIGTERM finishes before the process exits.
    dispatch(cfg, file, ("slow", 1.5))
    assert wait_until(lambda: "start slow" in log_of(file)), server.output
    server.proc.send_signal(signal.SIGTERM)
    code = server.proc.wait(timeout=20)
    server._pumping.join(timeout=5)  # the last lines
    assert code in CLEAN_EXIT, server.output
    assert log_of(file)[-2:] == ["start slow", "end slow"]
    assert waiting_jobs(cfg) == 0  # the row was deleted: done, not abandoned
    assert "Application shutdown complete" in server.output
    assert "Finished server process" in server.output
    assert "Traceback" not in server.output


@posix
def test_uvicorn_with_haze_run_in_server_0_starts_no_worker(
    server_app: Path, servers: list[Uvicorn], tmp_path: Path
) -> None:
    cfg, file = tmp_path / "cfg", tmp_path / "ran.txt"
    server = Uvicorn(server_app, HAZE_RUN_IN_SERVER="0")
    servers.append(server)
    dispatch(cfg, file, ("never", 0))
    time.sleep(1.5)
    assert log_of(file) == []
    assert waiting_jobs(cfg) == 1
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=20) in CLEAN_EXIT, server.output


# --------------------------------------------------------------------------- in-process


def database_app(tmp_path: Path, **run_in_server: Any) -> App:
    return App(
        queue=define_queue_config(
            default="database",
            connections={
                "database": {"driver": "database", "sleep": 0.05, "max_sleep": 0.2},
                "memory": {"driver": "memory"},
                "sync": {"driver": "sync"},
            },
            run_in_server=run_in_server or True,
        ),
        database=define_database_config(
            default="main", connections={"main": {"url": f"sqlite:///{tmp_path / 'q.db'}"}}
        ),
    )


def starlette_app(**kwargs: Any) -> Starlette:
    async def send(request: Request) -> PlainTextResponse:
        await asgi_local.dispatch(request.query_params["n"])
        return PlainTextResponse("queued")

    return Starlette(routes=[Route("/send", send)], **kwargs)


def test_testclient_in_process_starts_no_worker_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app = database_app(tmp_path)
    asyncio.run(ensure_queue_tables(app))
    caplog.set_level(logging.INFO, logger="haze")
    ran_in_process.clear()
    with TestClient(run_in_server(starlette_app(), app)) as client:
        assert client.get("/send", params={"n": "1"}).text == "queued"
        time.sleep(0.5)
        assert ran_in_process == []  # nothing consumes the database queue in a test
    assert "run_in_server worker not started (running under pytest)" in caplog.text


def test_haze_run_in_server_0_is_named_as_the_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HAZE_RUN_IN_SERVER", "0")
    caplog.set_level(logging.INFO, logger="haze")
    with TestClient(Starlette(lifespan=haze_lifespan(database_app(tmp_path)))):
        pass
    assert "run_in_server worker not started (HAZE_RUN_IN_SERVER=0)" in caplog.text


def test_haze_lifespan_forced_runs_jobs_dispatched_by_requests(tmp_path: Path) -> None:
    app = database_app(tmp_path)
    asyncio.run(ensure_queue_tables(app))
    ran_in_process.clear()
    with TestClient(starlette_app(lifespan=haze_lifespan(app, force=True))) as client:
        for n in range(3):
            assert client.get("/send", params={"n": str(n)}).text == "queued"
        assert wait_until(lambda: len(ran_in_process) == 3, timeout=10)
    assert sorted(ran_in_process) == ["0", "1", "2"]


async def test_a_sync_connection_is_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = ServerWorker(database_app(tmp_path, connection="sync"), force=True)
    with caplog.at_level(logging.WARNING, logger="haze"):
        await server.start()
    try:
        assert server.worker is None
        assert 'run_in_server skipped: connection "sync" is sync' in caplog.text
    finally:
        await server.stop()


async def test_memory_starts_an_extra_worker_only_with_queues_or_concurrency(
    tmp_path: Path,
) -> None:
    plain = ServerWorker(database_app(tmp_path, connection="memory"), force=True)
    await plain.start()
    try:
        assert plain.worker is None  # the web process already consumes memory
    finally:
        await plain.stop()
    extra = ServerWorker(database_app(tmp_path, connection="memory", queues=["low"]), force=True)
    await extra.start()
    try:
        assert extra.worker is not None
        assert extra.worker.queues == ["low"]
    finally:
        await extra.stop()
    assert extra.worker is None


async def test_a_database_connection_gets_a_worker_that_stops_with_the_server(
    tmp_path: Path,
) -> None:
    app = database_app(tmp_path, queues=["high", "default"], concurrency=2)
    await ensure_queue_tables(app)
    server = ServerWorker(app, force=True)
    await server.start()
    try:
        worker = server.worker
        assert worker is not None
        assert worker.queues == ["high", "default"]
        assert worker.concurrency == 2
        assert worker.control  # follows queue:restart / queue:pause
    finally:
        await server.stop()
    assert server.worker is None
