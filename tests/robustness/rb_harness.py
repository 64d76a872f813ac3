"""Support for the robustness tests: one queue backend per test, real worker processes.

A :class:`Rig` points the app in ``rb_app/`` at the test's own backend, for dispatching
from the test and for ``haze queue:work`` processes (``WorkerProcs``):

- ``sqlite``: a file under the test's tmp dir;
- ``postgres``: the session's database (``pg_url`` in conftest), with queue tables named
  for the test;
- ``redis``: the shared server with a key prefix of the test's own (deleted after).

Rows can be written raw (``insert_raw``), as a hand-edited row or another producer would,
and ``leftover()`` says what is still queued or claimed after the workers stopped.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import json
import os
import runpy
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from haze import App
from haze.connectors.migrations import ensure_queue_tables
from worker_procs import WorkerProcs

HERE = Path(__file__).parent
APP = HERE / "rb_app"
_redis = runpy.run_path(str(HERE.parent / "drivers" / "redis_spec.py"))
REDIS_URL: str = _redis["REDIS_URL"]
needs_redis = _redis["needs_redis"]
_db_harness = runpy.run_path(str(HERE.parent / "database" / "harness.py"))
pg_database = _db_harness["pg_database"]
PG_ADMIN_URL: str = _db_harness["PG_ADMIN_URL"]

# The worker app's job module, loaded here too so this process can dispatch its jobs.
_spec = importlib.util.spec_from_file_location(
    "rb_jobs_in_tests", APP / "app" / "job" / "rb_jobs.py"
)
assert _spec is not None and _spec.loader is not None
jobs = importlib.util.module_from_spec(_spec)
sys.modules["rb_jobs_in_tests"] = jobs
_spec.loader.exec_module(jobs)

_names = itertools.count()


class Rig(WorkerProcs):
    """One backend (``sqlite``, ``postgres`` or ``redis``) for one test."""

    def __init__(self, kind: str, tmp: Path, db_url: str | None, retry_after: str) -> None:
        super().__init__(tmp, APP)
        n = next(_names)
        self.kind = kind
        self.connection = "r" if kind == "redis" else "db"
        self.db_url = db_url or f"sqlite:///{tmp}/rb.db"
        self.table = f"rb_jobs_{os.getpid()}_{n}"
        self.failed_table = f"rb_failed_{os.getpid()}_{n}"
        self.prefix = f"hzrb-{os.getpid()}-{n}-{int(time.time() * 1000) % 100000}"
        self.retry_after = retry_after
        self.env = dict(os.environ)
        self.env.update(
            RB_DB_URL=self.db_url,
            RB_TABLE=self.table,
            RB_FAILED_TABLE=self.failed_table,
            RB_REDIS_URL=REDIS_URL,
            RB_PREFIX=self.prefix,
            RB_RETRY_AFTER=retry_after,
            RB_RUNS_FILE=str(self.runs_file),
            PYTHONUNBUFFERED="1",
            COLUMNS="200",
        )
        self.app = self._app()

    def _app(self) -> App:
        # The worker app's config files, read with this test's environment (not
        # App(root=...): discovery would import the job module a second time).
        saved = dict(os.environ)
        os.environ.update(self.env)
        try:
            queue = runpy.run_path(str(APP / "config" / "queue.py"))["config"]
            database = runpy.run_path(str(APP / "config" / "database.py"))["config"]
        finally:
            os.environ.clear()
            os.environ.update(saved)
        return App(queue=queue, database=database)

    def worker(self, *args: str, queues: str = "default") -> subprocess.Popen[bytes]:
        return self.spawn(self.connection, queues, args, self.env)

    async def run_until_empty(self, *args: str, within: float = 60) -> tuple[int, str]:
        """One ``queue:work --stop-when-empty``; its exit code and its output."""
        p = self.worker("--stop-when-empty", *args)
        code = await self.wait_exit(p, within)
        return code, self.log(p)

    # -- raw access ------------------------------------------------------------------

    async def insert_raw(self, body: str, queue: str = "default") -> str:
        """Queue ``body`` as it is, bypassing dispatch (a hand-edited row); returns the
        BullMQ job id on redis."""
        if self.kind == "redis":
            driver: Any = self.app.driver("r")
            link = driver._link()
            from haze.drivers.redis.scripts import _NewJob, _now_ms

            job_id = await link.scripts(queue).addJob(
                _NewJob("raw", body, 0, _now_ms()), link.client
            )
            return str(job_id.decode() if isinstance(job_id, bytes) else job_id)
        now = time.time()
        await self.app.database().execute(
            f"INSERT INTO {self.table} (queue, payload, attempts, available_at, created_at) "
            "VALUES (?, ?, 0, ?, ?)",
            (queue, body, now, now),
        )
        return ""

    async def redis_hash(self, job_id: str, queue: str = "default") -> dict[str, str]:
        client = self.redis()
        return {
            _text(k): _text(v)
            for k, v in (await client.hgetall(f"{self.prefix}:{queue}:{job_id}")).items()
        }

    def redis(self) -> Any:
        driver: Any = self.app.driver("r")
        return driver._link().client

    async def leftover(self, queue: str = "default") -> list[str]:
        """What is still queued, delayed or claimed (nothing, once every job ended)."""
        if self.kind == "redis":
            client = self.redis()
            out: list[str] = []
            key = f"{self.prefix}:{queue}"
            for part in ("wait", "active", "paused"):
                out += [f"{part}:{_text(x)}" for x in await client.lrange(f"{key}:{part}", 0, -1)]
            for part in ("delayed", "prioritized"):
                out += [f"{part}:{_text(x)}" for x in await client.zrange(f"{key}:{part}", 0, -1)]
            return out
        rows = await self.app.database().fetchall(f"SELECT id, payload FROM {self.table}")
        return [f"row {r[0]}: {r[1]}" for r in rows]

    async def failed(self) -> list[Any]:
        return list(await self.app.driver(self.connection).failed.list())


@contextlib.asynccontextmanager
async def rig(
    kind: str, tmp: Path, db_url: str | None = None, retry_after: str = "90s"
) -> AsyncIterator[Rig]:
    r = Rig(kind, tmp, db_url, retry_after)
    previous = os.environ.get("RB_RUNS_FILE")
    os.environ["RB_RUNS_FILE"] = str(r.runs_file)  # for jobs this process runs itself
    async with r.app:
        if kind != "redis":
            await ensure_queue_tables(r.app)
        try:
            yield r
        finally:
            r.kill_all()
            if kind == "redis":
                _redis["delete_prefix"](r.prefix + ":")
            else:
                with contextlib.suppress(Exception):
                    await r.app.database().execute(f"DROP TABLE IF EXISTS {r.table}")
                    await r.app.database().execute(f"DROP TABLE IF EXISTS {r.failed_table}")
            if previous is None:
                os.environ.pop("RB_RUNS_FILE", None)
            else:
                os.environ["RB_RUNS_FILE"] = previous


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def envelope(**fields: Any) -> str:
    """A haze envelope of ``rb_record`` with ``fields`` set as given (any JSON type)."""
    body: dict[str, Any] = {
        "v": 1,
        "id": fields.pop("id", None) or os.urandom(16).hex(),
        "job": "rb_record",
        "payload": {"k": "x"},
        "queue": "default",
        "ts": time.time(),
    }
    body.update(fields)
    return json.dumps(body)
