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

import importlib
from collections.abc import Iterator, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, TypeVar, runtime_checkable

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
    "missing_table",
    "mysql_error_code",
    "register_connector",
    "statement_chunks",
]

#: The entry point group of third-party database backends, named by dialect.
GROUP = plugins.CONNECTORS

Row = tuple[Any, ...]
_T = TypeVar("_T")


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


def missing_table(e: BaseException, dialect: str) -> bool:
    """Whether ``e`` is the ``dialect`` backend's "no such table": PostgreSQL's
    ``UndefinedTable`` (SQLSTATE 42P01), MySQL/MariaDB's error 1146, and the text SQLite,
    libSQL and D1 answer with."""
    if dialect == "postgres":
        from psycopg import errors  # its connector imported psycopg already

        return isinstance(e, errors.UndefinedTable)
    if dialect == "mysql":
        return mysql_error_code(e) == 1146
    return "no such table" in str(e)


def missing_column(e: BaseException, dialect: str) -> bool:
    """Whether ``e`` is the ``dialect`` backend's "no such column" (a table of the
    queue's name that haze did not create): PostgreSQL's ``UndefinedColumn`` (SQLSTATE
    42703), MySQL/MariaDB's error 1054, and the texts of SQLite, libSQL and D1."""
    if dialect == "postgres":
        from psycopg import errors

        return isinstance(e, errors.UndefinedColumn)
    if dialect == "mysql":
        return mysql_error_code(e) == 1054
    text = str(e)
    return "no such column" in text or "has no column named" in text


def statement_chunks(
    items: Sequence[_T],
    dialect: str,
    *,
    d1: int,
    other: int,
    postgres: int | None = None,
    mysql: int | None = None,
) -> Iterator[Sequence[_T]]:
    """``items`` in slices one statement can bind on ``dialect``: ``d1`` at a time on D1
    (it binds at most 100 values a statement), ``postgres`` or ``mysql`` on those servers
    when given, ``other`` everywhere else."""
    per = {"d1": d1, "postgres": postgres, "mysql": mysql}.get(dialect) or other
    for i in range(0, len(items), per):
        yield items[i : i + per]


def mysql_error_code(e: BaseException) -> int | None:
    """The MySQL/MariaDB error number of a PyMySQL (aiomysql) error, else None: an
    error of anything else is not the server's, whatever its ``args`` hold."""
    # importlib: PyMySQL ships no type hints; the MySQL connector imported it already
    err = importlib.import_module("pymysql.err")
    if isinstance(e, err.MySQLError) and e.args and isinstance(e.args[0], int):
        return int(e.args[0])
    return None


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
