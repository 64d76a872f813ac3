"""SQLite through the stdlib ``sqlite3``: the embedded default database.

One connection per connector, used from one dedicated thread so the event loop never
blocks on disk. WAL lets readers and one writer work at once, ``busy_timeout`` makes
a second process wait for the write lock instead of failing, and
``transaction(immediate=True)`` opens with ``BEGIN IMMEDIATE`` so a claim takes the
write lock before it reads. Several worker processes can share one file.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

from haze._base.errors import ConfigError, DatabaseConnectionError

__all__ = ["SQLiteConnector"]

T = TypeVar("T")
Row = tuple[Any, ...]

#: primary result codes of a lock that outlasted busy_timeout
_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_READONLY, _SQLITE_CANTOPEN = 5, 6, 8, 14


def sqlite_path(url: str, root: Path | None) -> str:
    """``sqlite:///relative/path`` (from the app root) or ``sqlite:////absolute/path``."""
    rest = url.split(":", 1)[1]
    if not rest.startswith("//"):
        raise ValueError(f"bad sqlite URL {url!r}: use sqlite:///relative or sqlite:////absolute")
    path = rest[2:]  # drop the empty host: "//" + "/path"
    if path.startswith("//"):
        path = path[1:]  # sqlite:////abs/app.db → /abs/app.db
    elif path.startswith("/"):
        path = path[1:]  # sqlite:///storage/app.db → storage/app.db (from the root)
    if path in ("", ":memory:"):
        return ":memory:"
    p = Path(path)
    if not p.is_absolute():
        p = (root or Path.cwd()) / p
    return str(p)


class _Sync:
    """Blocking statements on the sqlite3 connection (run on the connector's thread)."""

    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn

    def execute(self, sql: str, params: Sequence[Any]) -> int:
        return self.conn.execute(sql, params).rowcount

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        return self.conn.executemany(sql, rows).rowcount

    def fetchall(self, sql: str, params: Sequence[Any]) -> list[Row]:
        return self.conn.execute(sql, params).fetchall()

    def fetchone(self, sql: str, params: Sequence[Any]) -> Row | None:
        row: Row | None = self.conn.execute(sql, params).fetchone()
        return row


class _TxSession:
    def __init__(self, connector: SQLiteConnector):
        self._c = connector

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        return await self._c._call(lambda s: s.execute(sql, params))

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        return await self._c._call(lambda s: s.executemany(sql, rows))

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        return await self._c._call(lambda s: s.fetchall(sql, params))

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> Row | None:
        return await self._c._call(lambda s: s.fetchone(sql, params))


class SQLiteConnector:
    dialect = "sqlite"

    def __init__(self, name: str, options: dict[str, Any], *, root: Path | None = None):
        self.name = name
        self.url = options["url"]
        self.path = sqlite_path(self.url, root)
        self.busy_timeout = int(options.get("busy_timeout") or 30000)
        self._executor: ThreadPoolExecutor | None = None
        self._sync: _Sync | None = None
        self._lock: asyncio.Lock | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _open(self) -> _Sync:
        try:
            return self._connect()
        except (OSError, sqlite3.OperationalError) as e:
            # A path that is not a writable file (no such folder and none can be made, a
            # folder, no permission) does not open by waiting, as a locked file would.
            if isinstance(e, sqlite3.OperationalError) and not _cannot_open(e):
                raise
            raise ConfigError(
                f"SQLite database connection {self.name!r} cannot open {self.path} "
                f"({type(e).__name__}: {e}); check its url (config/database.py or "
                "DATABASE_URL) and that the folder exists and is writable"
            ) from None

    def _connect(self) -> _Sync:
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: we issue BEGIN/COMMIT ourselves; autocommit otherwise.
        conn = sqlite3.connect(
            self.path,
            timeout=self.busy_timeout / 1000,
            isolation_level=None,
            check_same_thread=False,
        )
        conn.execute(f"PRAGMA busy_timeout = {self.busy_timeout}")
        if self.path != ":memory:":
            conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        return _Sync(conn)

    def _guard(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if self._lock is None or self._loop is not loop:
            self._lock = asyncio.Lock()
            self._loop = loop
        return self._lock

    async def _call(self, fn: Callable[[_Sync], T]) -> T:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"haze-sqlite-{self.name}")
        loop = asyncio.get_running_loop()

        def run() -> T:
            if self._sync is None:
                self._sync = self._open()
            return fn(self._sync)

        try:
            return await loop.run_in_executor(self._executor, run)
        except sqlite3.OperationalError as e:
            # Another process held the lock past busy_timeout: the database is unavailable
            # for now (a worker says so once and waits), not a bad statement.
            if e.sqlite_errorcode & 0xFF not in (_SQLITE_BUSY, _SQLITE_LOCKED):
                raise
            raise DatabaseConnectionError(
                f"SQLite database connection {self.name!r} ({self.path}) is locked: another "
                f"process held it longer than busy_timeout ({self.busy_timeout} ms); "
                f"{e}"
            ) from None

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        async with self._guard():
            return await self._call(lambda s: s.execute(sql, params))

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        async with self._guard():
            return await self._call(lambda s: s.executemany(sql, rows))

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        async with self._guard():
            return await self._call(lambda s: s.fetchall(sql, params))

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> Row | None:
        async with self._guard():
            return await self._call(lambda s: s.fetchone(sql, params))

    @asynccontextmanager
    async def transaction(self, *, immediate: bool = False) -> AsyncIterator[_TxSession]:
        # The asyncio lock keeps other coroutines' statements out of this transaction.
        async with self._guard():
            await self._call(lambda s: s.execute("BEGIN IMMEDIATE" if immediate else "BEGIN", ()))
            try:
                yield _TxSession(self)
            except BaseException:
                await self._call(lambda s: s.execute("ROLLBACK", ()))
                raise
            await self._call(lambda s: s.execute("COMMIT", ()))

    async def close(self) -> None:
        if self._executor is not None:
            sync, self._sync = self._sync, None
            if sync is not None:
                loop = asyncio.get_running_loop()
                await loop.run_in_executor(self._executor, sync.conn.close)
            self._executor.shutdown(wait=False)
            self._executor = None


def _cannot_open(error: sqlite3.OperationalError) -> bool:
    """SQLITE_CANTOPEN, or SQLITE_READONLY (a file or folder it may not write)."""
    return error.sqlite_errorcode & 0xFF in (_SQLITE_CANTOPEN, _SQLITE_READONLY)
