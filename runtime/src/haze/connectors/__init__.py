"""SQL connections from ``config/database.py``: one small ``Connector`` protocol per backend.

The database queue driver, the database store, migrations and the ``Db`` facade all
talk to a ``Connector``. Each backend lives in its own module and imports its client
lazily, so a missing client names the extra to install:

======================  ===================  =====================
URL                     module               client (extra)
======================  ===================  =====================
``sqlite:///path``      ``sqlite``           stdlib ``sqlite3``
``postgresql://…``      ``postgres``         psycopg (``haze-jobs[postgres]``)
``mysql://…``           ``mysql``            aiomysql (``haze-jobs[mysql]``)
``libsql://``/https     ``libsql``           httpx (``haze-jobs[libsql]``)
``d1://ACCOUNT/DB``     ``d1``               httpx (``haze-jobs[cloudflare]``)
======================  ===================  =====================

SQL is written with ``?`` placeholders; connectors translate them for their driver.

Another URL scheme is a plugin (``haze._base.plugins``): a connector class registered
with ``register_connector``, or an installed distribution's entry point in the
``haze.connectors`` group, named by the URL's scheme (its dialect). A connector class is
called ``cls(connection_name, options, root=app_root)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, runtime_checkable

from haze._base import plugins
from haze._base.urls import redact_url

__all__ = [
    "GROUP",
    "REGISTRY",
    "Connector",
    "Notifying",
    "Session",
    "connect",
    "connector_class",
    "dialect_of",
    "missing_column",
    "register_connector",
]

#: The entry point group of third-party database backends, named by dialect.
GROUP = plugins.CONNECTORS

Row = tuple[Any, ...]


@runtime_checkable
class Session(Protocol):
    """Statements on one connection (inside a transaction when from ``transaction()``)."""

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement; returns the affected row count."""

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> int: ...

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Row]: ...

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> Row | None: ...


@runtime_checkable
class Connector(Session, Protocol):
    """A connection (or pool) to one database."""

    #: "sqlite", "postgres", "mysql", "libsql" or "d1": picks the SQL dialect files.
    dialect: str
    name: str

    def transaction(self, *, immediate: bool = False) -> AbstractAsyncContextManager[Session]:
        """A transaction; ``immediate`` takes the write lock up front (SQLite)."""

    async def close(self) -> None: ...


@runtime_checkable
class Notifying(Protocol):
    """A connector whose database can wake idle workers in other processes at once
    (PostgreSQL's LISTEN/NOTIFY); without it, workers poll."""

    def notify(self, channel: str, payload: str = "") -> None:
        """Send ``payload`` on ``channel`` (fire and forget)."""

    async def listen(self, channel: str, timeout: float) -> None:
        """Return on the next notification on ``channel``, or after ``timeout`` seconds."""


@runtime_checkable
class Vacuuming(Protocol):
    """A connector that can ``VACUUM`` a table outside any transaction, one process at a
    time (PostgreSQL): the database driver's own upkeep when autovacuum is off."""

    async def vacuum(self, table: str) -> bool:
        """``VACUUM table`` unless another process is vacuuming it through haze; True
        when this call ran it."""


REGISTRY = plugins.Registry(
    GROUP,
    {
        "sqlite": ("haze.connectors.sqlite", "SQLiteConnector"),
        "postgres": ("haze.connectors.postgres", "PostgresConnector"),
        "mysql": ("haze.connectors.mysql", "MySQLConnector"),
        "libsql": ("haze.connectors.libsql", "LibSQLConnector"),
        "d1": ("haze.connectors.d1", "D1Connector"),
    },
    taken="{name!r} is a built-in database backend",
    what="the {name} backend",
    unknown="unsupported database URL {subject!r} (built in: sqlite, postgresql, mysql, "
    "libsql, d1); a package adds a scheme through the {group!r} entry point group",
)


def missing_column(e: BaseException) -> bool:
    """The backend's "no such column": a table of the queue's name that haze did not
    create. PostgreSQL's SQLSTATE 42703, MySQL/MariaDB's error 1054, and the texts of
    SQLite, libSQL and D1."""
    if getattr(e, "sqlstate", None) == "42703":
        return True
    args = getattr(e, "args", ())
    if args and args[0] == 1054:
        return True
    text = str(e)
    return "no such column" in text or "has no column named" in text


def dialect_of(url: str) -> str:
    scheme = url.split(":", 1)[0].split("+", 1)[0].lower()
    return {
        "sqlite": "sqlite",
        "postgresql": "postgres",
        "postgres": "postgres",
        "mysql": "mysql",
        "mariadb": "mysql",
        "libsql": "libsql",
        "https": "libsql",
        "http": "libsql",
        "d1": "d1",
    }.get(scheme, scheme)


def register_connector(dialect: str, target: object) -> None:
    """Make URLs of the scheme ``dialect`` use ``target``: a connector class, or
    ``"module:Class"`` (imported on first use). A built-in dialect is not taken over."""
    REGISTRY.register(dialect, target)


def connector_class(url: str, *, source: str = "", key: str = "url") -> Any:
    """The connector class for ``url``'s dialect (built in, then plugins)."""
    return REGISTRY.load(dialect_of(url), source=source, key=key, subject=redact_url(url))


def connect(name: str, options: dict[str, Any], *, root: Any = None, source: str = "") -> Connector:
    """A connector for one ``config/database.py`` connection (does not connect yet)."""
    cls = connector_class(options["url"], source=source, key=f"connections.{name}.url")
    connector: Connector = cls(name, options, root=root)
    return connector
