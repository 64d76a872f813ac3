"""A lean Redis connection for the ``redis`` driver's per-job script calls.

Every job costs the driver one BullMQ script call to queue it and one to finish it
(which also fetches the next job). Through redis-py's asyncio client each call checks a
connection out of the pool under a timeout, packs ~15 arguments through its encoder and
reads the reply through a stream reader with its own timeout: in a profile of a worker
that was most of the Python time per job, more than haze itself. This module sends the
same ``EVALSHA`` commands on one plain asyncio connection instead:

- commands issued in the same event-loop turn go out in one write (auto-pipelining),
  so concurrent dispatches and worker slots share round trips;
- replies are matched to callers in order; a caller that is cancelled leaves its reply
  to be read and dropped, so the connection never gets out of step;
- replies are decoded like ``decode_responses=True`` (``str``), with hiredis's parser
  when it is installed and a small one of our own otherwise.

It implements the two methods redis-py's ``AsyncScript`` calls on its ``client=``
argument (``evalsha``, ``script_load``), so BullMQ's script helpers run unchanged on it.
``pipeline`` writes commands encoded beforehand in one write: a blocking command and the
one that should run the moment it returns (Redis runs the rest of a client's commands
right after it unblocks), on a ``Wire`` of its own that nothing else shares.
Only plain TCP connections use it; TLS and Unix sockets stay on redis-py. A lost
connection fails the calls in flight with redis-py's ``ConnectionError`` (what the
worker's outage handling expects) and the next call connects again.
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

from haze._base.prompt_future import PromptFuture
from haze.drivers.redis.resp import _BULK_MAX, _bulk, _error, _fresh, _pack, _reader, encode
from haze.stores.redis import db_index_error

if TYPE_CHECKING:
    from redis.commands.core import AsyncScript

__all__ = ["Wire", "encode", "wire_for"]

_CONNECT_TIMEOUT = 10.0


class _NotSent(RedisConnectionError):
    """The connection was gone before the command was written: safe to send again."""


class _Reply(PromptFuture):
    """The future of one reply (``haze._base.prompt_future``: ``deliver`` resumes the
    task awaiting it at once)."""


class _Protocol(asyncio.Protocol):
    def __init__(self, wire: Wire) -> None:
        self.wire = wire
        self.reader = _reader()
        self.waiters: deque[_Reply] = deque()
        self.transport: asyncio.Transport | None = None
        self.lost: BaseException | None = None
        #: commands of this loop turn, written together by ``flush``
        self.out: list[bytes] = []
        self.flush_scheduled = False
        #: the server's id of this connection (``CLIENT ID``), when the wire asks for it
        self.client_id: int | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but act like them
        self.transport = cast("asyncio.Transport", transport)

    def data_received(self, data: bytes) -> None:
        reader = self.reader
        reader.feed(data)
        waiters = self.waiters
        try:
            while True:
                reply = reader.gets()
                if reply is False:
                    return
                fut = waiters.popleft()
                if not fut.done():
                    if isinstance(reply, Exception) and not isinstance(reply, ResponseError):
                        reply = _error(str(reply))  # hiredis: its own ReplyError
                    fut.deliver(reply)
        except Exception as e:  # a protocol error or an unrequested reply: start afresh
            self._fail(RedisConnectionError(f"Redis connection out of step: {e}"))
            if self.transport is not None:
                self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(
            RedisConnectionError(
                f"Connection to Redis at {self.wire.address} lost"
                + (f": {exc}" if exc is not None else "")
            )
        )

    def flush(self) -> None:
        self.flush_scheduled = False
        out, self.out = self.out, []
        if self.transport is None or self.transport.is_closing():
            # only these were never written; the ones before them fail in connection_lost
            error = _NotSent(f"Connection to Redis at {self.wire.address} lost")
            unsent = [self.waiters.pop() for _ in range(min(len(out), len(self.waiters)))]
            for fut in unsent:
                if not fut.done():
                    fut.set_exception(error)
            return
        self.transport.write(b"".join(out))

    def _fail(self, error: BaseException) -> None:
        self.lost = error
        self.out.clear()
        if self.wire._protocol is self:
            self.wire._protocol = None
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_exception(error)
                fut.exception()  # a cancelled caller may never look at it


class Wire:
    """One auto-pipelined RESP2 connection; see the package docstring."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        db: int = 0,
        username: str | None = None,
        password: str | None = None,
        client_name: str | None = None,
        keepalive: dict[int, int] | None = None,
        track_id: bool = False,
    ) -> None:
        self.host = host
        self.port = port
        #: TCP keepalive options (None: off), as the redis-py clients of the store use
        self._keepalive = keepalive
        self.address = f"{host}:{port}"
        self._setup: list[tuple[Any, ...]] = []
        self._db = db
        if password is not None:
            auth = ("AUTH", username, password) if username else ("AUTH", password)
            self._setup.append(auth)
        if db:
            self._setup.append(("SELECT", db))
        if client_name:
            self._setup.append(("CLIENT", "SETNAME", client_name))
        #: ask each connection's id (``client_id``): another connection can then end a
        #: blocking command on this one with ``CLIENT UNBLOCK``
        self._track_id = track_id
        self._protocol: _Protocol | None = None
        self._connecting: asyncio.Future[_Protocol] | None = None
        #: encoded command heads of ``run_script(fixed_keys=True)``
        self._heads: dict[tuple[Any, ...], bytes] = {}

    async def _connect(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        try:
            _, protocol = await asyncio.wait_for(
                loop.create_connection(lambda: _Protocol(self), self.host, self.port),
                _CONNECT_TIMEOUT,
            )
        except (TimeoutError, OSError) as e:
            # nothing was written: a dispatch knows its job was not queued
            raise _NotSent(
                f"Error connecting to Redis at {self.address}: {e or type(e).__name__}"
            ) from e
        sock = protocol.transport.get_extra_info("socket") if protocol.transport else None
        if sock is not None and self._keepalive is not None:
            # A peer gone without a reset (a partition) fails the calls in about a
            # minute instead of leaving them waiting forever.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            for option, value in self._keepalive.items():
                sock.setsockopt(socket.IPPROTO_TCP, option, value)
        setup = [*self._setup, ("CLIENT", "ID")] if self._track_id else self._setup
        futs = [self._send(protocol, _pack(cmd)) for cmd in setup]
        self._protocol = protocol
        try:
            for f in futs:
                reply = await f
            if self._track_id:
                protocol.client_id = int(reply)
        except BaseException as e:
            if protocol.transport is not None:
                protocol.transport.abort()
            if isinstance(e, ResponseError):
                bad_db = db_index_error(e, self._db, self.address)
                if bad_db is not None:
                    raise bad_db from None
            raise
        return protocol

    async def _ready(self) -> _Protocol:
        p = self._protocol
        if p is not None:
            return p
        connecting = self._connecting
        if connecting is None:
            connecting = self._connecting = asyncio.ensure_future(self._connect())
            connecting.add_done_callback(self._connected)
        return await asyncio.shield(connecting)

    def _connected(self, fut: asyncio.Future[_Protocol]) -> None:
        self._connecting = None
        if not fut.cancelled():
            fut.exception()  # seen here; the waiters re-raise it

    @staticmethod
    def _send(protocol: _Protocol, packed: bytes) -> _Reply:
        loop = asyncio.get_running_loop()
        fut = _Reply(loop=loop)
        if protocol.lost is not None:
            fut.set_exception(_NotSent(str(protocol.lost)))
            return fut
        if not protocol.waiters and not protocol.out and protocol.transport is not None:
            # Idle connection: nothing to share a write with, so send now (a lone caller
            # does not wait a loop turn for the flush).
            protocol.waiters.append(fut)
            protocol.transport.write(packed)
            return fut
        protocol.waiters.append(fut)
        protocol.out.append(packed)
        if not protocol.flush_scheduled:
            protocol.flush_scheduled = True
            loop.call_soon(protocol.flush)
        return fut

    async def execute(self, *args: Any) -> Any:
        return await self._execute(_pack(args))

    async def _execute(self, packed: bytes) -> Any:
        protocol = self._protocol or await self._ready()
        try:
            return await self._send(protocol, packed)
        except _NotSent:
            # The connection died before the command went out (a Redis restart seen
            # late): send it once more on a fresh one. A command that was written is
            # not sent again: it may have run.
            return await self._send(await self._ready(), packed)

    async def run_script(
        self, script: AsyncScript, keys: list[str], args: list[Any], *, fixed_keys: bool = False
    ) -> Any:
        """``EVALSHA`` of a registered script, loading it after ``NOSCRIPT``.

        ``fixed_keys``: the caller sends these keys again and again (a queue's keys), so
        the encoded head of the command is kept and only ``args`` are encoded per call.
        """
        if fixed_keys:
            cache_key = (script.sha, len(args), *keys)
            head = self._heads.get(cache_key)
            if head is None:
                if len(self._heads) >= _BULK_MAX:
                    self._heads.clear()
                head = self._heads[cache_key] = b"*%d\r\n" % (3 + len(keys) + len(args)) + b"".join(
                    map(_bulk, ("EVALSHA", script.sha, len(keys), *keys))
                )
            packed = head + b"".join(map(_bulk, args))
        else:
            packed = _pack(("EVALSHA", script.sha, len(keys), *keys, *args))
        try:
            return await self._execute(packed)
        except NoScriptError:
            script.sha = await self.script_load(script.script)
            return await self.execute("EVALSHA", script.sha, len(keys), *keys, *args)

    @staticmethod
    def script_head(script: AsyncScript, keys: list[str], fixed: list[Any], n_args: int) -> bytes:
        """The encoded start of an ``EVALSHA`` of ``script`` with these keys and leading
        arguments, for ``run_head``; ``n_args`` arguments follow it."""
        return b"*%d\r\n" % (3 + len(keys) + len(fixed) + n_args) + b"".join(
            map(_bulk, ("EVALSHA", script.sha, len(keys), *keys, *fixed))
        )

    @staticmethod
    def script_call(head: bytes, *args: Any) -> bytes:
        """A whole ``EVALSHA`` from a ``script_head`` and the remaining arguments, for
        ``pipeline``."""
        return head + _fresh(args)

    async def run_head(self, script: AsyncScript, head: bytes, args: tuple[Any, ...]) -> Any:
        """``EVALSHA`` from a ``script_head`` and the remaining arguments, loading the
        script after ``NOSCRIPT`` (its sha is its content's, so ``head`` stays valid)."""
        packed = head + _fresh(args)
        protocol = self._protocol
        try:
            if protocol is None:
                return await self._execute(packed)
            # _execute without its coroutine: this call is a dispatch's whole round trip
            try:
                return await self._send(protocol, packed)
            except _NotSent:
                return await self._send(await self._ready(), packed)
        except NoScriptError:
            script.sha = await self.script_load(script.script)
            return await self._execute(packed)

    @property
    def client_id(self) -> int | None:
        """The server's id of the current connection (``track_id=True``), else None."""
        p = self._protocol
        return p.client_id if p is not None else None

    @staticmethod
    def _send_all(protocol: _Protocol, packed: Sequence[bytes]) -> list[_Reply]:
        """``_send`` of several commands that go out in the same write."""
        loop = asyncio.get_running_loop()
        futs = [_Reply(loop=loop) for _ in packed]
        if protocol.lost is not None:
            for fut in futs:
                fut.set_exception(_NotSent(str(protocol.lost)))
            return futs
        idle = not protocol.waiters and not protocol.out and protocol.transport is not None
        protocol.waiters.extend(futs)
        if idle:
            assert protocol.transport is not None
            protocol.transport.write(b"".join(packed))
            return futs
        protocol.out.extend(packed)
        if not protocol.flush_scheduled:
            protocol.flush_scheduled = True
            loop.call_soon(protocol.flush)
        return futs

    async def pipeline(self, packed: Sequence[bytes]) -> list[Any]:
        """Commands encoded beforehand (``encode``, ``script_head``) in one write; their
        replies in order, an error reply as its exception object.

        Written together, they reach Redis together: a blocking command (``BZPOPMIN``)
        followed by the command that should run the moment it returns has that one run
        by the server as soon as the first unblocks, with no round trip in between.
        """
        protocol = self._protocol or await self._ready()
        futs = self._send_all(protocol, packed)
        if protocol.lost is not None:  # none of them went out: once more, on a fresh one
            for f in futs:
                f.exception()
            futs = self._send_all(await self._ready(), packed)
        out: list[Any] = []
        try:
            for f in futs:
                try:
                    out.append(await f)
                except ResponseError as e:
                    out.append(e)
        except BaseException:
            # the caller gives up on the rest: their replies are read and dropped
            for f in futs:
                if not f.done():
                    f.cancel()
                elif not f.cancelled():
                    f.exception()
            raise
        return out

    async def execute_many(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        """Several commands in one write; their replies, an error reply as its exception
        object (also inside an array, e.g. ``EXEC``'s), like ``raise_on_error=False``."""
        protocol = self._protocol or await self._ready()
        futs = [self._send(protocol, _pack(c)) for c in commands]
        out: list[Any] = []
        for f in futs:
            try:
                reply = await f
            except ResponseError as e:
                reply = e
            if isinstance(reply, list):
                reply = [
                    _error(str(r))
                    if isinstance(r, Exception) and not isinstance(r, ResponseError)
                    else r
                    for r in reply
                ]
            out.append(reply)
        return out

    # the two methods redis-py's AsyncScript calls on its client
    async def evalsha(self, sha: str, numkeys: int, *args: Any) -> Any:
        return await self.execute("EVALSHA", sha, numkeys, *args)

    async def script_load(self, script: Any) -> str:
        sha: str = await self.execute("SCRIPT", "LOAD", script)
        return sha

    def close(self) -> None:
        p = self._protocol
        self._protocol = None
        if self._connecting is not None:
            self._connecting.cancel()
        if p is not None and p.transport is not None:
            p.transport.close()


def wire_for(client: Any, *, track_id: bool = False) -> Wire | None:
    """A ``Wire`` to the server of a redis-py asyncio client, or None when it does not
    connect over plain TCP (TLS, a Unix socket): those keep using redis-py."""
    from redis.asyncio.connection import Connection

    pool = client.connection_pool
    if pool.connection_class is not Connection:
        return None
    kw = pool.connection_kwargs
    if kw.get("credential_provider") is not None:
        return None
    return Wire(
        kw.get("host") or "localhost",
        int(kw.get("port") or 6379),
        db=int(kw.get("db") or 0),
        username=kw.get("username"),
        password=kw.get("password"),
        client_name=kw.get("client_name"),
        keepalive=dict(kw.get("socket_keepalive_options") or {})
        if kw.get("socket_keepalive")
        else None,
        track_id=track_id,
    )
