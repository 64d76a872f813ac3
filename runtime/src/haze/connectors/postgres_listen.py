"""The LISTEN connection of a PostgreSQL connector (``_Listener``), and what counts as
the server being unreachable (or a pooled connection closed by it)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import select
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from haze._base.errors import DatabaseConnectionError

if TYPE_CHECKING:
    from psycopg import AsyncConnection

    from haze.connectors.postgres import PostgresConnector

log = logging.getLogger("haze.connectors")

#: SQLSTATEs that mean the server went away: class 08 (connection exception) and 57P
#: (shutdown, crash, "the database system is starting up"); not 57014, a statement timeout
_OUTAGE_SQLSTATE = ("08", "57P")


def _is_outage(error: BaseException) -> bool:
    """Whether a psycopg error says the server cannot be reached (not a bad statement)."""
    import psycopg
    from psycopg_pool import PoolTimeout

    if isinstance(error, PoolTimeout):  # no connection came back within the pool's timeout
        return True
    if not isinstance(error, psycopg.OperationalError):
        return False
    # No SQLSTATE: a client-side failure (socket closed, "consuming input failed").
    state = error.sqlstate
    return state is None or state.startswith(_OUTAGE_SQLSTATE)


def _gone(conn: AsyncConnection[Any]) -> bool:
    """Whether the server closed this idle connection (a restart, a failover,
    ``pg_terminate_backend``, an idle timeout): an idle session is sent nothing unasked,
    so a readable socket holds the server's goodbye or its EOF. A poll of the socket,
    not a round trip: a dispatch pays no ping for it."""
    if conn.closed:
        return True
    try:
        ready = select.select([conn.pgconn.socket], [], [], 0)[0]
    except (OSError, ValueError):  # no socket, or one select() cannot watch
        return False
    return bool(ready)


#: at most how long a failed write waits for its server process to finish the statement
ENDED_SECONDS = 2.0


async def statement_ended(connector: PostgresConnector, pid: int) -> bool:
    """Wait (a little) until server process ``pid`` runs no statement (False when that
    was not seen): its socket is
    gone, but a backend that was not terminated finishes and commits its statement
    anyway, and the caller is about to look for what that statement wrote."""
    loop = asyncio.get_running_loop()
    end = loop.time() + ENDED_SECONDS
    while loop.time() < end:
        try:
            # bounded: a server that went away leaves the pool waiting for a connection
            # for its own timeout (30 s), far past this wait
            async with asyncio.timeout(max(end - loop.time(), 0.01)):
                row = await connector.fetchone(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = ? AND state = 'active'",
                    (pid,),
                )
        except Exception:
            row = None
        if row is not None and not row[0]:
            return True
        await asyncio.sleep(0.01)
    return False


async def failed_write(
    connector: PostgresConnector,
    error: Exception,
    down: DatabaseConnectionError | None,
    pid: int | None,
) -> DatabaseConnectionError | None:
    """The error a write that raised ``error`` (``down``: as an outage, else None) ends
    with, telling what it did: nothing when no connection was had (``pid`` None); not
    known yet while server process ``pid`` still runs it. A dispatch decides by it."""
    if pid is None and (down or isinstance(error, DatabaseConnectionError)):
        return DatabaseConnectionError(str(down or error), write="unsent")
    if down is not None and pid is not None and not await statement_ended(connector, pid):
        return DatabaseConnectionError(str(down), write="unsettled")
    return down


class _Listener:
    """One LISTEN connection of a connector: wakes ``listen()`` callers per channel.

    A notification that arrives while nobody waits on its channel is remembered, so
    the next ``listen()`` returns at once: the worker was busy claiming when the job
    came in and must look again before it sleeps.
    """

    def __init__(self, connector: PostgresConnector):
        self._c = connector
        self._conn: AsyncConnection[Any] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._channels: set[str] = set()
        self._events: dict[str, asyncio.Event] = {}
        self._waiting: dict[str, int] = {}
        #: per channel, callbacks handed each payload (``watch()``); "" means "look now"
        self._watchers: dict[str, set[Callable[[str], None]]] = {}
        self._banked: set[str] = set()
        self._lock = asyncio.Lock()
        self._failures = 0
        self._retry_at = 0.0
        self._closed = False

    async def wait(self, channel: str, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if channel in self._banked:
            self._banked.discard(channel)
            return
        ready = await self._ensure(channel)
        remaining = deadline - loop.time()
        if remaining <= 0:
            return
        if not ready:  # no LISTEN connection: plain polling
            await asyncio.sleep(remaining)
            return
        event = self._events.get(channel)
        if event is None:
            event = self._events[channel] = asyncio.Event()
        self._waiting[channel] = self._waiting.get(channel, 0) + 1
        try:
            async with asyncio.timeout(remaining):
                await event.wait()
        except TimeoutError:
            pass
        finally:
            self._waiting[channel] -= 1

    def _deliver(self, channel: str) -> None:
        event = self._events.pop(channel, None)
        if event is not None and self._waiting.get(channel):
            event.set()
        else:
            self._banked.add(channel)

    def _wake_all(self) -> None:
        for event in self._events.values():
            event.set()
        self._events.clear()
        for watchers in self._watchers.values():
            for callback in tuple(watchers):
                callback("")

    async def _ensure(self, channel: str) -> bool:
        reader = self._reader
        if (
            self._conn is not None
            and channel in self._channels
            and reader is not None
            and not reader.done()
        ):
            return True
        if self._closed:
            return False
        loop = asyncio.get_running_loop()
        if self._conn is None and loop.time() < self._retry_at:
            return False
        async with self._lock:
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = await self._c._connect(listen=True)
                    self._channels.clear()
                    if self._failures:
                        log.info("haze: LISTEN connection to database %r is back", self._c.name)
                    self._failures = 0
                if channel not in self._channels:
                    await self._stop_reader()
                    from psycopg import sql

                    await self._conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                    self._channels.add(channel)
                reader = self._reader
                if reader is None or reader.done():
                    self._reader = loop.create_task(
                        self._read(self._conn), name=f"haze-pg-listen-{self._c.name}"
                    )
                return True
            except asyncio.CancelledError:
                raise
            except Exception as e:
                await self._broken(e)
                return False

    async def _read(self, conn: AsyncConnection[Any]) -> None:
        try:
            async for n in conn.notifies():
                self._deliver(n.channel)
                for callback in tuple(self._watchers.get(n.channel, ())):
                    callback(n.payload)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            if self._conn is conn and not self._closed:
                await self._broken(e)

    async def _broken(self, error: BaseException) -> None:
        loop = asyncio.get_running_loop()
        conn, self._conn = self._conn, None
        self._channels.clear()
        self._failures += 1
        delay = min(30.0, 0.5 * 2 ** (self._failures - 1))
        self._retry_at = loop.time() + delay
        # A server outage is the worker's to report (once); a LISTEN that fails on a server
        # that works (a pooler in transaction mode, a missing permission) is news.
        outage = isinstance(error, DatabaseConnectionError) or _is_outage(error)
        (log.warning if self._failures == 1 and not outage else log.debug)(
            "haze: LISTEN connection to database %r failed (%s); idle workers poll "
            "until it reconnects (next try in %.1fs)",
            self._c.name,
            str(error).strip() or type(error).__name__,
            delay,
        )
        self._wake_all()  # a job may have come in unnoticed: look now
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()

    async def _stop_reader(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None and not reader.done():
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader

    async def close(self) -> None:
        self._closed = True
        await self._stop_reader()
        self._wake_all()
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()
