"""Schema files and ``haze db:migrate``.

``haze make:queue-tables`` writes ``database/migrations/<stamp>_create_queue_tables.sql``
into the app, rendered for the dialect of the queue connection's database with the
configured table names. ``haze db:migrate`` applies every ``database/migrations/*.sql``
not yet recorded in the ``haze_migrations`` table, each in its own transaction, and
records it; running it again changes nothing. Then it upgrades the tables haze
created in earlier versions where their definition changed (``upgrades.py``: on
MySQL/MariaDB, a binary collation and 255-character queue columns).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from haze._kernel.errors import ConfigError
from haze._kernel.sqlfiles import queue_schema
from haze.database.upgrades import upgrade_tables

if TYPE_CHECKING:
    from haze._app.app import App
    from haze.database import Connector

__all__ = ["MigrationResult", "make_queue_tables", "migrate", "pending_migrations"]

MIGRATIONS_DIR = Path("database") / "migrations"
_LEDGER = "haze_migrations"


@dataclass
class MigrationResult:
    applied: list[str]
    skipped: list[str]
    #: haze's own tables upgraded from an earlier version's definition
    upgraded: list[str] = field(default_factory=list)


def _queue_db_connection(app: App, connection: str | None) -> tuple[str, str, str, str]:
    """(queue connection, database connection, jobs table, failed table)."""
    qc = app.queue_config
    if connection is None:
        db_conns = [n for n, c in qc.connections.items() if c["driver"] == "database"]
        if qc.connections[qc.default]["driver"] == "database":
            connection = qc.default
        elif db_conns:
            connection = db_conns[0]
        else:
            raise ConfigError(
                "no connection uses the database driver; add one to config/queue.py, e.g. "
                '"database": {"driver": "database", "connection": "main"}',
                source=qc.source,
                key="connections",
            )
    options = qc.connections[app.connection_name(connection)]
    if options["driver"] != "database":
        raise ConfigError(
            f"connection {connection!r} does not use the database driver",
            source=qc.source,
            key=f"connections.{connection}.driver",
        )
    db = options.get("connection") or app.database_config.default
    return (
        connection,
        db,
        options.get("table") or "jobs",
        options.get("failed_table") or "failed_jobs",
    )


def make_queue_tables(app: App, connection: str | None = None, *, force: bool = False) -> Path:
    """Write the queue-tables migration into the app; returns its path."""
    if app.root is None:
        raise ConfigError("make:queue-tables needs an app root (App(root=...))")
    conn, db, jobs, failed = _queue_db_connection(app, connection)
    dialect = app.database(db).dialect
    directory = app.root / MIGRATIONS_DIR
    directory.mkdir(parents=True, exist_ok=True)
    name = f"create_{jobs}_and_{failed}_tables.sql"
    existing = sorted(directory.glob(f"*_{name}"))
    if existing and not force:
        return existing[0]
    path = existing[0] if existing else directory / f"{time.strftime('%Y%m%d%H%M%S')}_{name}"
    header = (
        f"-- haze queue tables for connection {conn!r} ({dialect}, database {db!r}).\n"
        "-- Written by `haze make:queue-tables`; applied by `haze db:migrate`.\n"
    )
    body = ";\n\n".join(queue_schema(dialect, jobs, failed)) + ";\n"
    path.write_text(header + body)
    return path


def _statements(sql: str) -> list[str]:
    lines = [ln for ln in sql.splitlines() if not ln.lstrip().startswith("--")]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


async def _ledger(db: Connector) -> set[str]:
    await db.execute(
        f"CREATE TABLE IF NOT EXISTS {_LEDGER} "
        "(name VARCHAR(191) PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)"
        if db.dialect not in ("sqlite", "libsql", "d1")
        else f"CREATE TABLE IF NOT EXISTS {_LEDGER} "
        "(name TEXT PRIMARY KEY, applied_at REAL NOT NULL)"
    )
    rows = await db.fetchall(f"SELECT name FROM {_LEDGER}")
    return {str(r[0]) for r in rows}


def pending_migrations(app: App) -> list[Path]:
    if app.root is None:
        return []
    directory = app.root / MIGRATIONS_DIR
    return sorted(directory.glob("*.sql")) if directory.is_dir() else []


async def migrate(app: App, database: str | None = None) -> MigrationResult:
    """Apply the app's migrations that are not recorded yet (idempotent)."""
    db = app.database(database)
    done = await _ledger(db)
    result = MigrationResult([], [])
    for path in pending_migrations(app):
        if path.name in done:
            result.skipped.append(path.name)
            continue
        statements = _statements(path.read_text())
        async with db.transaction() as tx:
            for stmt in statements:
                await tx.execute(stmt)
            await tx.execute(
                f"INSERT INTO {_LEDGER} (name, applied_at) VALUES (?, ?)", (path.name, time.time())
            )
        result.applied.append(path.name)
    result.upgraded = await upgrade_tables(db)
    return result


async def ensure_queue_tables(app: App, connection: str | None = None) -> None:
    """Create the queue tables directly (tests, benchmarks, the example app)."""
    _, db, jobs, failed = _queue_db_connection(app, connection)
    c = app.database(db)
    for stmt in queue_schema(c.dialect, jobs, failed):
        await c.execute(stmt)
