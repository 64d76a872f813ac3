"""Each config file checked as the app reads it at start: ``validate_queue``,
``validate_cache``, ``validate_redis``, ``validate_database`` and ``validate_haze``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from haze._app.config.checks import (
    COMMON_QUEUE_OPTIONS,
    MAX_CONNECTION_NAME,
    Checks,
    check_options,
    declared_schema,
)
from haze._app.config.environment import env, origin
from haze._app.config.routes import validate_routes
from haze._app.config.schema import (
    CacheConfig,
    ConfigSpec,
    DatabaseConfig,
    HazeConfig,
    QueueConfig,
    RedisConfig,
    expect_kind,
)
from haze._base.hints import did_you_mean
from haze._base.message import redis_key_part_error
from haze._base.urls import redact_url, redis_url_problem
from haze.drivers import driver_class
from haze.stores import store_class

__all__ = [
    "validate_cache",
    "validate_database",
    "validate_haze",
    "validate_queue",
    "validate_redis",
]


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
    s = expect_kind(spec, "queue", src)
    v = Checks(src)
    raw = s.raw
    v.unknown(raw, _QUEUE_KEYS, "queue")
    connections, queue_limits = _queue_connections(v, raw)
    _check_connection_links(v, connections)
    default = _queue_default(v, raw, connections)
    routes = validate_routes(v, raw.get("routes"), connections, default)
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
        routes=routes,
    )


_QUEUE_KEYS = {
    "routes",
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
    v: Checks, raw: Mapping[str, Any]
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
        common = COMMON_QUEUE_OPTIONS
        if driver == "sync":
            # No worker consumes it (queue:work refuses it): a worker option would be ignored.
            common = {k: t for k, t in common.items() if k not in ("concurrency", "queues")}
        schema = declared_schema(v, driver or "", common, key, driver_class)
        connections[name] = c if schema is None else check_options(v, c, schema, key)
        if driver in NATIVE_WORKFLOW_DRIVERS:
            connections[name]["workflows"] = engine
        limits = v.queue_limits(c.get("queues"), f"{key}.queues")
        if limits:
            queue_limits[name] = limits
    return connections, queue_limits


#: The drivers whose platform runs durable workflows itself (``"workflows": "native"``):
#: Cloudflare Workflows and Lambda durable functions.
NATIVE_WORKFLOW_DRIVERS = ("cloudflare", "sqs")


def _workflow_engine(v: Checks, value: object, driver: str, key: str) -> str:
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


def _check_connection_links(v: Checks, connections: dict[str, dict[str, Any]]) -> None:
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


def _queue_default(
    v: Checks, raw: Mapping[str, Any], connections: dict[str, dict[str, Any]]
) -> str:
    default = raw.get("default")
    if default is None:
        default = next(iter(connections))
    default = v.string(default, "default", required=True)
    if default not in connections:
        raise v.fail(
            "default",
            f"{str(default)!r}{origin(default)} is not one of the connections: "
            f"{', '.join(connections)}{did_you_mean(str(default), connections)}",
        )
    return str(default)


def _queue_middleware(v: Checks, raw: Mapping[str, Any]) -> list[Any]:
    middleware = raw.get("middleware") or []
    if not isinstance(middleware, (list, tuple)):
        raise v.fail("middleware", f"expected a list of middleware, got {middleware!r}")
    for i, mw in enumerate(middleware):
        if not callable(mw):
            raise v.fail(f"middleware[{i}]", f"expected a callable middleware, got {mw!r}")
    return list(middleware)


def _run_in_server(
    v: Checks, ris: object, connections: dict[str, dict[str, Any]]
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
    check: Callable[[Checks, str, dict[str, Any]], dict[str, Any]],
) -> tuple[str, dict[str, dict[str, Any]], str]:
    if spec is None:
        return next(iter(fallback)), fallback, "<default>"
    src: str = source or str(getattr(spec, "source", "<config>"))
    s = expect_kind(spec, kind, src)
    v = Checks(src)
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
            f"{str(default)!r}{origin(default)} is not one of the {section}: "
            f"{', '.join(items)}{did_you_mean(str(default), items)}",
        )
    return default, items, src


def validate_cache(spec: object, source: str | None = None) -> CacheConfig:
    def check(v: Checks, key: str, c: dict[str, Any]) -> dict[str, Any]:
        driver = v.string(c.get("driver"), f"{key}.driver", required=True)
        schema = declared_schema(v, driver or "", {"driver": "str"}, key, store_class)
        return c if schema is None else check_options(v, c, schema, key)

    default, stores, src = _validate_named(
        spec, "cache", "stores", source, {"memory": {"driver": "memory"}}, check
    )
    named = isinstance(spec, ConfigSpec) and spec.raw.get("default") is not None
    return CacheConfig(default=default, stores=stores, source=src, default_named=named)


def validate_redis(spec: object, source: str | None = None) -> RedisConfig:
    allowed = {"url", "host", "port", "db", "username", "password", "key_prefix", "ssl"}
    allowed |= {"socket_timeout", "socket_connect_timeout", "health_check_interval"}
    allowed |= {"socket_keepalive"}

    def check(v: Checks, key: str, c: dict[str, Any]) -> dict[str, Any]:
        v.unknown(c, allowed, key)
        for name in ("socket_timeout", "socket_connect_timeout", "health_check_interval"):
            if c.get(name) is not None:
                c[name] = v.duration(c[name], f"{key}.{name}", allow_zero=False)
        if c.get("socket_keepalive") is not None:
            c["socket_keepalive"] = v.boolean(c["socket_keepalive"], f"{key}.socket_keepalive")
        if c.get("ssl") is not None:
            v.boolean(c["ssl"], f"{key}.ssl")
        if "url" in c and c["url"] is not None:
            v.string(c["url"], f"{key}.url")
            problem = redis_url_problem(c["url"])
            if problem is not None:
                raise v.fail(f"{key}.url", f"{problem}{origin(c['url'])}")
            if c.get("ssl") is not None:
                # redis-py's URL form takes no ssl flag (a TypeError at the first command).
                raise v.fail(
                    f"{key}.ssl",
                    "is for host/port; a url says TLS by its scheme: use rediss:// and remove ssl",
                )
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

    def check(v: Checks, key: str, c: dict[str, Any]) -> dict[str, Any]:
        v.unknown(c, allowed, key)
        url = v.string(c.get("url"), f"{key}.url", required=True)
        assert url is not None
        scheme = url.split(":", 1)[0].split("+", 1)[0].lower()
        if scheme not in (*_DB_SCHEMES, "d1"):
            known = ", ".join(f"{s}://" for s in (*_DB_SCHEMES, "d1"))
            raise v.fail(
                f"{key}.url",
                f"unsupported URL scheme {scheme!r}{origin(url)}; use one of {known}",
            )
        problem = _database_url_problem(url, scheme, c.get("options"))
        if problem is not None:
            raise v.fail(f"{key}.url", problem)
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


def _database_url_problem(url: str, scheme: str, options: object) -> str | None:
    """What makes a database URL of a known scheme unusable for haze's tables, if
    anything: said at start, in one line, not at the first statement."""
    if scheme in ("mysql", "mariadb"):
        db_option = isinstance(options, dict) and options.get("db")
        try:
            database = urlsplit(url).path.strip("/")
        except ValueError:  # the connector names what is wrong with the URL
            return None
        if not database and not db_option:
            # MySQL would take it and fail every statement ("No database selected").
            return (
                f"{redact_url(url)!r}{origin(url)} names no database; add it to the URL, such as "
                "mysql://user:password@host:3306/app"
            )
    return None


def validate_haze(spec: object, source: str | None = None) -> HazeConfig:
    if spec is None:
        return HazeConfig()
    src: str = source or str(getattr(spec, "source", "<config>"))
    s = expect_kind(spec, "haze", src)
    v = Checks(src)
    cf = v.mapping(s.raw.get("cloudflare"), "cloudflare")
    return HazeConfig(cloudflare=cf, raw=dict(s.raw), source=src)
