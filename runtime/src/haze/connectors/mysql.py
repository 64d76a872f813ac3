"""MySQL 8 and MariaDB (10.6+) through aiomysql.

- One ``aiomysql`` pool per connector, created on first use and bound to the running
  event loop (a new loop gets a new pool). Connections run in autocommit mode, so a
  single statement is its own transaction; ``transaction()`` runs a block on one
  connection between ``BEGIN`` and ``COMMIT`` (``ROLLBACK`` on error). The queue's
  claim is ``SELECT … FOR UPDATE SKIP LOCKED`` plus an ``UPDATE`` in such a block.
- SQL is written with ``?`` placeholders; they become ``%s`` (and a literal ``%``
  becomes ``%%``) once per distinct statement.
- Connections use ``utf8mb4`` and the ``FOUND_ROWS`` flag, so an ``UPDATE`` reports
  the rows it matched (as PostgreSQL and SQLite do), not only the rows it changed.
- Sessions run in strict mode (``sql_mode`` ``STRICT_ALL_TABLES``, whatever the
  server's default): a value too long for its column
  is an error, never silently cut.
- Server warnings (e.g. the note of ``CREATE TABLE IF NOT EXISTS`` on an existing
  table) are not turned into Python warnings.
- MySQL has no LISTEN/NOTIFY: idle workers in other processes poll (``sleep``).
- Sessions run at ``READ COMMITTED`` (``options.init_command`` overrides it): at
  InnoDB's default ``REPEATABLE READ`` a claim's ``FOR UPDATE SKIP LOCKED`` also locks
  the gaps it scanned, and concurrent dispatches (``INSERT``) then deadlock with it.

URL: ``mysql://user:password@host:3306/dbname`` (``mariadb://`` too; query
parameters ``charset`` (``utf8mb4``, the default, only), ``unix_socket`` and
``connect_timeout``). Options:
``pool_size`` (default 10) and ``options`` (extra ``aiomysql.connect()`` keyword
arguments, plus ``pool_recycle``, default 3600 seconds).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import logging
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from haze._base.deps import require
from haze._base.errors import (
    ConfigError,
    DatabaseConnectionError,
    PayloadTooLargeError,
)
from haze._base.urls import redact_text
from haze.connectors.client_options import check_client_options, check_utf8
from haze.connectors.postgres import redact_url, translate_placeholders

__all__ = ["DatabaseConnectionError", "MySQLConnector", "is_duplicate_key"]

log = logging.getLogger("haze.connectors")

Row = tuple[Any, ...]

#: seconds to wait for a connection unless the URL sets ``connect_timeout``
CONNECT_TIMEOUT = 10

#: Every session's sql_mode, whatever the server's default: a value too long for its
#: column (or any other bad value) is an error, never a warning and a cut value.
STRICT_SQL_MODE = "STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION"

#: at most how long a failed write waits for its server thread to finish the statement
ENDED_SECONDS = 2.0

#: client error codes that mean "could not connect / log in"
_CONNECT_ERRORS = {1044, 1045, 1049, 1698, 2002, 2003, 2005, 2006, 2013, 2059}


#: server errors that mean it went away: shutdown in progress, our connection killed
_SERVER_GONE = {1053, 1927}


def _is_outage(error: BaseException) -> bool:
    """Whether an aiomysql/PyMySQL error says the server cannot be reached (2xxx are the
    client's own "cannot connect" / "lost connection" codes), not a bad statement."""
    err = importlib.import_module("pymysql.err")
    if isinstance(error, err.InterfaceError):  # the connection is closed / not connected
        return True
    if not isinstance(error, err.OperationalError):
        return False
    code = error.args[0] if error.args else None
    return isinstance(code, int) and (2000 <= code < 3000 or code in _SERVER_GONE)


def is_duplicate_key(error: BaseException) -> bool:
    """Whether a statement failed only because its unique key exists (ER_DUP_ENTRY)."""
    err = importlib.import_module("pymysql.err")
    return isinstance(error, err.IntegrityError) and bool(error.args) and error.args[0] == 1062


def _require() -> Any:
    return require("aiomysql", what="the MySQL backend", extra="mysql")


def _q(sql: str, params: Sequence[Any]) -> tuple[str, Sequence[Any] | None]:
    # Without parameters PyMySQL does no %-formatting: the SQL goes as written.
    if not params:
        return sql, None
    return translate_placeholders(sql, "mysql"), params


_cursor_class: Any = None


def _quiet_cursor() -> Any:
    """An ``aiomysql.Cursor`` that does not fetch server warnings after each statement."""
    global _cursor_class
    if _cursor_class is None:
        aiomysql = _require()

        base: Any = aiomysql.Cursor

        class QuietCursor(base):  # type: ignore[misc]
            async def _show_warnings(self, conn: Any) -> None:
                return None

        _cursor_class = QuietCursor
    return _cursor_class


def _abandon(pool: Any, loop: asyncio.AbstractEventLoop | None) -> None:
    """Let go of a pool made on another event loop, which this loop cannot await."""
    with contextlib.suppress(Exception):
        if loop is not None and loop.is_running() and not loop.is_closed():

            async def shut() -> None:  # still alive on another thread: close it there
                pool.close()
                await pool.wait_closed()

            asyncio.run_coroutine_threadsafe(shut(), loop)
        elif loop is not None and not loop.is_closed():
            pool.terminate()
        else:
            # The loop is gone: its transports close their sockets when collected;
            # keep aiomysql's finaliser from calling into the dead loop.
            for conn in [*pool._free, *pool._used]:
                conn._writer = conn._reader = None


def _size(value: object) -> int:
    if isinstance(value, str):
        return len(value) if value.isascii() else len(value.encode("utf-8"))
    return len(value) if isinstance(value, (bytes, bytearray)) else 0


class _Packet:
    """The server's ``max_allowed_packet`` of one connector. A statement over it is
    refused before it is sent: the server drops the connection mid-packet, and PyMySQL
    reports that as error 1153 or as a packet out of sequence, never the same way."""

    def __init__(self, name: str, limit: int | None = None) -> None:
        self.name = name
        self.limit = limit

    def check(self, cur: Any, sql: str, params: Sequence[Any]) -> None:
        limit = self.limit
        if limit is None or not params:
            return
        # Escaping at most doubles a value: only a statement that may be near the limit
        # is rendered to be measured.
        if len(sql) + 2 * sum(_size(p) for p in params) < limit:
            return
        size = _size(cur.mogrify(sql, params)) + 1  # the command byte
        if size > limit:
            raise PayloadTooLargeError(
                f"MySQL database connection {self.name!r}: a statement of {size} bytes is "
                f"over the server's max_allowed_packet of {limit} bytes (nothing was sent); "
                "set the queue connection's max_message_size below it, or raise "
                "max_allowed_packet on the server"
            )


class _MySession:
    """Statements on one connection (inside the transaction of ``transaction()``)."""

    def __init__(self, conn: Any, packet: _Packet):
        self._conn = conn
        self._packet = packet

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        async with self._conn.cursor() as cur:
            query, args = _q(sql, params)
            self._packet.check(cur, query, args or ())
            await cur.execute(query, args)
            return int(cur.rowcount)

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        if not rows:
            return 0
        async with self._conn.cursor() as cur:
            query = translate_placeholders(sql, "mysql")
            for row in rows:  # a multi-row INSERT is cut between rows, never inside one
                self._packet.check(cur, query, row)
            await cur.executemany(query, rows)
            return int(cur.rowcount)

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        async with self._conn.cursor() as cur:
            await cur.execute(*_q(sql, params))
            return [tuple(r) for r in await cur.fetchall()]

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> Row | None:
        async with self._conn.cursor() as cur:
            await cur.execute(*_q(sql, params))
            row = await cur.fetchone()
            return None if row is None else tuple(row)


class MySQLConnector:
    """An aiomysql pool to one MySQL / MariaDB database (see the module docstring)."""

    dialect = "mysql"

    def __init__(self, name: str, options: dict[str, Any], *, root: Path | None = None):
        aiomysql = _require()
        self.name = name
        self.url: str = options["url"]
        try:
            parts = urlsplit(self.url)
            port = parts.port or 3306
        except ValueError as e:
            raise ConfigError(
                f"bad MySQL URL {redact_url(self.url)!r}: {redact_text(str(e), self.url)}",
                key=f"connections.{name}.url",
            ) from None
        query = dict(parse_qsl(parts.query))
        self.host = parts.hostname or "localhost"
        self.port = port
        self.dbname = unquote(parts.path.lstrip("/")) or None
        self.pool_size = max(1, int(options.get("pool_size") or 10))
        kwargs: dict[str, Any] = {
            "host": self.host,
            "port": port,
            "user": unquote(parts.username) if parts.username else None,
            "password": unquote(parts.password) if parts.password else "",
            "db": self.dbname,
            "charset": query.get("charset", "utf8mb4"),
            "connect_timeout": float(query.get("connect_timeout", CONNECT_TIMEOUT)),
            "autocommit": True,
            "init_command": "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
            # aiomysql runs SET sql_mode=<this> as written: quote it here.
            "sql_mode": f"'{STRICT_SQL_MODE}'",
        }
        if "unix_socket" in query:
            kwargs["unix_socket"] = query["unix_socket"]
        extra = dict(options.get("options") or {})
        self.pool_recycle = int(extra.pop("pool_recycle", 3600))
        check_client_options(
            extra,
            inspect.signature(aiomysql.connect).parameters,
            key=f"connections.{name}.options",
            client="aiomysql",
        )
        kwargs.update(extra)
        check_utf8(
            kwargs["charset"], ("UTF8MB4",), setting="charset", connection=name, client="MySQL"
        )
        # the check takes utf8mb4 in any spelling (utf-8mb4); aiomysql knows only this one
        kwargs["charset"] = "utf8mb4"
        # use_unicode=False read every text column back as bytes
        check_utf8(
            kwargs.get("use_unicode"),
            ("TRUE",),
            setting="use_unicode",
            connection=name,
            client="MySQL",
        )
        self._kwargs = kwargs
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pool: Any = None
        self._open_lock: asyncio.Lock | None = None
        #: the server's max_allowed_packet, read when the pool opens
        self._packet = _Packet(name)

    def __repr__(self) -> str:
        return f"<MySQLConnector {self.name!r} {redact_url(self.url)}>"

    # -- connections ------------------------------------------------------------------

    def _connect_error(self, error: BaseException) -> DatabaseConnectionError:
        args: tuple[Any, ...] = error.args
        reason = str(args[1]) if len(args) >= 2 else (str(error) or type(error).__name__)
        return DatabaseConnectionError(
            f"cannot connect to MySQL for database connection {self.name!r} "
            f"({redact_url(self.url)}): {reason}. Check that the server is running and "
            f"reachable at {self.host}:{self.port}, that database {self.dbname!r} exists, "
            f"and the user and password in the URL (config/database.py, "
            f"connections.{self.name}.url)"
        )

    @contextmanager
    def _outages(self) -> Iterator[None]:
        """Statements inside raise ``DatabaseConnectionError`` when the server is gone."""
        try:
            yield
        except DatabaseConnectionError:
            raise
        except Exception as e:
            if not (_is_outage(e) or isinstance(e, OSError)):
                raise
            args: tuple[Any, ...] = e.args
            reason = str(args[1]) if len(args) >= 2 else (str(e) or type(e).__name__)
            raise DatabaseConnectionError(
                f"MySQL database connection {self.name!r} ({redact_url(self.url)}) is "
                f"unavailable ({type(e).__name__}: {reason.strip().splitlines()[0]}); check "
                f"that the server at {self.host}:{self.port} is running and reachable"
            ) from None

    async def _get_pool(self) -> Any:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            # a pool made on another loop cannot be used here: start again
            if self._pool is not None:
                _abandon(self._pool, self._loop)
            self._loop = loop
            self._pool = None
            self._open_lock = asyncio.Lock()
        pool = self._pool
        if pool is not None:
            return pool
        assert self._open_lock is not None
        async with self._open_lock:
            if self._pool is None:
                self._pool = await self._open_pool()
            return self._pool

    async def _open_pool(self) -> Any:
        aiomysql = _require()
        found_rows = int(importlib.import_module("pymysql.constants.CLIENT").FOUND_ROWS)

        kwargs = dict(self._kwargs)
        kwargs["client_flag"] = int(kwargs.get("client_flag") or 0) | found_rows
        kwargs.setdefault("cursorclass", _quiet_cursor())
        try:
            pool = await aiomysql.create_pool(
                minsize=1, maxsize=self.pool_size, pool_recycle=self.pool_recycle, **kwargs
            )
            try:
                async with pool.acquire() as conn, conn.cursor() as cur:
                    await cur.execute("SELECT @@max_allowed_packet")
                    row = await cur.fetchone()
            except BaseException:
                pool.close()
                raise
            self._packet.limit = int(row[0]) if row and row[0] else None
            return pool
        except aiomysql.OperationalError as e:
            if e.args and e.args[0] in _CONNECT_ERRORS:
                raise self._connect_error(e) from None
            raise
        except (TimeoutError, OSError) as e:
            raise self._connect_error(e) from None

    # -- statements -------------------------------------------------------------------

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        thread = None
        try:
            pool = await self._get_pool()
            with self._outages():
                async with pool.acquire() as conn:
                    thread = conn.server_thread_id[0]
                    return await _MySession(conn, self._packet).execute(sql, params)
        except DatabaseConnectionError as e:
            # What the statement wrote decides what a dispatch may do next: nothing when
            # no connection was had; unknown while the server thread still runs it.
            if thread is None:
                raise DatabaseConnectionError(str(e), write="unsent") from None
            if not await self._ended(thread):
                raise DatabaseConnectionError(str(e), write="unsettled") from None
            raise

    async def _ended(self, thread: int) -> bool:
        """Wait (a little) until server thread ``thread`` runs no statement; False when
        that was not seen. ``KILL`` shuts a connection's socket at once, but the
        statement it was running goes on to its commit: the caller is about to look for
        what that statement wrote."""
        loop = asyncio.get_running_loop()
        end = loop.time() + ENDED_SECONDS
        while loop.time() < end:
            try:
                row = await self.fetchone(
                    "SELECT COUNT(*) FROM information_schema.processlist "
                    "WHERE id = ? AND command <> 'Sleep'",
                    (thread,),
                )
            except Exception:
                row = None
            if row is not None and not row[0]:
                return True
            await asyncio.sleep(0.01)
        return False

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        pool = await self._get_pool()
        with self._outages():
            async with pool.acquire() as conn:
                return await _MySession(conn, self._packet).executemany(sql, rows)

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        pool = await self._get_pool()
        with self._outages():
            async with pool.acquire() as conn:
                return await _MySession(conn, self._packet).fetchall(sql, params)

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> Row | None:
        pool = await self._get_pool()
        with self._outages():
            async with pool.acquire() as conn:
                return await _MySession(conn, self._packet).fetchone(sql, params)

    @asynccontextmanager
    async def transaction(self, *, immediate: bool = False) -> AsyncIterator[_MySession]:
        """``BEGIN`` … ``COMMIT`` on one pooled connection (``immediate`` is for SQLite)."""
        pool = await self._get_pool()
        with self._outages():
            async with pool.acquire() as conn:
                await conn.begin()
                try:
                    yield _MySession(conn, self._packet)
                except BaseException:
                    try:
                        await conn.rollback()
                    except Exception:
                        conn.close()  # unusable: the pool drops it
                    raise
                await conn.commit()

    # -- lifecycle --------------------------------------------------------------------

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        loop, self._loop = self._loop, None
        if pool is None:
            return
        try:
            same_loop = asyncio.get_running_loop() is loop
        except RuntimeError:  # pragma: no cover - close() is awaited
            same_loop = False
        if not same_loop:
            _abandon(pool, loop)
            return
        pool.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(pool.wait_closed(), 5)
