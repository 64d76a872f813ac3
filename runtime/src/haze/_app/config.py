"""Configuration: ``define_*_config`` helpers, ``env()`` and validation.

A ``define_*_config`` call only records the raw mapping and where it was written;
the app validates it at start, so every error can name the file and the key::

    # config/queue.py
    from haze import define_queue_config, env
    config = define_queue_config(default=env("QUEUE_CONNECTION", "memory"),
                                 connections={"memory": {"driver": "memory", "concurrency": 2}})
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

from haze._kernel.durations import parse_duration
from haze._kernel.errors import ConfigError
from haze._kernel.hints import did_you_mean
from haze._kernel.message import redis_key_part_error
from haze.contracts.driver import DeclaresOptions
from haze.drivers import driver_class
from haze.stores import store_class

__all__ = [
    "CacheConfig",
    "ConfigSpec",
    "DatabaseConfig",
    "HazeConfig",
    "QueueConfig",
    "RedisConfig",
    "define_cache_config",
    "define_database_config",
    "define_haze_config",
    "define_queue_config",
    "define_redis_config",
    "env",
]

T = TypeVar("T")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


#: Where ``env()`` looks before ``os.environ`` in this context: a Cloudflare Worker's
#: ``env`` (vars and secrets) during one invocation (``env_source``).
_source: ContextVar[Callable[[str], str | None] | None] = ContextVar(
    "haze_env_source", default=None
)


@contextmanager
def env_source(lookup: Callable[[str], str | None]) -> Iterator[None]:
    """Make ``env()`` read ``lookup(name)`` first (``None``: not there, ``os.environ`` is
    asked) inside this block, and in the tasks started in it, only.

    A Python Worker's vars and secrets are not in ``os.environ``: they arrive with each
    invocation. ``haze_cloudflare.QueueWorker`` wraps every invocation in this, so the
    config files (read when the app boots, in the first invocation) and the jobs see
    them; two invocations running at once each see their own, and nothing is written
    to ``os.environ``.

    >>> with env_source({"QUEUE_CONNECTION": "cloudflare"}.get):
    ...     env("QUEUE_CONNECTION", "memory")
    'cloudflare'
    """
    token = _source.set(lookup)
    try:
        yield
    finally:
        _source.reset(token)


def read_env(name: str) -> str | None:
    """The raw value of variable ``name``: the context's source (``env_source``) first,
    then ``os.environ``; ``None`` when neither has it."""
    lookup = _source.get()
    if lookup is not None:
        value = lookup(name)
        if value is not None:
            return value
    return os.environ.get(name)


@overload
def env(name: str) -> str | None: ...
@overload
def env(name: str, default: T) -> str | T: ...
def env(name: str, default: object = None) -> object:
    """Read an environment variable, cast to the type of ``default`` when it is a bool/int/float.

    Inside a Cloudflare Worker it reads the Worker's vars and secrets (see ``env_source``).

    >>> env("QUEUE_CONNECTION", "memory")
    'memory'
    """
    raw = read_env(name)
    if raw is None:
        return default
    if isinstance(default, bool):
        low = raw.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise ConfigError(f"expected a boolean (true/false), got {raw!r}", key=f"env {name}")
    if isinstance(default, int):
        try:
            return int(raw)
        except ValueError:
            raise ConfigError(f"expected an integer, got {raw!r}", key=f"env {name}") from None
    if isinstance(default, float):
        try:
            return float(raw)
        except ValueError:
            raise ConfigError(f"expected a number, got {raw!r}", key=f"env {name}") from None
    return EnvValue(raw, name)


class EnvValue(str):
    """A string read by :func:`env`: it remembers its variable, so a bad value is
    reported against the variable it came from, not only the config key."""

    variable: str

    def __new__(cls, value: str, variable: str) -> EnvValue:
        self = super().__new__(cls, value)
        self.variable = variable
        return self


def _origin(value: object) -> str:
    """`` (from the environment variable X)`` for a value :func:`env` read, else ``""``."""
    return (
        f" (from the environment variable {value.variable})" if isinstance(value, EnvValue) else ""
    )


@dataclass
class ConfigSpec:
    """A raw config mapping plus the place it was defined (file:line)."""

    kind: str
    raw: dict[str, Any]
    source: str

    def __repr__(self) -> str:
        return f"<{self.kind} config from {self.source}>"


def _caller_source(depth: int = 2) -> str:
    try:
        frame = sys._getframe(depth)
    except ValueError:  # pragma: no cover - no such frame
        return "<unknown>"
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


def define_queue_config(
    *,
    default: str | None = None,
    connections: Mapping[str, Mapping[str, Any]] | None = None,
    store: str | None = None,
    batches: Mapping[str, Any] | None = None,
    middleware: list[Any] | None = None,
    run_in_server: bool | Mapping[str, Any] = False,
    **extra: Any,
) -> ConfigSpec:
    """Describe ``config/queue.py``: connections, the lock store, batches, global middleware.

    >>> config = define_queue_config(default="memory",
    ...     connections={"memory": {"driver": "memory", "concurrency": 2}})
    """
    raw: dict[str, Any] = {
        "default": default,
        "connections": connections,
        "store": store,
        "batches": batches,
        "middleware": middleware,
        "run_in_server": run_in_server,
    }
    raw.update(extra)
    return ConfigSpec("queue", raw, _caller_source())


def define_cache_config(
    *,
    default: str | None = None,
    stores: Mapping[str, Mapping[str, Any]] | None = None,
    **extra: Any,
) -> ConfigSpec:
    """Describe ``config/cache.py``: the stores that hold locks, middleware state and batches."""
    return ConfigSpec("cache", {"default": default, "stores": stores, **extra}, _caller_source())


def define_redis_config(
    *,
    default: str | None = None,
    connections: Mapping[str, Mapping[str, Any]] | None = None,
    **extra: Any,
) -> ConfigSpec:
    """Describe ``config/redis.py``: named Redis connections (``url``, ``key_prefix``)."""
    raw = {"default": default, "connections": connections, **extra}
    return ConfigSpec("redis", raw, _caller_source())


def define_database_config(
    *,
    default: str | None = None,
    connections: Mapping[str, Mapping[str, Any]] | None = None,
    **extra: Any,
) -> ConfigSpec:
    """Describe ``config/database.py``: named SQL connections by URL."""
    raw = {"default": default, "connections": connections, **extra}
    return ConfigSpec("database", raw, _caller_source())


def define_haze_config(*, cloudflare: Mapping[str, Any] | None = None, **extra: Any) -> ConfigSpec:
    """Describe ``haze.config.py``: build settings (e.g. the ``cloudflare.wrangler`` section)."""
    return ConfigSpec("haze", {"cloudflare": cloudflare, **extra}, _caller_source())


# --------------------------------------------------------------------------- validation

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_NAME = re.compile(r"^[A-Za-z0-9_.:\-]{1,200}$")
_QUEUE = re.compile(r"^[A-Za-z0-9_.:\-]{1,255}$")
#: The longest queue connection name (failed jobs keep it in every store).
MAX_CONNECTION_NAME = 64


class _V:
    """Small validators; each raises ConfigError naming source and key."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, key: str, message: str) -> ConfigError:
        return ConfigError(message, source=self.source, key=key)

    def mapping(self, value: object, key: str, *, required: bool = False) -> dict[str, Any]:
        if value is None:
            if required:
                raise self.fail(key, "is required (a dict)")
            return {}
        if not isinstance(value, Mapping):
            raise self.fail(key, f"expected a dict, got {type(value).__name__} {value!r}")
        for k in value:
            if not isinstance(k, str):
                raise self.fail(key, f"keys must be strings, got {k!r}")
        return dict(value)

    def string(self, value: object, key: str, *, required: bool = False) -> str | None:
        if value is None:
            if required:
                raise self.fail(key, "is required (a string)")
            return None
        if not isinstance(value, str) or not value:
            raise self.fail(key, f"expected a non-empty string, got {value!r}{_origin(value)}")
        return value

    def name(self, value: object, key: str) -> str:
        s = self.string(value, key, required=True)
        assert s is not None
        if not _NAME.match(s):
            raise self.fail(key, f"{s!r} is not a valid name (letters, digits, _ . : -)")
        return s

    def identifier(self, value: object, key: str) -> str:
        s = self.string(value, key, required=True)
        assert s is not None
        if not _IDENT.match(s):
            raise self.fail(
                key, f"{s!r} is not a valid SQL identifier (letters, digits and _, max 63 chars)"
            )
        return s

    def integer(self, value: object, key: str, *, minimum: int = 0) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, f"expected an integer, got {value!r}")
        if value < minimum:
            raise self.fail(key, f"must be >= {minimum}, got {value}")
        return value

    def boolean(self, value: object, key: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(key, f"expected true or false, got {value!r}")
        return value

    def duration(self, value: object, key: str, *, allow_zero: bool = True) -> float:
        try:
            return parse_duration(value, key, allow_zero=allow_zero)
        except ValueError as e:
            raise self.fail(key, str(e).split(": ", 1)[-1]) from None

    def queue_names(self, value: object, key: str) -> list[str]:
        """Queue names: the characters of ``names``, 1 to 255 of them (what every driver
        stores). The dict form (``{"emails": {"concurrency": 5}}``) gives its keys, in
        order; ``queue_limits`` reads its values."""
        if isinstance(value, str):
            value = [value]
        mapping = isinstance(value, Mapping)
        if not (mapping or isinstance(value, (list, tuple))) or not value:
            raise self.fail(
                key,
                "expected a non-empty list of queue names, or a dict of queue name to "
                f"options ({{'emails': {{'concurrency': 5}}}}), got {value!r}",
            )
        assert isinstance(value, (Mapping, list, tuple))
        for i, q in enumerate(value):
            where = f"{key}.{q}" if mapping else f"{key}[{i}]"
            if isinstance(q, str) and len(q) > 255:
                raise self.fail(where, f"a queue name has 1 to 255 characters, got {len(q)}")
            if not isinstance(q, str) or not _QUEUE.match(q):
                raise self.fail(
                    where, f"{q!r} is not a valid queue name (letters, digits, _ . : -)"
                )
        return list(value)

    def queue_limits(self, value: object, key: str) -> dict[str, dict[str, float]]:
        """The concurrency limits of the dict form of a connection's ``queues``:
        queue -> ``{"max", "release_after", "expire_after"}``; queues without one are left
        out."""
        if not isinstance(value, Mapping):
            return {}
        out: dict[str, dict[str, float]] = {}
        for q, raw in value.items():
            sub = f"{key}.{q}"
            opts = self.mapping(raw, sub)
            self.unknown(opts, set(_QUEUE_LIMIT_DEFAULTS) | {"concurrency"}, sub)
            if opts.get("concurrency") is None:
                if opts:
                    raise self.fail(
                        f"{sub}.concurrency",
                        "is required with release_after or "
                        "expire_after (the most jobs of this queue running at once)",
                    )
                continue
            limit: dict[str, float] = {
                "max": self.integer(opts["concurrency"], f"{sub}.concurrency", minimum=1)
            }
            for name, default in _QUEUE_LIMIT_DEFAULTS.items():
                given = opts.get(name)
                limit[name] = (
                    default
                    if given is None
                    else self.duration(given, f"{sub}.{name}", allow_zero=name == "release_after")
                )
            out[q] = limit
        return out

    def names(self, value: object, key: str) -> list[str]:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, (list, tuple)) or not value:
            raise self.fail(key, f"expected a non-empty list of names, got {value!r}")
        return [self.name(v, f"{key}[{i}]") for i, v in enumerate(value)]

    def unknown(self, raw: Mapping[str, Any], allowed: set[str], key: str) -> None:
        for k in raw:
            if k not in allowed:
                hint = ", ".join(sorted(allowed))
                raise self.fail(f"{key}.{k}", f"unknown option; allowed here: {hint}")


#: A per-queue concurrency limit's other options (``"queues": {"emails": {"concurrency":
#: 5}}``): the released job's wait, and the lease after which a crashed worker's slot
#: frees itself (renewed while the job runs, so a short lease costs a renewal per third).
_QUEUE_LIMIT_DEFAULTS = {"release_after": 1.0, "expire_after": 60.0}

# Per-driver options. The value is the validator kind; drivers read the
# validated dict. A later driver adds its row here and nothing else changes.
_COMMON = {"driver": "str", "max_message_size": "int", "concurrency": "int", "queues": "queues"}
QUEUE_DRIVER_OPTIONS: dict[str, dict[str, str]] = {
    "sync": {"driver": "str", "max_message_size": "int"},
    "memory": dict(_COMMON),
    "redis": {
        **_COMMON,
        "connection": "str",
        "url": "str",
        "prefix": "str",
        "keep_completed": "int",
        "keep_failed": "int",
        "retry_after": "duration",
    },
    "database": {
        **_COMMON,
        "connection": "str",
        "table": "ident",
        "failed_table": "ident",
        "retry_after": "duration",
        "sleep": "duration",
        "max_sleep": "duration",
    },
    "cloudflare": {
        **_COMMON,
        "binding": "str",
        "account_id": "str",
        "queue_id": "str",
        "api_token": "str",
        "api_url": "str",
        "failed_store": "str",
        "visibility_timeout": "duration",
    },
    "sqs": {
        **_COMMON,
        "queue_url": "str",
        "region": "str",
        "endpoint_url": "str",
        "failed_store": "str",
        "retry_after": "duration",
        "wait_time": "duration",
        "fifo": "bool",
        "credentials": "dict",
    },
    "failover": {"driver": "str", "connections": "names"},
}

CACHE_DRIVER_OPTIONS: dict[str, dict[str, str]] = {
    "memory": {"driver": "str"},
    "redis": {"driver": "str", "connection": "str", "prefix": "str"},
    "database": {"driver": "str", "connection": "str", "table": "ident"},
    "kv": {"driver": "str", "binding": "str", "prefix": "str"},
}


def _plugin_schema(
    v: _V,
    driver: str,
    built_in: dict[str, dict[str, str]],
    common: dict[str, str],
    key: str,
    lookup: Callable[..., Any],
) -> dict[str, str]:
    """The options ``driver`` takes: its built-in table, else those of the plugin class
    ``lookup`` (``driver_class``/``store_class``) finds under that name, which also
    refuses a name nothing provides."""
    if driver in built_in:
        return built_in[driver]
    found = lookup(driver, source=v.source, key=f"{key}.driver")
    declared = found.options if isinstance(found, DeclaresOptions) else {}
    return {**common, **declared}


def _check_options(v: _V, raw: dict[str, Any], schema: dict[str, str], key: str) -> dict[str, Any]:
    v.unknown(raw, set(schema), key)
    out: dict[str, Any] = {}
    for k, value in raw.items():
        kind = schema[k]
        sub = f"{key}.{k}"
        if value is None:
            out[k] = None
            continue
        if kind == "str":
            out[k] = v.string(value, sub)
        elif kind == "int":
            out[k] = v.integer(value, sub, minimum=1)
        elif kind == "names":
            out[k] = v.names(value, sub)
        elif kind == "queues":
            out[k] = v.queue_names(value, sub)
        elif kind == "duration":
            out[k] = v.duration(value, sub)
        elif kind == "ident":
            out[k] = v.identifier(value, sub)
        elif kind == "bool":
            out[k] = v.boolean(value, sub)
        elif kind == "dict":
            out[k] = v.mapping(value, sub)
        else:  # pragma: no cover - schema typo
            raise AssertionError(kind)
    return out


@dataclass
class QueueConfig:
    default: str
    connections: dict[str, dict[str, Any]]
    store: str | None
    batches_store: str | None
    batches_ttl: float
    middleware: list[Callable[..., Any]]
    run_in_server: dict[str, Any] | None
    source: str = "<default>"
    #: OpenTelemetry: True, False, or "auto" (on when the app has set an SDK provider).
    telemetry: bool | str = "auto"
    #: connection -> queue -> ``{"max", "release_after", "expire_after"}``, from the dict
    #: form of a connection's ``queues``; enforced by ``middleware.queue_limits``.
    queue_limits: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    #: Keep a status record for every job that does not say ``track=False``
    #: (``Queue.status``/``wait``); ``keep_result``: also keep results that long.
    track: bool = False
    keep_result: float | None = None


@dataclass
class CacheConfig:
    default: str
    stores: dict[str, dict[str, Any]]
    source: str = "<default>"
    #: ``default=`` was given: it then names the lock and batch store (see App.queue_store).
    default_named: bool = False


@dataclass
class RedisConfig:
    default: str
    connections: dict[str, dict[str, Any]]
    source: str = "<default>"


@dataclass
class DatabaseConfig:
    default: str
    connections: dict[str, dict[str, Any]]
    source: str = "<default>"


@dataclass
class HazeConfig:
    cloudflare: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)
    source: str = "<default>"


def _expect_kind(spec: object, kind: str, source: str) -> ConfigSpec:
    if not isinstance(spec, ConfigSpec):
        raise ConfigError(
            f"expected the result of define_{kind}_config(...), got {type(spec).__name__}",
            source=source,
            key="config",
        )
    if spec.kind != kind:
        raise ConfigError(
            f"expected define_{kind}_config(...), got define_{spec.kind}_config(...)",
            source=source,
            key="config",
        )
    return spec


def validate_queue(spec: object, source: str | None = None) -> QueueConfig:
    if spec is None:
        return QueueConfig(
            default="memory",
            connections={"memory": {"driver": "memory"}},
            store=None,
            batches_store=None,
            batches_ttl=7 * 86400.0,
            middleware=[],
            run_in_server=None,
        )
    src: str = source or str(getattr(spec, "source", "<config>"))
    s = _expect_kind(spec, "queue", src)
    v = _V(src)
    raw = s.raw
    v.unknown(raw, _QUEUE_KEYS, "queue")
    connections, queue_limits = _queue_connections(v, raw)
    _check_connection_links(v, connections)
    default = _queue_default(v, raw, connections)
    store = v.string(raw.get("store"), "store")
    batches = v.mapping(raw.get("batches"), "batches")
    v.unknown(batches, {"store", "ttl"}, "batches")
    batches_store = v.string(batches.get("store"), "batches.store")
    ttl = v.duration(batches.get("ttl", "7d"), "batches.ttl", allow_zero=False)
    middleware = _queue_middleware(v, raw)
    run_in_server = _run_in_server(v, raw.get("run_in_server", False), connections)
    telemetry = raw.get("telemetry", "auto")
    if not (telemetry is True or telemetry is False or telemetry == "auto"):
        raise v.fail("telemetry", f'expected True, False or "auto", got {telemetry!r}')
    track = v.boolean(raw.get("track", False), "track")
    keep_result = (
        None
        if raw.get("keep_result") is None
        else v.duration(raw["keep_result"], "keep_result", allow_zero=False)
    )
    return QueueConfig(
        track=bool(track),
        keep_result=keep_result,
        default=default,
        connections=connections,
        store=store,
        batches_store=batches_store,
        batches_ttl=ttl,
        middleware=middleware,
        run_in_server=run_in_server,
        source=src,
        telemetry=telemetry,
        queue_limits=queue_limits,
    )


_QUEUE_KEYS = {
    "default",
    "connections",
    "store",
    "batches",
    "middleware",
    "run_in_server",
    "telemetry",
    "track",
    "keep_result",
}


def _queue_connections(
    v: _V, raw: Mapping[str, Any]
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, dict[str, float]]]]:
    """Each connection's checked options, and the per-queue limits of those that set any."""
    conns_raw = v.mapping(raw.get("connections"), "connections")
    if not conns_raw:
        conns_raw = {"memory": {"driver": "memory"}}
    connections: dict[str, dict[str, Any]] = {}
    queue_limits: dict[str, dict[str, dict[str, float]]] = {}
    for name, c in conns_raw.items():
        key = f"connections.{name}"
        v.name(name, key)
        if len(name) > MAX_CONNECTION_NAME:
            # Failed jobs record it (a VARCHAR(191) column on MySQL): never let a store cut it.
            raise v.fail(
                key,
                f"a queue connection name has 1 to {MAX_CONNECTION_NAME} characters, "
                f"got {len(name)}; choose a shorter name",
            )
        c = v.mapping(c, key, required=True)
        driver = v.string(c.get("driver"), f"{key}.driver", required=True)
        engine = _workflow_engine(v, c.pop("workflows", None), driver or "", key)
        schema = _plugin_schema(v, driver or "", QUEUE_DRIVER_OPTIONS, _COMMON, key, driver_class)
        connections[name] = _check_options(v, c, schema, key)
        if driver in NATIVE_WORKFLOW_DRIVERS:
            connections[name]["workflows"] = engine
        limits = v.queue_limits(c.get("queues"), f"{key}.queues")
        if limits:
            queue_limits[name] = limits
    return connections, queue_limits


#: The drivers whose platform runs durable workflows itself (``"workflows": "native"``):
#: Cloudflare Workflows and Lambda durable functions.
NATIVE_WORKFLOW_DRIVERS = ("cloudflare", "sqs")


def _workflow_engine(v: _V, value: object, driver: str, key: str) -> str:
    """A connection's workflow engine: ``"store"`` (haze's own, the default) or
    ``"native"`` (the platform's, only where it has one)."""
    if value is None or value == "store":
        return "store"
    if value != "native":
        raise v.fail(f"{key}.workflows", f'expected "store" or "native", got {value!r}')
    if driver not in NATIVE_WORKFLOW_DRIVERS:
        raise v.fail(
            f"{key}.workflows",
            f'"native" needs a platform with its own workflow engine (the cloudflare or '
            f'sqs driver), not {driver!r}; use "store" (the default: haze\'s own engine)',
        )
    return "native"


def _check_connection_links(v: _V, connections: dict[str, dict[str, Any]]) -> None:
    """What one connection's options can only be checked against the others (failover)."""
    for name, c in connections.items():
        if c["driver"] == "failover":
            members = c.get("connections") or []
            if not members:
                raise v.fail(f"connections.{name}.connections", "is required for failover")
            for m in members:
                if m not in connections or m == name:
                    raise v.fail(f"connections.{name}.connections", f"unknown connection {m!r}")
                if connections[m]["driver"] == "failover":
                    raise v.fail(
                        f"connections.{name}.connections",
                        f"{m!r} is a failover connection itself; list the real connections",
                    )
        if c["driver"] == "sqs" and not c.get("queue_url"):
            raise v.fail(f"connections.{name}.queue_url", "is required for the sqs driver")
        if c["driver"] == "redis":
            named = [("prefix", "a key prefix", c.get("prefix") or "")]
            named += [("queues", "a queue name", q) for q in c.get("queues") or ()]
            for key, what, value in named:
                if ":" in value:
                    raise v.fail(f"connections.{name}.{key}", redis_key_part_error(what, value))


def _queue_default(v: _V, raw: Mapping[str, Any], connections: dict[str, dict[str, Any]]) -> str:
    default = raw.get("default")
    if default is None:
        default = next(iter(connections))
    default = v.string(default, "default", required=True)
    if default not in connections:
        raise v.fail(
            "default",
            f"{str(default)!r}{_origin(default)} is not one of the connections: "
            f"{', '.join(connections)}{did_you_mean(str(default), connections)}",
        )
    return str(default)


def _queue_middleware(v: _V, raw: Mapping[str, Any]) -> list[Any]:
    middleware = raw.get("middleware") or []
    if not isinstance(middleware, (list, tuple)):
        raise v.fail("middleware", f"expected a list of middleware, got {middleware!r}")
    for i, mw in enumerate(middleware):
        if not callable(mw):
            raise v.fail(f"middleware[{i}]", f"expected a callable middleware, got {mw!r}")
    return list(middleware)


def _run_in_server(
    v: _V, ris: object, connections: dict[str, dict[str, Any]]
) -> dict[str, Any] | None:
    """``run_in_server``: False/None is off, True is the defaults, a mapping is checked."""
    if ris is False or ris is None:
        return None
    if ris is True:
        return {}
    run_in_server = v.mapping(ris, "run_in_server")
    v.unknown(run_in_server, {"connection", "queues", "concurrency"}, "run_in_server")
    if "connection" in run_in_server:
        c_name = v.string(run_in_server["connection"], "run_in_server.connection")
        if c_name not in connections:
            raise v.fail("run_in_server.connection", f"unknown connection {c_name!r}")
    if "queues" in run_in_server:
        run_in_server["queues"] = v.names(run_in_server["queues"], "run_in_server.queues")
    if "concurrency" in run_in_server:
        v.integer(run_in_server["concurrency"], "run_in_server.concurrency", minimum=1)
    return run_in_server


def _validate_named(
    spec: object,
    kind: str,
    section: str,
    source: str | None,
    fallback: dict[str, dict[str, Any]],
    check: Callable[[_V, str, dict[str, Any]], dict[str, Any]],
) -> tuple[str, dict[str, dict[str, Any]], str]:
    if spec is None:
        return next(iter(fallback)), fallback, "<default>"
    src: str = source or str(getattr(spec, "source", "<config>"))
    s = _expect_kind(spec, kind, src)
    v = _V(src)
    v.unknown(s.raw, {"default", section}, kind)
    items_raw = v.mapping(s.raw.get(section), section)
    if not items_raw:
        items_raw = dict(fallback)
    items: dict[str, dict[str, Any]] = {}
    for name, c in items_raw.items():
        key = f"{section}.{name}"
        v.name(name, key)
        items[name] = check(v, key, v.mapping(c, key, required=True))
    default = s.raw.get("default") or next(iter(items))
    default = v.string(default, "default", required=True)
    if default not in items:
        raise v.fail(
            "default",
            f"{str(default)!r}{_origin(default)} is not one of the {section}: "
            f"{', '.join(items)}{did_you_mean(str(default), items)}",
        )
    return default, items, src


def validate_cache(spec: object, source: str | None = None) -> CacheConfig:
    def check(v: _V, key: str, c: dict[str, Any]) -> dict[str, Any]:
        driver = v.string(c.get("driver"), f"{key}.driver", required=True)
        schema = _plugin_schema(
            v, driver or "", CACHE_DRIVER_OPTIONS, {"driver": "str"}, key, store_class
        )
        return _check_options(v, c, schema, key)

    default, stores, src = _validate_named(
        spec, "cache", "stores", source, {"memory": {"driver": "memory"}}, check
    )
    named = isinstance(spec, ConfigSpec) and spec.raw.get("default") is not None
    return CacheConfig(default=default, stores=stores, source=src, default_named=named)


def validate_redis(spec: object, source: str | None = None) -> RedisConfig:
    allowed = {"url", "host", "port", "db", "username", "password", "key_prefix", "ssl"}
    allowed |= {"socket_timeout", "socket_connect_timeout", "health_check_interval"}
    allowed |= {"socket_keepalive"}

    def check(v: _V, key: str, c: dict[str, Any]) -> dict[str, Any]:
        v.unknown(c, allowed, key)
        for name in ("socket_timeout", "socket_connect_timeout", "health_check_interval"):
            if c.get(name) is not None:
                c[name] = v.duration(c[name], f"{key}.{name}", allow_zero=False)
        if c.get("socket_keepalive") is not None:
            c["socket_keepalive"] = v.boolean(c["socket_keepalive"], f"{key}.socket_keepalive")
        if "url" in c and c["url"] is not None:
            v.string(c["url"], f"{key}.url")
        if "port" in c:
            v.integer(c["port"], f"{key}.port", minimum=1)
        if "db" in c:
            v.integer(c["db"], f"{key}.db")
        if c.get("key_prefix") is not None and not isinstance(c["key_prefix"], str):
            raise v.fail(f"{key}.key_prefix", f"expected a string, got {c['key_prefix']!r}")
        return c

    default, conns, src = _validate_named(
        spec,
        "redis",
        "connections",
        source,
        {"default": {"url": env("REDIS_URL", "redis://127.0.0.1:6379/0"), "key_prefix": ""}},
        check,
    )
    return RedisConfig(default=default, connections=conns, source=src)


_DB_SCHEMES = ("sqlite", "postgresql", "postgres", "mysql", "mariadb", "libsql", "https", "http")


def validate_database(spec: object, source: str | None = None) -> DatabaseConfig:
    allowed = {"url", "auth_token", "api_token", "pool_size", "options", "busy_timeout"}

    def check(v: _V, key: str, c: dict[str, Any]) -> dict[str, Any]:
        v.unknown(c, allowed, key)
        url = v.string(c.get("url"), f"{key}.url", required=True)
        assert url is not None
        scheme = url.split(":", 1)[0].split("+", 1)[0].lower()
        if scheme not in (*_DB_SCHEMES, "d1"):
            known = ", ".join(f"{s}://" for s in (*_DB_SCHEMES, "d1"))
            raise v.fail(
                f"{key}.url",
                f"unsupported URL scheme {scheme!r}{_origin(url)}; use one of {known}",
            )
        # Checked here, not on the first connect (a str busy_timeout was a ValueError
        # from int() inside the worker, and a pool of 0 was taken in silence).
        if c.get("busy_timeout") is not None:
            v.integer(c["busy_timeout"], f"{key}.busy_timeout")
        if c.get("pool_size") is not None:
            v.integer(c["pool_size"], f"{key}.pool_size", minimum=1)
        v.mapping(c.get("options"), f"{key}.options")
        return c

    default, conns, src = _validate_named(
        spec,
        "database",
        "connections",
        source,
        {"main": {"url": env("DATABASE_URL", "sqlite:///storage/app.db")}},
        check,
    )
    return DatabaseConfig(default=default, connections=conns, source=src)


def validate_haze(spec: object, source: str | None = None) -> HazeConfig:
    if spec is None:
        return HazeConfig()
    src: str = source or str(getattr(spec, "source", "<config>"))
    s = _expect_kind(spec, "haze", src)
    v = _V(src)
    cf = v.mapping(s.raw.get("cloudflare"), "cloudflare")
    return HazeConfig(cloudflare=cf, raw=dict(s.raw), source=src)
