"""PostgreSQL through psycopg 3 (async) and ``psycopg_pool``.

- One ``AsyncConnectionPool`` per connector, opened on first use and bound to the
  running event loop (a new loop gets a new pool). Connections are in autocommit
  mode, so a single statement is its own transaction; ``transaction()`` runs a block
  on one pooled connection inside ``BEGIN``/``COMMIT`` (``ROLLBACK`` on error).
- A single statement (``execute``, ``fetchone``, ``fetchall``) runs on one pooled
  connection kept checked out ("parked") while it is free, instead of a checkout and
  return per statement; busy or not idle afterwards, statements use the pool as before.
  A pool of one parks nothing, and the parked connection goes back to the pool every
  ``PARK_SECONDS`` so its lifetime rules still apply.
- ``execute()`` with parameters that are all ``str``, ``int``, ``float`` or ``None`` (a
  dispatch's ``INSERT``) skips psycopg's async cursor and goes through the connection's
  libpq object (``postgres_lean``), with the same results and exceptions.
- SQL is written with ``?`` placeholders; they become ``%s`` (and a literal ``%``
  becomes ``%%``) once per distinct statement.
- LISTEN/NOTIFY, so an idle worker in another process wakes as soon as a job is
  dispatched: ``notify()`` queues a ``pg_notify`` that a background task sends right
  after the INSERT (coalesced, never blocking the producer); ``listen()`` waits on one
  dedicated LISTEN connection per connector, kept open and reconnected with backoff.
  Without it (server unreachable, pooler in transaction mode) ``listen()`` simply
  sleeps and the driver's polling takes over. ``watch()`` hands each payload of a
  channel to a callback on the same connection (the database store's ``Queue.wait``
  notifications).

URL: ``postgresql://user:password@host:5432/dbname`` (``postgres://`` too; any libpq
URI parameter such as ``?sslmode=require`` works). Options: ``pool_size`` (default 10)
and ``options`` (extra ``psycopg.AsyncConnection.connect()`` keyword arguments).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from haze._base.deps import require
from haze._base.errors import (
    ConfigError,
    DatabaseConnectionError,
)
from haze._base.urls import redact_text, redact_url
from haze.connectors import client_options as opts
from haze.connectors.postgres_lean import LeanStatements
from haze.connectors.postgres_listen import _gone, _is_outage, _Listener, failed_write

if TYPE_CHECKING:
    from psycopg import AsyncConnection, AsyncCursor
    from psycopg_pool import AsyncConnectionPool

__all__ = ["DatabaseConnectionError", "PostgresConnector", "redact_url", "translate_placeholders"]

log = logging.getLogger("haze.connectors")

Row = tuple[Any, ...]

#: seconds libpq waits for a connection unless the URL sets ``connect_timeout``
CONNECT_TIMEOUT = 10
#: what ``AsyncConnection.connect()`` takes besides libpq's connection parameters
_CONNECT_ARGS = ("autocommit", "prepare_threshold", "context", "row_factory", "cursor_factory")


#: seconds a connection stays parked for single statements before it goes back to the
#: pool once (which then applies its max_lifetime and health rules to it)
PARK_SECONDS = 60.0

_ROWCOUNT, _ONE, _ALL = 0, 1, 2
#: admin_shutdown: pg_terminate_backend() ended the session (the server is up)
_TERMINATED = "57P01"
_IDLE = 0  # psycopg.pq.TransactionStatus.IDLE: no transaction open, no statement running
_running_loop = asyncio.get_running_loop


def _quiet_pool_log() -> None:
    # psycopg's pool logs every failed reconnect and dropped connection: about twenty
    # warnings in a five-second outage. The worker reports an outage once ("unavailable",
    # then "reachable again"), so haze lowers that logger to errors unless the app set
    # its level itself (set it to see the pool's own account).
    pool_log = logging.getLogger("psycopg.pool")
    if pool_log.level == logging.NOTSET:
        pool_log.setLevel(logging.ERROR)


# --------------------------------------------------------------------------- helpers

# Quoted strings, quoted identifiers and comments are copied (with % doubled); a bare
# ? becomes %s and a bare % becomes %%.
_TOKENS = {
    "postgres": re.compile(r"'[^']*'|\"[^\"]*\"|--[^\n]*|/\*.*?\*/|[?%]", re.S),
    "mysql": re.compile(
        r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|`[^`]*`|(?:--(?=\s)|#)[^\n]*|/\*.*?\*/|[?%]",
        re.S,
    ),
}


def _swap(m: re.Match[str]) -> str:
    token = m.group(0)
    if token == "?":
        return "%s"
    return token.replace("%", "%%")


@lru_cache(maxsize=1024)
def translate_placeholders(sql: str, dialect: str = "postgres") -> str:
    """``?`` → ``%s`` outside quotes and comments, ``%`` → ``%%`` (pyformat drivers)."""
    return _TOKENS[dialect].sub(_swap, sql)


def _q(sql: str, params: Sequence[Any]) -> tuple[str, Sequence[Any] | None]:
    # Without parameters psycopg does no %-parsing: the SQL goes as written.
    if not params:
        return sql, None
    return translate_placeholders(sql, "postgres"), params


# --------------------------------------------------------------------------- sessions


class _PgSession:
    """Statements on one connection (inside the transaction of ``transaction()``)."""

    def __init__(self, conn: AsyncConnection[Any]):
        self._conn = conn

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        cur = await self._conn.execute(*_q(sql, params))
        return cur.rowcount

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        if not rows:
            return 0
        async with self._conn.cursor() as cur:
            await cur.executemany(translate_placeholders(sql, "postgres"), rows)
            return cur.rowcount

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        cur = await self._conn.execute(*_q(sql, params))
        return [tuple(r) for r in await cur.fetchall()]

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> Row | None:
        cur = await self._conn.execute(*_q(sql, params))
        row = await cur.fetchone()
        return None if row is None else tuple(row)


# --------------------------------------------------------------------------- connector


class PostgresConnector:
    """A psycopg pool to one PostgreSQL database (see the module docstring)."""

    dialect = "postgres"

    def __init__(self, name: str, options: dict[str, Any], *, root: Path | None = None):
        for module in ("psycopg", "psycopg_pool"):
            require(module, what="the PostgreSQL backend", extra="postgres")
        from psycopg.conninfo import conninfo_to_dict
        from psycopg.pq import Conninfo

        self.name = name
        self.url: str = options["url"]
        scheme, _, rest = self.url.partition(":")
        # postgres:// and postgresql+psycopg:// (SQLAlchemy style) → postgresql://
        if scheme.split("+", 1)[0].lower() in ("postgresql", "postgres"):
            self.conninfo = "postgresql:" + rest
        else:
            self.conninfo = self.url
        try:
            params = conninfo_to_dict(self.conninfo)
        except Exception as e:
            raise ConfigError(
                f"bad PostgreSQL URL {redact_url(self.url)!r}: {redact_text(str(e), self.url)}",
                key=f"connections.{name}.url",
            ) from None
        self.host = str(params.get("host") or "localhost")
        self.port = str(params.get("port") or 5432)
        self.dbname = str(params.get("dbname") or params.get("user") or "")
        self.pool_size = max(1, int(options.get("pool_size") or 10))
        self._kwargs: dict[str, Any] = {"autocommit": True}
        if "connect_timeout" not in params:
            self._kwargs["connect_timeout"] = CONNECT_TIMEOUT
        extra = options.get("options") or {}
        opts.check_client_options(
            extra,
            [*_CONNECT_ARGS, *(o.keyword.decode() for o in Conninfo.get_defaults())],
            key=f"connections.{name}.options",
            client="psycopg",
        )
        self._kwargs.update(extra)
        opts.check_utf8(
            self._kwargs.get("client_encoding") or params.get("client_encoding"),
            ("UTF8", "UNICODE"),
            setting="client_encoding",
            connection=name,
            client="PostgreSQL",
        )
        self._kwargs["client_encoding"] = "UTF8"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pool: AsyncConnectionPool[AsyncConnection[Any]] | None = None
        #: one pooled connection kept checked out for single statements, with the cursor
        #: they reuse (see _one)
        self._parked: tuple[AsyncConnection[Any], AsyncCursor[Any]] | None = None
        self._parked_until = 0.0
        self._open_lock: asyncio.Lock | None = None
        self._lean = LeanStatements()
        self._listener: _Listener | None = None
        self._pending: set[tuple[str, str]] = set()
        self._notify_task: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"<PostgresConnector {self.name!r} {redact_url(self.url)}>"

    # -- connections ------------------------------------------------------------------

    def _bind(self) -> asyncio.AbstractEventLoop:
        """The running loop; state made on another loop is dropped (it cannot be used)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._abandon()
            self._loop = loop
            self._pool = self._parked = None
            self._listener = None
            self._notify_task = None
            self._open_lock = asyncio.Lock()
        return loop

    def _abandon(self) -> None:
        """Let go of what was made on another event loop (this loop cannot await it).

        Pooled connections close their sockets when collected; the LISTEN connection
        and the parked one are closed here, synchronously.
        """
        parked, self._parked = self._parked, None
        if parked is not None:
            with contextlib.suppress(Exception):
                parked[0].pgconn.finish()
        listener = self._listener
        conn = listener._conn if listener is not None else None
        if listener is not None:
            listener._closed = True
            listener._conn = None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.pgconn.finish()

    def _unavailable(self, error: BaseException) -> DatabaseConnectionError:
        text = str(error).strip()
        reason = text.splitlines()[0] if text else type(error).__name__
        return DatabaseConnectionError(
            f"PostgreSQL database connection {self.name!r} ({redact_url(self.url)}) is "
            f"unavailable ({type(error).__name__}: {reason}); check that the server at "
            f"{self.host}:{self.port} is running and reachable"
        )

    @contextmanager
    def _outages(self) -> Iterator[None]:
        """Statements inside raise ``DatabaseConnectionError`` when the server is gone."""
        try:
            yield
        except Exception as e:
            down = self._outage_of(e)
            if down is None:
                raise
            raise down from None

    def _outage_of(self, error: Exception) -> DatabaseConnectionError | None:
        """The one-line error for ``error`` when it means the server is gone, else None
        (re-raise it as it is; an already translated one included)."""
        if isinstance(error, DatabaseConnectionError) or not _is_outage(error):
            return None
        return self._unavailable(error)

    def _connect_error(self, error: BaseException) -> DatabaseConnectionError:
        reason = opts.connect_refusal(error, self.dbname, self.name)
        # libpq may cut a password with an unescaped '/' into the host and database
        where = redact_text(
            f"{reason}. Check that the server is running and reachable at "
            f"{self.host}:{self.port}, that database {self.dbname!r} exists",
            self.url,
        )
        return DatabaseConnectionError(
            f"cannot connect to PostgreSQL for database connection {self.name!r} "
            f"({redact_url(self.url)}): {where}, and the user and password in the URL "
            f"(config/database.py, connections.{self.name}.url)"
        )

    async def _connect(self, *, listen: bool = False) -> AsyncConnection[Any]:
        """One new autocommit connection; failures name the connection and URL."""
        import psycopg

        kwargs = dict(self._kwargs)
        if listen:  # find out about a silently dropped LISTEN connection
            kwargs.setdefault("keepalives", 1)
            kwargs.setdefault("keepalives_idle", 30)
            kwargs.setdefault("keepalives_interval", 10)
            kwargs.setdefault("keepalives_count", 3)
        try:
            return await psycopg.AsyncConnection.connect(self.conninfo, **kwargs)
        except psycopg.OperationalError as e:
            raise self._connect_error(e) from None

    async def _get_pool(self) -> AsyncConnectionPool[AsyncConnection[Any]]:
        if self._loop is not asyncio.get_running_loop():
            self._bind()
        pool = self._pool
        if pool is not None:
            return pool
        assert self._open_lock is not None
        async with self._open_lock:
            if self._pool is None:
                self._pool = await self._open_pool()
            return self._pool

    async def _open_pool(self) -> AsyncConnectionPool[AsyncConnection[Any]]:
        from psycopg_pool import AsyncConnectionPool, PoolTimeout

        _quiet_pool_log()
        # A plain connection first: it fails fast and says why (the pool would retry
        # in the background and only report a timeout).
        probe = await self._connect()
        encoding = probe.info.parameter_status("server_encoding")
        await probe.close()
        opts.check_server_encoding(encoding, self.dbname, self.name)
        pool: AsyncConnectionPool[AsyncConnection[Any]] = AsyncConnectionPool(
            self.conninfo,
            kwargs=self._kwargs,
            min_size=1,
            max_size=self.pool_size,
            open=False,
            name=f"haze-{self.name}",
        )
        try:
            await pool.open(wait=True, timeout=float(self._kwargs.get("connect_timeout") or 30))
        except PoolTimeout as e:
            await pool.close()
            raise self._connect_error(e) from None
        return pool

    # -- statements -------------------------------------------------------------------

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        result: int = await self._one(sql, params, _ROWCOUNT)
        return result

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        async with self._session() as session:
            return await session.executemany(sql, rows)

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        rows: list[Row] = await self._one(sql, params, _ALL)
        return rows

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> Row | None:
        row: Row | None = await self._one(sql, params, _ONE)
        return row

    async def _one(self, sql: str, params: Sequence[Any], want: int) -> Any:
        """One autocommit statement, on the parked connection and cursor when free.

        A pool checkout and return (psycopg_pool's lock, stats, logging and reset checks,
        a dozen coroutines) and a new cursor were about 90 of the 330 Python calls of a
        single dispatch on PostgreSQL (cProfile)."""
        pid = None
        try:
            parked, pool = self._parked, self._pool
            if parked is not None and pool is not None and self._loop is _running_loop():
                self._parked = None
                conn, cur = parked
                if _gone(conn):
                    await self._discard(pool, conn)
                    conn = await self._getconn(pool)
                    cur = conn.cursor()
            else:
                pool = await self._get_pool()
                conn = await self._getconn(pool)
                cur = conn.cursor()
            pid = conn.pgconn.backend_pid
            try:
                if want == _ROWCOUNT and params:
                    n = await self._lean.execute(conn, sql, params)
                    if n is not None:
                        return n
                await cur.execute(*_q(sql, params))
                if want == _ROWCOUNT:
                    return cur.rowcount
                if want == _ONE:
                    row = await cur.fetchone()
                    return None if row is None else tuple(row)
                return [tuple(r) for r in await cur.fetchall()]
            finally:
                if not self._park(conn, cur, pool):
                    await pool.putconn(conn)
        except Exception as e:  # _outages() inline: no generator per statement
            down = self._outage_of(e)
            if want == _ROWCOUNT:
                down = await failed_write(self, e, down, pid)
            if down is None:
                raise
            raise down from None

    async def _getconn(
        self, pool: AsyncConnectionPool[AsyncConnection[Any]]
    ) -> AsyncConnection[Any]:
        """A pooled connection the server has not closed: each dead one found is closed
        and handed back (the pool replaces it), so a server restart costs no statement."""
        for _ in range(self.pool_size):
            conn = await pool.getconn()
            if not _gone(conn):
                return conn
            await self._discard(pool, conn)
        return await pool.getconn()

    async def _discard(
        self, pool: AsyncConnectionPool[AsyncConnection[Any]], conn: AsyncConnection[Any]
    ) -> None:
        """Close a connection the server closed and hand it back (the pool replaces it).
        Then one connection of our own says whether the server answers: a pool without a
        live connection would wait its whole timeout for one, where a server that is down
        must fail the statement at once."""
        import psycopg

        await conn.close()
        await pool.putconn(conn)
        try:
            probe = await psycopg.AsyncConnection.connect(self.conninfo, **self._kwargs)
        except psycopg.OperationalError as e:
            if e.sqlstate == _TERMINATED:
                return  # the server answered, and someone ended this very session
            raise self._unavailable(e) from None
        await probe.close()

    def _park(
        self, conn: AsyncConnection[Any], cur: AsyncCursor[Any], pool: AsyncConnectionPool[Any]
    ) -> bool:
        """Keep ``conn`` out of ``pool`` for the next single statement, if it may be.

        Not when another statement parked one meanwhile, when the pool would have no
        other connection left for ``transaction()``, when ``conn`` is not idle (a
        cancelled or broken statement: the pool checks and replaces it), or once the
        parking has lasted ``PARK_SECONDS`` (the pool's max_lifetime applies again)."""
        loop = self._loop
        if (
            self._parked is not None
            or pool is not self._pool
            or self.pool_size < 2
            or loop is None
            or conn.pgconn.transaction_status != _IDLE
        ):
            return False
        now = loop.time()
        if not self._parked_until:
            self._parked_until = now + PARK_SECONDS
        elif now > self._parked_until:
            self._parked_until = 0.0
            return False
        self._parked = (conn, cur)
        return True

    @asynccontextmanager
    async def transaction(self, *, immediate: bool = False) -> AsyncIterator[_PgSession]:
        """``BEGIN`` … ``COMMIT`` on one pooled connection (``immediate`` is for SQLite)."""
        async with self._session() as session, session._conn.transaction():
            yield session

    @asynccontextmanager
    async def _session(self) -> AsyncIterator[_PgSession]:
        """One pooled connection the server has not closed, handed back afterwards."""
        pool = await self._get_pool()
        with self._outages():
            conn = await self._getconn(pool)
            try:
                yield _PgSession(conn)
            finally:
                await pool.putconn(conn)

    async def vacuum(self, table: str) -> bool:
        """``VACUUM table`` on a connection of its own, unless another process holds the
        table's advisory lock (it is vacuuming it). Closing that connection ends its
        session, so the lock never outlives the call, even when it is cancelled."""
        conn = await self._connect()
        try:
            with self._outages():
                cur = await conn.execute(
                    "SELECT pg_try_advisory_lock(hashtext(%s))", (f"haze_vacuum:{table}",)
                )
                row = await cur.fetchone()
                if not row or not row[0]:
                    return False
                await conn.execute(f'VACUUM "{table}"')
                return True
        finally:
            await conn.close()

    # -- LISTEN/NOTIFY ----------------------------------------------------------------

    def notify(self, channel: str, payload: str = "") -> None:
        """Send ``NOTIFY channel, payload`` soon, without blocking the caller.

        Called right after a committed INSERT: one background task sends what is
        pending (a burst of dispatches costs one ``pg_notify`` round trip); errors
        are logged, and idle workers still find the job by polling.
        """
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if self._loop is not loop:
            self._bind()
        self._pending.add((channel, payload))
        task = self._notify_task
        if task is None or task.done():
            self._notify_task = loop.create_task(
                self._send_notifies(), name=f"haze-pg-notify-{self.name}"
            )

    async def _send_notifies(self) -> None:
        while self._pending:
            batch = sorted(self._pending)
            self._pending.clear()
            sql = "SELECT " + ", ".join(["pg_notify(%s, %s)"] * len(batch))
            try:
                pool = await self._get_pool()
                async with pool.connection() as conn:
                    await conn.execute(sql, [p for pair in batch for p in pair])
            except Exception as e:
                # During an outage the worker has said so once already.
                outage = isinstance(e, DatabaseConnectionError) or _is_outage(e)
                (log.debug if outage else log.warning)(
                    "haze: NOTIFY on database %r failed (%s); idle workers will "
                    "find the job when they next poll",
                    self.name,
                    e,
                )

    async def listen(self, channel: str, timeout: float) -> None:
        """Return when ``NOTIFY channel`` arrives, or after ``timeout`` seconds."""
        if self._loop is not asyncio.get_running_loop():
            self._bind()
        if self._listener is None:
            self._listener = _Listener(self)
        await self._listener.wait(channel, timeout)

    async def watch(self, channel: str, callback: Callable[[str], None]) -> bool:
        """Call ``callback(payload)`` for each ``NOTIFY channel`` until ``unwatch``.

        True once the LISTEN is in place (a NOTIFY sent from now on arrives); False when
        the LISTEN connection is down (the callback is kept, and called with "" when a
        lost connection may have dropped a notification)."""
        if self._loop is not asyncio.get_running_loop():
            self._bind()
        if self._listener is None:
            self._listener = _Listener(self)
        self._listener._watchers.setdefault(channel, set()).add(callback)
        return await self._listener._ensure(channel)

    def unwatch(self, channel: str, callback: Callable[[str], None]) -> None:
        """Stop calling ``callback`` (the LISTEN stays: other waiters come and go)."""
        listener = self._listener
        if listener is None:
            return
        watchers = listener._watchers.get(channel)
        if watchers is not None:
            watchers.discard(callback)
            if not watchers:
                del listener._watchers[channel]

    # -- lifecycle --------------------------------------------------------------------

    async def close(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # pragma: no cover - close() is awaited
            loop = None
        if self._loop is not loop:
            self._abandon()
            self._loop = None
            self._pool = self._listener = self._notify_task = None
            self._pending.clear()
            return
        task, self._notify_task = self._notify_task, None
        if task is not None and not task.done():
            done, _ = await asyncio.wait({task}, timeout=5)
            if not done:
                task.cancel()
        listener, self._listener = self._listener, None
        if listener is not None:
            await listener.close()
        pool, self._pool = self._pool, None
        parked, self._parked = self._parked, None
        if pool is not None:
            if parked is not None:
                await pool.putconn(parked[0])
            await pool.close(timeout=5)
