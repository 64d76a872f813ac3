"""One autocommit statement with parameters, sent straight through the connection's
libpq object (``psycopg.pq``) instead of a psycopg cursor.

A psycopg async ``execute`` costs about 100 µs more CPU than a sync one: its cursor
state, adapters, prepared-statement bookkeeping, lock and generator-driven wait. haze's
autocommit ``execute()`` (a single dispatch is one such statement) needs none of that
for parameters of four plain types, so it sends the statement itself: one
``send_query_prepared`` (``send_query_params`` when the app turned prepared statements
off), one wait for the socket, and the results. What a caller sees is unchanged: the
rowcount, and psycopg's own exception classes for a server error or a lost connection.

Anything else (another parameter type, text psycopg would refuse, a connection not in
autocommit or not speaking UTF-8) takes psycopg's cursor, as before.
"""

from __future__ import annotations

import asyncio
import math
import re
import weakref
from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from haze._base.prompt_future import PromptFuture

if TYPE_CHECKING:
    from psycopg import AsyncConnection

#: the OIDs psycopg gives these Python values in text format: str is "unknown" (the
#: server infers it from where it goes), an int the smallest integer type that holds it
_UNKNOWN, _INT2, _INT4, _INT8, _NUMERIC, _FLOAT8 = 0, 21, 23, 20, 1700, 701
#: libpq's result statuses (psycopg.pq.ExecStatus) a statement may end with
_COMMAND_OK, _TUPLES_OK, _FATAL_ERROR = 1, 2, 7
#: psycopg.pq.TransactionStatus.ACTIVE: a statement is running
_ACTIVE = 1
#: how long a cancelled statement may take to stop before its connection is closed
_CANCEL_SECONDS = 5.0

#: the most statements one connector prepares (haze's own are a few dozen); the server
#: keeps each for the life of every connection that ran it
MAX_PREPARED = 100
#: the most statements counted towards the prepare threshold at once
_MAX_SEEN = 1000

_TOKENS = re.compile(r"'[^']*'|\"[^\"]*\"|--[^\n]*|/\*.*?\*/|\?", re.S)


@lru_cache(maxsize=1024)
def numbered(sql: str) -> bytes:
    """``?`` → ``$1``, ``$2``, … outside quotes and comments (libpq's placeholders)."""
    n = 0

    def swap(m: re.Match[str]) -> str:
        nonlocal n
        if m.group(0) != "?":
            return m.group(0)
        n += 1
        return f"${n}"

    return _TOKENS.sub(swap, sql).encode()


def _int_oid(v: int) -> int:
    if -0x8000 <= v <= 0x7FFF:
        return _INT2
    if -0x80000000 <= v <= 0x7FFFFFFF:
        return _INT4
    if -0x8000000000000000 <= v <= 0x7FFFFFFFFFFFFFFF:
        return _INT8
    return _NUMERIC


def encode(params: Sequence[Any]) -> tuple[list[bytes | None], tuple[int, ...]] | None:
    """The parameters as libpq text values and their OIDs, as psycopg would send them;
    None for anything else (psycopg's cursor adapts it, or refuses it in its own words)."""
    values: list[bytes | None] = []
    oids: list[int] = []
    for p in params:
        t = type(p)
        if t is str:
            if "\x00" in p:
                return None
            values.append(p.encode())
            oids.append(_UNKNOWN)
        elif t is float:
            if not math.isfinite(p):
                return None
            values.append(repr(p).encode())
            oids.append(_FLOAT8)
        elif t is int:
            values.append(str(p).encode())
            oids.append(_int_oid(p))
        elif p is None:
            values.append(None)
            oids.append(_UNKNOWN)
        else:
            return None
    return values, tuple(oids)


class LeanStatements:
    """The lean ``execute`` of one connector, and which statements each of its
    connections has prepared."""

    def __init__(self) -> None:
        from psycopg.errors import InvalidSqlStatementName

        #: the server answers a prepared statement it does not know with this
        self._forgotten = InvalidSqlStatementName
        self._names: dict[tuple[bytes, tuple[int, ...]], bytes] = {}
        #: statements not prepared yet, and how often each ran
        self._seen: dict[tuple[bytes, tuple[int, ...]], int] = {}
        self._prepared: weakref.WeakKeyDictionary[AsyncConnection[Any], set[bytes]] = (
            weakref.WeakKeyDictionary()
        )

    def _name(self, key: tuple[bytes, tuple[int, ...]], threshold: int) -> bytes | None:
        """The prepared statement's name for ``key``, or None to send it unnamed: as
        psycopg does, a statement is prepared once it has run ``threshold`` times, and
        past ``MAX_PREPARED`` statements (an app's own SQL built on the fly) none is."""
        name = self._names.get(key)
        if name is not None:
            return name
        if len(self._names) >= MAX_PREPARED:
            return None
        seen = self._seen.get(key, 0) + 1
        if seen <= threshold:
            if len(self._seen) >= _MAX_SEEN:
                self._seen.clear()
            self._seen[key] = seen
            return None
        self._seen.pop(key, None)
        name = self._names[key] = f"_haze_{len(self._names)}".encode()
        return name

    def usable(self, conn: AsyncConnection[Any]) -> bool:
        """Whether ``conn`` runs a single statement as its own transaction, in UTF-8."""
        if conn in self._prepared:
            return True
        if not conn.autocommit or conn.info.encoding != "utf-8":
            return False
        self._prepared[conn] = set()
        return True

    async def execute(
        self, conn: AsyncConnection[Any], sql: str, params: Sequence[Any]
    ) -> int | None:
        """Run ``sql`` on ``conn`` and return its rowcount; None when this path does not
        take it (the caller runs it through psycopg's cursor)."""
        encoded = encode(params)
        if encoded is None or not self.usable(conn):
            return None
        values, oids = encoded
        query = numbered(sql)
        threshold = conn.prepare_threshold
        name = None if threshold is None else self._name((query, oids), threshold)
        if name is None:
            conn.pgconn.send_query_params(query, values, oids)
            return await _result(conn)
        done = self._prepared[conn]
        for attempt in (0, 1):
            if name not in done:
                conn.pgconn.send_prepare(name, query, oids)
                await _result(conn)
                done.add(name)
            conn.pgconn.send_query_prepared(name, values)
            try:
                return await _result(conn)
            except self._forgotten:
                # psycopg sends DEALLOCATE ALL after a DROP, ALTER or ROLLBACK on the
                # same connection, so the server forgot this one: nothing ran, prepare again.
                if attempt:
                    raise
                done.clear()
        raise AssertionError("unreachable")  # pragma: no cover


async def _result(conn: AsyncConnection[Any]) -> int:
    """Wait for the statement sent on ``conn`` and return its rowcount; a server error
    raises psycopg's class for its SQLSTATE once every result is read (the connection is
    idle again), a lost connection psycopg's ``OperationalError``."""
    pgconn = conn.pgconn
    try:
        await _until_idle(conn)
    except asyncio.CancelledError:
        await _cancel(conn)
        raise
    rowcount, error = -1, None
    while (res := pgconn.get_result()) is not None:
        status = res.status
        if status == _FATAL_ERROR:
            from psycopg.errors import error_from_result

            error = error or error_from_result(res, encoding="utf-8")
        elif status in (_TUPLES_OK, _COMMAND_OK):
            n = res.command_tuples
            rowcount = n if n is not None else rowcount
    if error is not None:
        raise error
    return rowcount


async def _until_idle(conn: AsyncConnection[Any]) -> None:
    """Send what libpq holds of the statement, then read until its results are in."""
    pgconn = conn.pgconn
    loop = asyncio.get_running_loop()
    fd = pgconn.socket
    while pgconn.flush():  # a statement larger than the socket's buffer
        await _ready(loop, fd, write=True)
    while True:
        await _ready(loop, fd, write=False)
        pgconn.consume_input()
        if not pgconn.is_busy():
            return


async def _cancel(conn: AsyncConnection[Any]) -> None:
    """As psycopg does for its own cancelled statement: ask the server to cancel it and
    read what comes back, so the connection is idle for the next user; when that fails
    too, close it (the pool replaces a closed connection)."""
    pgconn = conn.pgconn
    if pgconn.transaction_status != _ACTIVE:
        return
    try:
        async with asyncio.timeout(_CANCEL_SECONDS):
            await conn.cancel_safe()
            await _until_idle(conn)
        while pgconn.get_result() is not None:
            pass
    except Exception:  # the caller's cancellation is what it raises, not this
        await conn.close()
    except BaseException:  # cancelled again meanwhile
        await conn.close()
        raise


async def _ready(loop: asyncio.AbstractEventLoop, fd: int, *, write: bool) -> None:
    # A PromptFuture: the task resumes from the fd callback itself, not one loop pass
    # (and its epoll_wait) later.
    fut = PromptFuture(loop=loop)

    def wake() -> None:
        if not fut.done():
            fut.deliver(None)

    if write:
        loop.add_writer(fd, wake)
        try:
            await fut
        finally:
            loop.remove_writer(fd)
    else:
        loop.add_reader(fd, wake)
        try:
            await fut
        finally:
            loop.remove_reader(fd)
