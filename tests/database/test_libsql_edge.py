"""libSQL (sqld) misbehaving under real ``haze queue:work`` processes and the dashboard.

- a token the server refuses (HTTP 401): the worker exits non-zero with one line naming
  the connection and the setting, and the dashboard shows a page saying so;
- a stuck sqld (writes stall, reads answer, through ``hrana_proxy.HranaProxy``): every
  request ends at its timeout, each failed try is logged, and SIGTERM stops the worker
  ``STOP_GRACE`` seconds after its last job at the latest.

Workers are ``python -m haze.cli --root tests/database/apps/edge queue:work`` processes;
their job (``apps/edge/app/job/edge_jobs.py``) appends a line per run to a runs file.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from haze import App, define_database_config, define_queue_config
from haze.cli.queue import STOP_GRACE
from haze.connectors.migrations import ensure_queue_tables
from hrana_proxy import HranaProxy, is_write, statements_of
from sqld import SqldServer, jwt_keypair
from worker_procs import WorkerProcs

pytestmark = pytest.mark.timeout(120)

APP = Path(__file__).parent / "apps" / "edge"
_spec = importlib.util.spec_from_file_location(
    "edge_jobs_in_tests", APP / "app" / "job" / "edge_jobs.py"
)
assert _spec is not None and _spec.loader is not None
jobs_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(jobs_module)
edge_record = jobs_module.edge_record


@pytest.fixture(scope="module")
def sqld_auth(
    tmp_path_factory: pytest.TempPathFactory, sqld_cache: Path, sqld_url: str
) -> Iterator[tuple[str, str]]:
    """A sqld that requires a JWT: (url, token)."""
    pytest.importorskip("cryptography")
    public_key, token = jwt_keypair()
    with SqldServer(
        tmp_path_factory.mktemp("sqld-edge-auth"), jwt_key=public_key, cache_dir=sqld_cache
    ) as server:
        yield server.url, token


def edge_app(url: str, table: str, token: str | None = None) -> App:
    main: dict[str, Any] = {"url": url}
    if token:
        main["auth_token"] = token
    return App(
        queue=define_queue_config(
            default="db",
            connections={
                "db": {"driver": "database", "table": table, "failed_table": f"{table}_failed"}
            },
        ),
        database=define_database_config(default="main", connections={"main": main}),
    )


class Workers(WorkerProcs):
    def env(self, url: str, table: str, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("EDGE_")}
        env.update(
            EDGE_DB_URL=url,
            EDGE_TABLE=table,
            EDGE_FAILED_TABLE=f"{table}_failed",
            EDGE_RUNS_FILE=str(self.runs_file),
            PYTHONUNBUFFERED="1",
            COLUMNS="200",
            **extra,
        )
        return env

    def runs(self) -> list[str]:
        if not self.runs_file.exists():
            return []
        return [line.split()[0] for line in self.runs_file.read_text().splitlines()]


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    w = Workers(tmp_path, APP)
    try:
        yield w
    finally:
        w.kill_all()


def table_name(tag: str) -> str:
    return f"edge_{tag}_{os.getpid()}_{time.monotonic_ns() % 10**6}"


# --------------------------------------------------------------------------- a refused token


@pytest.mark.parametrize("token", ["wrong", None], ids=["wrong-token", "no-token"])
async def test_a_refused_token_stops_the_worker_with_one_line(
    sqld_auth: tuple[str, str], workers: Workers, token: str | None
) -> None:
    url, good = sqld_auth
    bad = good[:-6] + "AAAAAA" if token == "wrong" else None
    env = workers.env(url, table_name("auth"), **({"EDGE_TOKEN": bad} if bad else {}))
    p = workers.spawn("db", "default", [], env)
    code = await workers.wait_exit(p, within=30)
    output = workers.out(p) + workers.err(p)
    assert code != 0, workers.log(p)
    assert "Traceback" not in output
    assert "unavailable" not in output  # not an outage to wait out
    [line] = [line for line in output.splitlines() if "HTTP 401" in line]
    assert "libSQL connection 'main'" in line
    assert "connections.main.auth_token" in line
    assert good not in output
    if bad:
        assert bad not in output


def test_the_dashboard_says_the_token_was_refused(sqld_auth: tuple[str, str]) -> None:
    from haze.dashboard import create_app
    from starlette.testclient import TestClient

    url, good = sqld_auth
    bad = good[:-6] + "AAAAAA"
    app = edge_app(url, table_name("dash"), token=bad)
    with TestClient(create_app(app, authorize=lambda request: True)) as client:
        for path in ("/", "/failed", "/batches"):
            response = client.get(path)
            assert response.status_code == 500, (path, response.text[:300])
            page = response.text
            assert "<html" in page.lower()  # the dashboard's page, not a bare 500
            assert "Traceback" not in page
            assert "HTTP 401" in page
            assert "connections.main.auth_token" in page
            assert bad not in page and good not in page


# --------------------------------------------------------------------------- a stuck sqld


class Stuck:
    """A proxy in front of the session's sqld that stalls every write once ``stuck``."""

    def __init__(self, url: str) -> None:
        self.stuck = False
        self.proxy = HranaProxy(url, self.rule)

    def rule(self, body: dict[str, Any]) -> Any:
        return "stall" if self.stuck and is_write(statements_of(body)) else "forward"


async def run_until_stuck(sqld_url: str, workers: Workers, timeout: str) -> tuple[Any, Stuck]:
    """Five jobs run by a worker through the proxy (request timeout ``timeout``); then
    the proxy stalls every write: (the worker process, the proxy)."""
    stuck = Stuck(sqld_url)
    stuck.proxy.__enter__()
    table = table_name("stuck")
    app = edge_app(sqld_url, table)
    async with app:
        await ensure_queue_tables(app)
        for i in range(5):
            await edge_record.dispatch({"k": f"s{i}"})
    p = workers.spawn(
        "db", "default", [], workers.env(stuck.proxy.url, table, EDGE_TIMEOUT=timeout)
    )
    await workers.wait_ready(p)
    deadline = time.monotonic() + 30
    while sorted(workers.runs()) != [f"s{i}" for i in range(5)]:
        assert time.monotonic() < deadline, workers.log(p)
        await asyncio.sleep(0.05)
    stuck.stuck = True
    return p, stuck


async def test_a_stuck_sqld_times_out_every_request_and_logs_each_try(
    sqld_url: str, workers: Workers
) -> None:
    p, stuck = await run_until_stuck(sqld_url, workers, "1s")
    try:
        await asyncio.sleep(5.5)
        tries = [
            line
            for line in workers.err(p).splitlines()
            if "WARNING libSQL connection 'main'" in line and "no answer within 1s" in line
        ]
        # the claim, the buffered acks, ...: every try that timed out, on its own line
        assert len(tries) >= 4, workers.log(p)
        assert p.poll() is None  # waiting for the server, not dead
        p.send_signal(signal.SIGTERM)
        assert await workers.wait_exit(p, within=STOP_GRACE + 5) == 0
    finally:
        stuck.proxy.__exit__(None, None, None)
    assert "Traceback" not in workers.log(p)
    assert sorted(workers.runs()) == [f"s{i}" for i in range(5)]  # each ran once


async def test_sigterm_stops_a_worker_on_a_stuck_sqld_within_the_grace(
    sqld_url: str, workers: Workers
) -> None:
    """Requests that each wait 20 s (the claim in flight, leaving the Workers page, the
    throughput counters, ...) do not hold the exit: the grace after the last job does."""
    p, stuck = await run_until_stuck(sqld_url, workers, "20s")
    try:
        await asyncio.sleep(1.0)  # a claim is waiting for its answer now
        began = time.monotonic()
        p.send_signal(signal.SIGTERM)
        assert await workers.wait_exit(p, within=60) == 0, workers.log(p)
        took = time.monotonic() - began
    finally:
        stuck.proxy.__exit__(None, None, None)
    assert took < STOP_GRACE + 4, (took, workers.log(p))
    out = workers.out(p)
    assert f"within {STOP_GRACE:g}s: exiting without them" in out
    assert "Worker stopped after 5 job(s)." in out
    assert "Traceback" not in workers.log(p)
