"""What the attack tests share: throwaway databases named ``attack3_<what>_<pid>`` on the
local PostgreSQL and MariaDB servers (``pg_database("attack3_<what>")`` and
``mysql_database`` of the database tests' ``harness``), an app over one of them (or over
SQLite, or the in-process ``memory`` connection), and a worker that drains it.

These tests are written from the user docs only (README.md, docs/*.md): each one's
docstring quotes the promise it checks. A test marked ``xfail(strict=True)`` reproduces a
finding that the implementation does not meet yet; the others are attacks that held up.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from haze import App, define_database_config, define_queue_config
from haze._workers.worker import Worker
from haze.connectors.migrations import ensure_queue_tables

# the attack tests' databases come from the database tests' harness, which lives there
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "database"))

from harness import PG_ADMIN_URL, mysql_admin
from harness import mysql_database as mysql_database  # re-exported for the tests
from harness import pg_database as pg_database

_tables = itertools.count()


def pg_terminate(url: str) -> int:
    """Terminate every server process of ``url``'s database (and of no other): what a
    server restart, a failover or an idle-session timeout does to a client's pool."""
    import psycopg

    name = urlsplit(url).path.lstrip("/")
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as c:
        rows = c.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,),
        ).fetchall()
    return sum(1 for (ok,) in rows if ok)


def mysql_kill(url: str) -> int:
    """KILL every connection to ``url``'s database (and to no other)."""
    name = urlsplit(url).path.lstrip("/")
    with contextlib.closing(mysql_admin()) as c, c.cursor() as cur:
        cur.execute(
            "SELECT id FROM information_schema.processlist WHERE db = %s AND id <> CONNECTION_ID()",
            (name,),
        )
        ids = [r[0] for r in cur.fetchall()]
        for i in ids:
            with contextlib.suppress(Exception):
                cur.execute(f"KILL {int(i)}")
    return len(ids)


def memory_app(**options: Any) -> App:
    """An app whose default connection is the in-process ``memory`` one."""
    conn = {"driver": "memory", **options}
    return App(queue=define_queue_config(default="memory", connections={"memory": conn}))


@contextlib.asynccontextmanager
async def db_app(url: str, **options: Any) -> AsyncIterator[App]:
    """An app whose default connection ``db`` is a ``database`` one on ``url``, with its
    own queue tables (fresh names, so tests on one session database never meet)."""
    n = next(_tables)
    conn = {
        "driver": "database",
        "connection": "main",
        "table": f"atk_jobs_{n}",
        "failed_table": f"atk_failed_{n}",
        **options,
    }
    app = App(
        queue=define_queue_config(default="db", connections={"db": conn}),
        database=define_database_config(default="main", connections={"main": {"url": url}}),
    )
    async with app:
        await ensure_queue_tables(app)
        yield app


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/attack.db"


async def drain(app: App, concurrency: int = 1, within: float = 60) -> None:
    """Run a worker of ``db`` until a claim finds nothing ready and nothing runs."""
    worker = Worker(
        app, "db", ["default"], concurrency, sleep=0.05, max_sleep=0.05, stop_when_empty=True
    )
    await asyncio.wait_for(worker.run(), within)
