"""Schema files and ``haze db:migrate``.

``haze make:queue-tables`` writes ``database/migrations/<stamp>_create_<jobs>_and_<failed>
_tables.py`` into the app: a migration whose ``up`` is :func:`queue_tables`, so the DDL is
chosen when it is applied, for the dialect of the database it is applied to (SQLite,
PostgreSQL, MariaDB/MySQL, libSQL, D1), and one app moves between them.

``haze db:migrate`` applies every ``database/migrations/*.sql`` and ``*.py`` not yet
recorded in the ``haze_migrations`` table, in name order, each in its own transaction,
and records it; running it again changes nothing. A ``.py`` migration defines
``up(dialect) -> list of statements``. A migration is recorded by its name without the
suffix, so a ``.sql`` file replaced by a ``.py`` of the same stem stays applied.
Then it upgrades the tables haze created in earlier versions where their definition
changed (``upgrades.py``: on MySQL/MariaDB, a binary collation and 255-character
queue columns), and the queue tables an earlier haze created that need it
(``QUEUE_UPGRADES``: on PostgreSQL, the index claims read in due order).
"""

from __future__ import annotations

import importlib.util
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from haze._base.errors import ConfigError
from haze._base.sqlfiles import queue_dialect, queue_schema, queue_sql
from haze.connectors.upgrades import upgrade_tables
from haze.contracts.app import AppView

if TYPE_CHECKING:
    from haze.connectors import Connector

__all__ = [
    "MigrationResult",
    "make_queue_tables",
    "migrate",
    "migration_files",
    "migration_statements",
    "pending_migrations",
    "queue_tables",
]


class MigratingApp(AppView[object], Protocol):
    """What migrations read of an App: its config, its root and its SQL connectors."""

    def database(self, name: str | None = None) -> Connector: ...


MIGRATIONS_DIR = Path("database") / "migrations"
_LEDGER = "haze_migrations"

#: haze's own upgrades of queue tables an earlier haze created, applied by ``haze
#: db:migrate`` after the app's migrations to each jobs table on the database that
#: needs one, each in its own transaction: the dialect's ``upgrade_<step>`` statements
#: when its ``needs_<step>`` query finds a row (a dialect without them has nothing to
#: change). The table is reported as upgraded.
QUEUE_UPGRADES = (
    # claims read rows in due order from an index that starts at the due rows
    # (PostgreSQL; the other dialects' queue index already does)
    "due_index",
    # tenant groups: the group and turn columns and their indexes (every dialect)
    "groups",
)


@dataclass
class MigrationResult:
    applied: list[str]
    skipped: list[str]
    #: haze's own tables upgraded from an earlier version's definition
    upgraded: list[str] = field(default_factory=list)
    #: the migration being applied, left set when applying it raised: where it failed
    current: str | None = None


def _queue_db_connection(app: MigratingApp, connection: str | None) -> tuple[str, str, str, str]:
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


_PY_MIGRATION = '''\
"""The queue tables of connection {conn!r}: {jobs} and {failed}.

Written by `haze make:queue-tables`, applied by `haze db:migrate`. The SQL is chosen
when it is applied, for the database it is applied to: SQLite, PostgreSQL,
MariaDB/MySQL, libSQL or D1.
"""

from haze.connectors.migrations import queue_tables

up = queue_tables(jobs={jobs!r}, failed={failed!r})
'''

#: The first line of the dialect-specific ``.sql`` migrations older versions wrote.
_OLD_HEADER = re.compile(r"-- haze queue tables for connection '[^']*' \((\w+), ")


def queue_tables(jobs: str = "jobs", failed: str = "failed_jobs") -> Callable[[str], list[str]]:
    """A migration's ``up``: the queue tables' DDL for the dialect it is applied to.

    Example (what ``haze make:queue-tables`` writes)::

        from haze.connectors.migrations import queue_tables

        up = queue_tables(jobs="jobs", failed="failed_jobs")
        up("postgres")  # ['CREATE TABLE IF NOT EXISTS jobs (id BIGSERIAL ...', ...]
    """

    def up(dialect: str) -> list[str]:
        return queue_schema(dialect, jobs, failed)

    return up


def dialect_specific(path: Path) -> str | None:
    """The dialect a ``.sql`` queue-tables migration of an older haze was written for,
    or None for any other file."""
    if path.suffix != ".sql":
        return None
    with path.open(encoding="utf-8") as f:
        match = _OLD_HEADER.match(f.readline())
    return match[1] if match else None


def convert_hint(path: Path) -> str:
    """One line: how to turn an old dialect-specific queue-tables migration into one
    that runs on every database."""
    return (
        f"{path.name} holds {dialect_specific(path)} SQL only; run `haze make:queue-tables "
        f"--force` to replace it with {path.stem}.py, which creates the tables on every "
        "database (where the .sql was applied, the .py counts as applied)"
    )


def make_queue_tables(
    app: MigratingApp, connection: str | None = None, *, force: bool = False
) -> Path:
    """Write the queue-tables migration into the app; returns its path.

    An existing one is kept, unless ``force``: then it is rewritten under the same stem
    (an older dialect-specific ``.sql`` one becomes the ``.py`` that runs on every
    database, and stays recorded as applied where it was).
    """
    if app.root is None:
        raise ConfigError("make:queue-tables needs an app root (App(root=...))")
    conn, _, jobs, failed = _queue_db_connection(app, connection)
    directory = app.root / MIGRATIONS_DIR
    directory.mkdir(parents=True, exist_ok=True)
    stem = f"create_{jobs}_and_{failed}_tables"
    existing = sorted([*directory.glob(f"*_{stem}.py"), *directory.glob(f"*_{stem}.sql")])
    if existing and not force:
        return existing[0]
    path = (
        existing[0].with_suffix(".py")
        if existing
        else directory / f"{time.strftime('%Y%m%d%H%M%S')}_{stem}.py"
    )
    # whole or not at all: a half-written migration would be kept as "exists"
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(_PY_MIGRATION.format(conn=conn, jobs=jobs, failed=failed))
    tmp.replace(path)
    for old in existing:
        if old != path:
            old.unlink()
    return path


def _statements(sql: str) -> list[str]:
    lines = [ln for ln in sql.splitlines() if not ln.lstrip().startswith("--")]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


async def _ledger(db: Connector) -> set[str]:
    """The stems of the applied migrations (recorded by file name)."""
    await db.execute(
        f"CREATE TABLE IF NOT EXISTS {_LEDGER} "
        "(name VARCHAR(191) PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)"
        if db.dialect not in ("sqlite", "libsql", "d1")
        else f"CREATE TABLE IF NOT EXISTS {_LEDGER} "
        "(name TEXT PRIMARY KEY, applied_at REAL NOT NULL)"
    )
    rows = await db.fetchall(f"SELECT name FROM {_LEDGER}")
    return {Path(str(r[0])).stem for r in rows}


def pending_migrations(app: MigratingApp) -> list[Path]:
    """Every migration file of the app (``*.sql`` and ``*.py``), in name order."""
    return [] if app.root is None else migration_files(app.root)


def migration_files(root: Path) -> list[Path]:
    """Every migration file under ``root`` (``*.sql`` and ``*.py``), in name order."""
    directory = root / MIGRATIONS_DIR
    if not directory.is_dir():
        return []
    return sorted(
        (p for p in directory.iterdir() if p.suffix in (".sql", ".py") and p.is_file()),
        key=lambda p: p.name,
    )


def _python_up(path: Path) -> Callable[[str], Sequence[str]]:
    spec = importlib.util.spec_from_file_location(f"_haze_migration_{path.stem}", path)
    if spec is None or spec.loader is None:  # pragma: no cover
        raise ConfigError("cannot be imported", source=str(path))
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        raise ConfigError(f"failed to import: {type(e).__name__}: {e}", source=str(path)) from e
    up = getattr(module, "up", None)
    if not callable(up):
        raise ConfigError(
            "a .py migration defines up(dialect) returning its SQL statements, e.g. "
            "up = queue_tables() from haze.connectors.migrations",
            source=str(path),
        )
    return up  # type: ignore[no-any-return]


def migration_statements(path: Path, dialect: str) -> list[str]:
    """The statements of one migration file, for ``dialect`` (a ``.py`` one's ``up``)."""
    if path.suffix == ".py":
        return [s for s in _python_up(path)(dialect) if s.strip()]
    return _statements(path.read_text())


def _check_dialect(path: Path, dialect: str) -> None:
    """Refuse an older haze's queue-tables ``.sql`` on a database of another dialect,
    saying how to convert it, instead of the database's syntax error."""
    written = dialect_specific(path)
    if written is not None and queue_dialect(written) != queue_dialect(dialect):
        raise ConfigError(f"is not for {dialect}: {convert_hint(path)}", source=str(path))


async def migrate(
    app: MigratingApp, database: str | None = None, result: MigrationResult | None = None
) -> MigrationResult:
    """Apply the app's migrations that are not recorded yet (idempotent), recording them
    in ``result`` as they go: when one raises, its ``current`` names the one that failed."""
    db = app.database(database)
    done = await _ledger(db)
    result = result if result is not None else MigrationResult([], [])
    for path in pending_migrations(app):
        if path.stem in done:
            result.skipped.append(path.name)
            continue
        result.current = path.name
        _check_dialect(path, db.dialect)
        statements = migration_statements(path, db.dialect)
        async with db.transaction() as tx:
            for stmt in statements:
                await tx.execute(stmt)
            await tx.execute(
                f"INSERT INTO {_LEDGER} (name, applied_at) VALUES (?, ?)", (path.name, time.time())
            )
        done.add(path.stem)
        result.applied.append(path.name)
    result.current = None
    result.upgraded = await upgrade_tables(db)
    await _upgrade_queue_tables(app, database or app.database_config.default, result)
    return result


async def _upgrade_queue_tables(app: MigratingApp, database: str, result: MigrationResult) -> None:
    """Apply the ``QUEUE_UPGRADES`` the queue tables on ``database`` need."""
    db = app.database(database)
    tables = {
        (options.get("table") or "jobs", options.get("failed_table") or "failed_jobs")
        for options in app.queue_config.connections.values()
        if options["driver"] == "database"
        and (options.get("connection") or app.database_config.default) == database
    }
    for jobs, failed in sorted(tables):
        sql = queue_sql(db.dialect, jobs, failed)
        for step in QUEUE_UPGRADES:
            needs = sql.get(f"needs_{step}")
            if needs is None or await db.fetchone(needs) is None:
                continue
            async with db.transaction() as tx:
                for stmt in _statements(sql[f"upgrade_{step}"]):
                    await tx.execute(stmt)
            if jobs not in result.upgraded:
                result.upgraded.append(jobs)


async def ensure_queue_tables(app: MigratingApp, connection: str | None = None) -> None:
    """Create the queue tables directly (tests, benchmarks, the example app)."""
    _, db, jobs, failed = _queue_db_connection(app, connection)
    c = app.database(db)
    for stmt in queue_schema(c.dialect, jobs, failed):
        await c.execute(stmt)
