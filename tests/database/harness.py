"""The backends the database test modules share: a session database on each local server.

A module names its session database by a prefix (``dbx_sem``, ``dbx_flt``) and gets
``<prefix>_<pid>``, dropped at the end; databases of earlier test processes that died
before dropping theirs (their pid is gone) are dropped first. Its ``pg_url`` and
``mysql_url`` fixtures are one line over ``pg_database`` / ``mysql_database``, and
``backend_url`` turns a backend name into a URL through them (or the session's ``sqld``).
``database_app`` opens an app over one of those URLs with queue tables of its own.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from haze import App, define_database_config, define_queue_config
from haze.connectors.migrations import ensure_queue_tables
from services import require_server

PG_ADMIN_URL = os.environ.get(
    "HAZE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
MYSQL_ADMIN_URL = os.environ.get("HAZE_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/")
BACKENDS = ["sqlite", "postgres", "mariadb", "libsql"]

_apps = itertools.count()


def reachable(url: str) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 0), 0.5):
            return True
    except OSError:
        return False


def _stale(names: list[str]) -> list[str]:
    """Session databases of test processes that died before dropping them (pid gone)."""
    out = []
    for name in names:
        pid = name.rsplit("_", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                out.append(name)
            except PermissionError:
                pass
    return out


def pg_database(prefix: str, *setup: str, encoding: str | None = None) -> Iterator[str]:
    """A PostgreSQL database for the session: its URL (skips with no server).

    ``setup`` statements run on the admin connection after ``CREATE``; ``{db}`` in
    them is the database's name. ``encoding``: the database's (C collation), else the
    server's default.
    """
    require_server("PostgreSQL", PG_ADMIN_URL)
    import psycopg

    db = f"{prefix}_{os.getpid()}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as c:
        rows = c.execute(f"SELECT datname FROM pg_database WHERE datname LIKE '{prefix}_%'")
        for name in _stale([r[0] for r in rows.fetchall()]):
            c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        c.execute(f"DROP DATABASE IF EXISTS {db}")
        if encoding is None:
            c.execute(f"CREATE DATABASE {db}")
        else:
            c.execute(
                f"CREATE DATABASE {db} ENCODING '{encoding}' LC_COLLATE 'C' LC_CTYPE 'C' "
                "TEMPLATE template0"
            )
        for sql in setup:
            c.execute(sql.format(db=db))
    yield PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{db}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


def mysql_admin() -> Any:
    """A PyMySQL connection to the MySQL/MariaDB server as its admin (no database)."""
    import pymysql

    parts = urlsplit(MYSQL_ADMIN_URL)
    return pymysql.connect(
        host=parts.hostname,
        port=parts.port or 3306,
        user=parts.username or "root",
        password=parts.password or "",
    )


def mysql_database(prefix: str) -> Iterator[str]:
    """A MySQL/MariaDB database for the session: its URL (skips with no server)."""
    require_server("MySQL/MariaDB", MYSQL_ADMIN_URL)
    db = f"{prefix}_{os.getpid()}"
    with contextlib.closing(mysql_admin()) as c, c.cursor() as cur:
        cur.execute("SHOW DATABASES")
        for name in _stale([r[0] for r in cur.fetchall() if r[0].startswith(f"{prefix}_")]):
            cur.execute(f"DROP DATABASE IF EXISTS {name}")
        cur.execute(f"DROP DATABASE IF EXISTS {db}")
        cur.execute(f"CREATE DATABASE {db}")
    yield MYSQL_ADMIN_URL.rstrip("/") + f"/{db}"
    with contextlib.closing(mysql_admin()) as c, c.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {db}")


def backend_url(request: pytest.FixtureRequest, kind: str, tmp_path: Path) -> str:
    """The URL of one of ``BACKENDS``: a SQLite file under ``tmp_path``, or the module's
    ``pg_url`` / ``mysql_url`` fixture, or the session's ``sqld_url``."""
    if kind == "sqlite":
        return f"sqlite:///{tmp_path}/queue.db"  # tmp_path is absolute: sqlite:////…
    fixture = {"postgres": "pg_url", "mariadb": "mysql_url", "libsql": "sqld_url"}[kind]
    return str(request.getfixturevalue(fixture))


@contextlib.asynccontextmanager
async def database_app(
    url: str,
    prefix: str,
    *,
    connection: str = "db",
    create: bool = True,
    key: str | None = None,
    **options: Any,
) -> AsyncIterator[App]:
    """An app (with the encryption ``key``, if any) whose default queue connection
    ``connection`` is a ``database`` one on ``url`` (with ``options``), over queue tables
    of its own: ``<prefix>_<pid>_<n>_j`` and ``_f`` (its driver's ``table`` and
    ``failed_table``), made on entry unless ``create`` is false and dropped on exit, so
    tests sharing a session database never meet."""
    tag = f"{prefix}_{os.getpid()}_{next(_apps)}"
    jobs, failed = f"{tag}_j", f"{tag}_f"
    conn = {
        "driver": "database",
        "connection": "main",
        "table": jobs,
        "failed_table": failed,
        **options,
    }
    app = App(
        queue=define_queue_config(default=connection, connections={connection: conn}),
        database=define_database_config(default="main", connections={"main": {"url": url}}),
        key=key,
    )
    async with app:
        if create:
            await ensure_queue_tables(app)
        try:
            yield app
        finally:
            with contextlib.suppress(Exception):
                await app.database().execute(f"DROP TABLE IF EXISTS {jobs}")
                await app.database().execute(f"DROP TABLE IF EXISTS {failed}")
