"""Worker processes on one backend, for the SIGKILL storm suites (``tests/batch_storm``,
``tests/concurrency_limit``).

:class:`BackendProcs` names a fresh set of tables (``<name>_jobs_<tag>``, failed, cache)
and a Redis prefix (``<name>-<tag>``), opens the same queue and shared-store config in
the test process (:attr:`BackendProcs.app`) as the worker app reads from its
``<VAR>_*`` environment variables (:meth:`BackendProcs.env`), and removes them after
the run (:func:`backend_run`). Backends: ``"postgres"`` and ``"sqlite"`` (a
``database`` connection ``db``) and ``"redis"`` (a ``redis`` connection ``r``).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from haze import (
    App,
    define_cache_config,
    define_database_config,
    define_queue_config,
    define_redis_config,
)
from haze.connectors.migrations import ensure_queue_tables
from services import delete_redis_prefix
from worker_procs import WorkerProcs


class BackendProcs(WorkerProcs):
    def __init__(
        self,
        tmp: Path,
        app_root: Path,
        backend: str,
        url: str,
        *,
        name: str,
        redis_url: str,
        db_options: Mapping[str, Any],
        redis_options: Mapping[str, Any],
    ) -> None:
        """``db_options``/``redis_options``: what the ``db``/``r`` connection adds to
        its driver, tables and prefix (retry_after, queues)."""
        super().__init__(tmp, app_root)
        self.backend = backend
        self.url = url
        self.redis_url = redis_url
        tag = uuid.uuid4().hex[:8]
        self.connection = "r" if backend == "redis" else "db"
        self.store = "redis" if backend == "redis" else "db"
        self.prefix = f"{name}-{tag}"
        self.tables = {
            "jobs": f"{name}_jobs_{tag}",
            "failed": f"{name}_failed_{tag}",
            "cache": f"{name}_cache_{tag}",
        }
        self.db_url = url if backend != "redis" else f"sqlite:///{tmp}/unused.db"
        self.app = App(
            queue=define_queue_config(
                default=self.connection,
                store=self.store,
                connections={
                    "db": {
                        "driver": "database",
                        "connection": "main",
                        "table": self.tables["jobs"],
                        "failed_table": self.tables["failed"],
                        **db_options,
                    },
                    "r": {
                        "driver": "redis",
                        "url": redis_url,
                        "prefix": self.prefix,
                        **redis_options,
                    },
                },
            ),
            cache=define_cache_config(
                default=self.store,
                stores={
                    "db": {
                        "driver": "database",
                        "connection": "main",
                        "table": self.tables["cache"],
                    },
                    "redis": {
                        "driver": "redis",
                        "connection": "default",
                        "prefix": self.prefix + ":store:",
                    },
                },
            ),
            database=define_database_config(
                default="main", connections={"main": {"url": self.db_url}}
            ),
            redis=define_redis_config(
                default="default", connections={"default": {"url": redis_url}}
            ),
        )

    def env(self, var: str, **extra: str) -> dict[str, str]:
        """This environment, with ``<var>_CONNECTION``, ``_STORE``, ``_DB_URL``, ``_TABLE``,
        ``_FAILED_TABLE``, ``_CACHE_TABLE``, ``_REDIS_URL``, ``_PREFIX``, ``_RETRY_AFTER``
        (3s), ``_RUNS_FILE`` and ``extra`` (``<var>_<key>``) for the worker app."""
        env = dict(os.environ)
        values = {
            "CONNECTION": self.connection,
            "STORE": self.store,
            "DB_URL": self.db_url,
            "TABLE": self.tables["jobs"],
            "FAILED_TABLE": self.tables["failed"],
            "CACHE_TABLE": self.tables["cache"],
            "REDIS_URL": self.redis_url,
            "PREFIX": self.prefix,
            "RETRY_AFTER": "3s",
            **extra,
            "RUNS_FILE": str(self.runs_file),
        }
        env.update({f"{var}_{k}": v for k, v in values.items()})
        env.update(PYTHONUNBUFFERED="1", COLUMNS="200")
        return env

    async def cleanup(self) -> None:
        if self.backend == "redis":
            await delete_redis_prefix(self.redis_url, self.prefix)
        elif self.backend == "postgres":
            for t in self.tables.values():
                await self.app.database().execute(f"DROP TABLE IF EXISTS {t}")


P = TypeVar("P", bound=BackendProcs)


@contextlib.asynccontextmanager
async def backend_run(procs: P) -> AsyncIterator[P]:
    """``procs.app`` open, with its tables; afterwards every worker killed and what the
    run left removed."""
    async with procs.app:
        if procs.backend != "redis":
            await ensure_queue_tables(procs.app)
        try:
            yield procs
        finally:
            procs.kill_all()
            with contextlib.suppress(Exception):
                await procs.cleanup()
