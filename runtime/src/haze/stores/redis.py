"""The ``redis`` store: unique locks, middleware state and batches in Redis.

Every operation is one atomic Redis command or script:

- ``add``: ``SET key value NX PX ttl``
- ``increment``: ``INCRBY`` plus ``PEXPIRE`` when this call created the key, in one Lua
  script (``redis_increment.lua``)
- ``delete(key, owner)``: ``GET`` + compare + ``DEL`` in one Lua script
  (``redis_delete_owner.lua``)
- ``touch(key, owner, ttl)``: ``GET`` + compare + ``PEXPIRE`` in one Lua script
  (``redis_touch_owner.lua``)
- ``get_many``: ``MGET``; ``ttl``: ``PTTL``
- ``settle_batch_job``: the per-job marker, counters and pending decrement of a batch
  in one Lua script (``redis_settle_batch.lua``)
- ``notify``/``subscribe`` (``StatusNotifier``): ``PUBLISH`` and a ``SUBSCRIBE`` on a
  connection of its own for the length of the subscription

Values are stored as JSON text. Keys are prefixed by the connection's ``key_prefix``
(``config/redis.py``) followed by the store's ``prefix`` option::

    # config/cache.py
    config = define_cache_config(default="redis", stores={
        "redis": {"driver": "redis", "connection": "default", "prefix": "cache:"}})
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Concatenate, ParamSpec, TypeVar

from haze._base.errors import BackendUnavailableError, ConfigError, MissingDependencyError
from haze._base.hints import did_you_mean
from haze._base.urls import redact_text, redact_url, redis_url_problem
from haze.contracts.store import BatchSettled, Subscription
from haze.stores.workflow_state import KeyValueWorkflowState

try:
    import redis.asyncio as aioredis
    from redis.asyncio.connection import AbstractConnection
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import ResponseError
    from redis.exceptions import TimeoutError as RedisTimeoutError
except ImportError as e:  # pragma: no cover - exercised without the extra installed
    raise MissingDependencyError("the redis store", "redis", "redis") from e

if TYPE_CHECKING:
    from redis.commands.core import AsyncScript

__all__ = ["RedisStore", "db_index_error", "new_client", "redis_settings"]

_HERE = Path(__file__).parent
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
_CLIENT_KEYS = ("host", "port", "db", "username", "password", "ssl")
#: Connection tuning from config/redis.py, applied with a ``url`` too.
_SOCKET_KEYS: tuple[str, ...] = ("socket_timeout", "socket_connect_timeout")
_SOCKET_KEYS += ("health_check_interval", "socket_keepalive")
_DEFAULT_URL = "redis://127.0.0.1:6379/0"
_POOL_SIZE = 128
_POOL_WAIT = 30.0
#: Subscriptions open at once per store and event loop. Each holds a pooled connection,
#: so past this many a ``Queue.wait`` polls instead of starving the store's other work.
_MAX_SUBSCRIPTIONS = 32


def redis_settings(
    app: Any,
    connection: str | None,
    url: str | None = None,
    *,
    where: str = "connection",
    source: str | None = None,
) -> tuple[str | None, dict[str, Any], str]:
    """``(url, client kwargs, key_prefix)`` of a ``config/redis.py`` connection.

    An inline ``url`` wins over the named connection (its ``key_prefix`` still applies).
    The key prefix is returned apart: BullMQ gets the settings without it.
    """
    cfg = getattr(app, "redis_config", None)
    settings: dict[str, Any] = {}
    if cfg is not None:
        name = connection or cfg.default
        if name not in cfg.connections:
            known = ", ".join(cfg.connections) or "none"
            # ``source``: the file that named it (config/cache.py, config/queue.py)
            raise ConfigError(
                f"{name!r} is not a connection in config/redis.py (connections: {known})"
                f"{did_you_mean(name, cfg.connections)}",
                source=source or cfg.source,
                key=where,
            )
        settings = dict(cfg.connections[name])
    elif connection is not None:
        raise ConfigError(
            f"redis connection {connection!r} needs an app with config/redis.py", key=where
        )
    key_prefix = str(settings.get("key_prefix") or "")
    tuning = {k: settings[k] for k in _SOCKET_KEYS if settings.get(k) is not None}
    if url:
        return url, tuning, key_prefix
    kwargs = {k: settings[k] for k in _CLIENT_KEYS if settings.get(k) is not None}
    conn_url = settings.get("url") or (None if kwargs else _DEFAULT_URL)
    return conn_url, {**kwargs, **tuning}, key_prefix


def _keepalive() -> dict[str, Any]:
    """TCP keepalive that notices a dead peer in about a minute (Linux's default waits two
    hours): a half-open connection — a partition, a server host gone without a reset —
    would otherwise block a worker's wait for jobs forever."""
    import socket

    options = {}
    for name, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, name):
            options[getattr(socket, name)] = value
    return {"socket_keepalive": True, "socket_keepalive_options": options}


def new_client(url: str | None, kwargs: dict[str, Any]) -> aioredis.Redis:
    """An asyncio client that decodes replies to ``str``. Its pool makes callers wait for
    a free connection (up to ``_POOL_SIZE``) instead of failing with "Too many
    connections" when many coroutines use it at once."""
    opts: dict[str, Any] = {
        "decode_responses": True,
        "max_connections": _POOL_SIZE,
        "timeout": _POOL_WAIT,
        # After a Redis restart every pooled connection is dead, and each would fail
        # one command before the pool noticed: retry once, on a fresh connection.
        "retry": Retry(NoBackoff(), 1),
        "retry_on_error": [RedisConnectionError],
        "socket_connect_timeout": 10.0,
        # Idle pooled connections are pinged before use after this long.
        "health_check_interval": 30.0,
        **_keepalive(),
    }
    kw = dict(kwargs)
    if kw.get("socket_keepalive") is False:
        opts.pop("socket_keepalive_options")
    if url and url.startswith("unix:"):
        # A Unix socket has no TCP keepalive: redis-py's socket connection refuses it.
        if kw.get("socket_keepalive"):
            raise ConfigError(
                f"socket_keepalive is for TCP; the Unix socket URL {redact_url(url)!r} "
                "takes none: remove it from config/redis.py"
            )
        opts.pop("socket_keepalive", None)
        opts.pop("socket_keepalive_options", None)
        kw.pop("socket_keepalive", None)
    opts.update(kw)
    opts["redis_connect_func"] = _on_connect
    if url:
        problem = redis_url_problem(url)
        if problem is not None:
            raise ConfigError(problem)
        try:
            pool = aioredis.BlockingConnectionPool.from_url(url, **opts)
        except ValueError as e:  # a bad port or scheme: one line, without the password
            raise ConfigError(
                f"bad Redis URL {redact_url(url)!r}: {redact_text(str(e), url)}"
            ) from None
    else:
        if opts.pop("ssl", False):
            opts["connection_class"] = aioredis.SSLConnection
        pool = aioredis.BlockingConnectionPool(**opts)
    return aioredis.Redis.from_pool(pool)


async def _on_connect(conn: AbstractConnection) -> None:
    """redis-py's own connection setup, with a database the server lacks said as one
    line (its ResponseError surfaced at the first command, as a traceback)."""
    try:
        await conn.on_connect()
    except ResponseError as e:
        where = (
            conn.path
            if isinstance(conn, aioredis.UnixDomainSocketConnection)
            else f"{conn.host}:{conn.port}"
            if isinstance(conn, aioredis.Connection)
            else "the server"
        )
        bad_db = db_index_error(e, conn.db, where)
        if bad_db is None:
            raise
        await conn.disconnect()
        raise bad_db from None


def db_index_error(e: ResponseError, db: object, address: str) -> ConfigError | None:
    """The one line for SELECT of a database ``address`` does not have, else None."""
    if "DB index" not in str(e):
        return None
    return ConfigError(
        f"Redis at {address} has no database {db} ({str(e).removeprefix('ERR ')}): use "
        "one it has (0 to 15 unless its `databases` setting says more) in the URL or db "
        "of config/redis.py"
    )


def _ms(ttl: float) -> int:
    return max(1, round(ttl * 1000))


def _load(raw: str | bytes | None) -> Any | None:
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw  # written by something else than haze: hand back the text


class _Conn:
    """One client (and its scripts) per event loop: redis-py clients are loop-bound."""

    __slots__ = (
        "add_listed",
        "client",
        "delete_owner",
        "increment",
        "settle_batch",
        "subscriptions",
        "touch_owner",
    )

    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client
        self.subscriptions = 0
        self.increment: AsyncScript = client.register_script(
            (_HERE / "redis_increment.lua").read_text()
        )
        self.delete_owner: AsyncScript = client.register_script(
            (_HERE / "redis_delete_owner.lua").read_text()
        )
        self.settle_batch: AsyncScript = client.register_script(
            (_HERE / "redis_settle_batch.lua").read_text()
        )
        self.touch_owner: AsyncScript = client.register_script(
            (_HERE / "redis_touch_owner.lua").read_text()
        )
        self.add_listed: AsyncScript = client.register_script(
            (_HERE / "redis_add_listed.lua").read_text()
        )


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _reachable(
    op: Callable[Concatenate[RedisStore, _P], Coroutine[Any, Any, _R]],
) -> Callable[Concatenate[RedisStore, _P], Coroutine[Any, Any, _R]]:
    """redis-py's connection errors as a one-line ``BackendUnavailableError``: the
    engine tells "the store is down" from a failure by that type (a unique lock whose
    SET lost its reply is released, and its release is asked again while the store
    cannot take it), not by the client library's classes."""

    @functools.wraps(op)
    async def call(self: RedisStore, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return await op(self, *args, **kwargs)
        except (RedisConnectionError, RedisTimeoutError) as e:
            reason = (str(e).strip().splitlines() or [""])[0]
            raise BackendUnavailableError(
                f"store {self.name!r} is unavailable ({type(e).__name__}: {reason}); check "
                "that its Redis server is running and reachable, and the connection's settings"
            ) from None

    return call


class RedisStore:
    """Atomic and shared by every process that uses the same Redis connection."""

    #: the config options it takes besides ``driver`` (``DeclaresOptions``)
    options: ClassVar[Mapping[str, str]] = {"connection": "str", "prefix": "str"}
    _workflow_state: KeyValueWorkflowState | None = None
    atomic = True
    shared = True

    def __init__(self, name: str, options: dict[str, Any], app: Any = None):
        self.name = name
        self._url, self._kwargs, key_prefix = redis_settings(
            app,
            options.get("connection"),
            options.get("url"),
            where=f"stores.{name}.connection",
            source=getattr(getattr(app, "cache_config", None), "source", None),
        )
        self.prefix = key_prefix + str(options.get("prefix") or "")
        self._conns: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Conn] = (
            weakref.WeakKeyDictionary()
        )

    def _conn(self) -> _Conn:
        loop = asyncio.get_running_loop()
        conn = self._conns.get(loop)
        if conn is None:
            conn = self._conns[loop] = _Conn(new_client(self._url, self._kwargs))
        return conn

    def workflow_state(self) -> KeyValueWorkflowState:
        """Workflow runs kept in this store (``HasWorkflowState``)."""
        if self._workflow_state is None:
            self._workflow_state = KeyValueWorkflowState(self)
        return self._workflow_state

    @_reachable
    async def get(self, key: str) -> Any | None:
        return _load(await self._conn().client.get(self.prefix + key))

    @_reachable
    async def get_many(self, keys: Sequence[str]) -> list[Any | None]:
        if not keys:
            return []
        raw = await self._conn().client.mget([self.prefix + k for k in keys])
        return [_load(r) for r in raw]

    @_reachable
    async def put(self, key: str, value: Any, ttl: float | None = None) -> None:
        px = None if ttl is None else _ms(ttl)
        await self._conn().client.set(self.prefix + key, _dumps(value), px=px)

    @_reachable
    async def add(self, key: str, value: Any, ttl: float | None = None) -> bool:
        px = None if ttl is None else _ms(ttl)
        return bool(await self._conn().client.set(self.prefix + key, _dumps(value), nx=True, px=px))

    @_reachable
    async def add_listed(self, key: str, value: Any, counter: str, listed: Any) -> bool:
        """``AddsListed`` in one script: SET NX, then INCR and SET of the listing."""
        keys = [self.prefix + key, self.prefix + counter]
        added = await self._conn().add_listed(keys=keys, args=[_dumps(value), _dumps(listed)])
        return bool(added)

    @_reachable
    async def increment(self, key: str, by: int = 1, ttl: float | None = None) -> int:
        conn = self._conn()
        ttl_arg = "" if ttl is None else _ms(ttl)
        return int(await conn.increment(keys=[self.prefix + key], args=[int(by), ttl_arg]))

    @_reachable
    async def delete(self, key: str, owner: Any | None = None) -> bool:
        conn = self._conn()
        if owner is None:
            return bool(await conn.client.delete(self.prefix + key))
        return bool(await conn.delete_owner(keys=[self.prefix + key], args=[_dumps(owner)]))

    @_reachable
    async def ttl(self, key: str) -> float | None:
        ms = int(await self._conn().client.pttl(self.prefix + key))
        return None if ms < 0 else ms / 1000

    @_reachable
    async def touch(self, key: str, owner: Any, ttl: float) -> bool:
        conn = self._conn()
        return bool(
            await conn.touch_owner(keys=[self.prefix + key], args=[_dumps(owner), _ms(ttl)])
        )

    @_reachable
    async def settle_batch_job(
        self,
        batch: str,
        job: str,
        outcome: str,
        *,
        count: int = 1,
        cancel: bool = False,
        now: float = 0.0,
        ttl: float | None = None,
        keep: int = 0,
    ) -> BatchSettled:
        b = self.prefix + batch
        keys = [f"{b}:done:{job}", f"{b}:processed", f"{b}:failed", f"{b}:pending"]
        keys += [f"{b}:cancelled", f"{b}:recovered", f"{b}:recovered:{job}"]
        args: list[str | int] = [_dumps(outcome), int(count), "" if ttl is None else _ms(ttl)]
        args.append(int(cancel))
        args += [_dumps(now), f"{b}:failed:", _dumps(job), int(keep)]
        keys.append(f"{b}:jobs")
        counted, pending, first = await self._conn().settle_batch(keys=keys, args=args)
        return BatchSettled(bool(counted), int(pending), str(_load(first)))

    @_reachable
    async def notify(self, channel: str, message: str) -> None:
        await self._conn().client.publish(self.prefix + channel, message)

    @contextlib.asynccontextmanager
    async def subscribe(self, channel: str) -> AsyncIterator[Subscription]:
        conn = self._conn()
        if conn.subscriptions >= _MAX_SUBSCRIPTIONS:
            raise RuntimeError(f"{_MAX_SUBSCRIPTIONS} subscriptions open already")
        conn.subscriptions += 1
        pubsub = conn.client.pubsub()
        try:
            await pubsub.subscribe(self.prefix + channel)
            # SUBSCRIBE goes on its own connection: a read on another one may be served
            # first. Its confirmation says Redis listens, so a PUBLISH from now on arrives.
            loop = asyncio.get_running_loop()
            deadline = loop.time() + _POOL_WAIT
            while True:
                left = deadline - loop.time()
                if left <= 0:
                    raise TimeoutError(f"Redis did not confirm SUBSCRIBE {channel!r}")
                reply = await pubsub.get_message(timeout=min(left, 1.0))
                if reply is not None and reply.get("type") == "subscribe":
                    break
            yield _RedisSubscription(pubsub)
        finally:
            conn.subscriptions -= 1
            with contextlib.suppress(Exception):
                await pubsub.aclose()  # type: ignore[no-untyped-call]

    async def close(self) -> None:
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:  # pragma: no cover
            loop = None
        conns = list(self._conns.items())
        self._conns.clear()
        for conn_loop, conn in conns:
            if conn_loop is loop:
                await conn.client.aclose()
            elif conn_loop.is_running() and not conn_loop.is_closed():
                asyncio.run_coroutine_threadsafe(conn.client.aclose(), conn_loop)


class _RedisSubscription:
    __slots__ = ("_pubsub",)

    def __init__(self, pubsub: Any) -> None:
        self._pubsub = pubsub

    async def receive(self, timeout: float) -> str | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            left = deadline - loop.time()
            if left <= 0:
                return None
            try:
                # get_message's own timeout: nothing is cancelled mid-read.
                reply = await self._pubsub.get_message(ignore_subscribe_messages=True, timeout=left)
            except (RedisConnectionError, OSError):
                # A message may have been lost with the connection: the caller reads the
                # record now (and sees the outage there, if it lasts).
                await asyncio.sleep(min(left, 0.5))
                return ""
            if reply is not None and reply.get("type") == "message":
                return str(reply["data"])
