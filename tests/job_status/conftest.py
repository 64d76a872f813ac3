"""The job-status suites' real worker processes (``test_cancel_procs``, ``test_wait_notify``).

``worker_app`` (parametrised indirectly with ``"sqlite"``, ``"postgres"`` or ``"redis"``)
is this folder's app (``config/`` reads the ``JSTAT_*`` variables) opened here, the
:class:`WorkerProcs` to start ``haze queue:work`` processes with, and their environment.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from haze import App
from haze.connectors.migrations import ensure_queue_tables
from services import delete_redis_prefix, require_server, throwaway_pg_database
from worker_procs import WorkerProcs

APP = Path(__file__).parent
REDIS_URL = os.environ.get("HAZE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
PG_ADMIN_URL = os.environ.get(
    "HAZE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    require_server("PostgreSQL", PG_ADMIN_URL)
    with throwaway_pg_database(PG_ADMIN_URL, f"jstat_{os.getpid()}") as url:
        yield url


@pytest.fixture
async def worker_app(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[App, WorkerProcs, dict[str, str]]]:
    backend = request.param
    if backend == "redis":
        require_server("Redis", REDIS_URL)
    # On Redis the database connection is configured but unused.
    db_url = (
        request.getfixturevalue("pg_url")
        if backend == "postgres"
        else f"sqlite:///{tmp_path}/jstat.db"
    )
    prefix = f"jstat-{uuid.uuid4().hex[:8]}"
    procs = WorkerProcs(tmp_path, APP)
    env = {
        "JSTAT_CONNECTION": "r" if backend == "redis" else "db",
        "JSTAT_STORE": "redis" if backend == "redis" else "db",
        "JSTAT_DB_URL": db_url,
        "JSTAT_REDIS_URL": REDIS_URL,
        "JSTAT_PREFIX": prefix,
        "JSTAT_RUNS_FILE": str(procs.runs_file),
        "PYTHONUNBUFFERED": "1",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    app = App(APP)
    async with app:
        if backend != "redis":
            await ensure_queue_tables(app)
        try:
            yield app, procs, {**os.environ, **env}
        finally:
            for p in procs.procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in procs.procs:
                try:
                    await procs.wait_exit(p, 20)
                except TimeoutError:
                    pass
            procs.kill_all()
            if backend == "redis":
                await delete_redis_prefix(REDIS_URL, prefix)
