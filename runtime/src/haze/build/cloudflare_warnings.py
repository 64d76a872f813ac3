"""What in an app's config cannot work inside a Cloudflare Worker: the build warns when
the default connection, the lock/batch store or a ``cloudflare`` connection's failed
store is a SQLite file, a TCP database or Redis, or a memory store beside a queue that
other isolates consume."""

from __future__ import annotations

from haze._app.app import App
from haze._failed.resolve import failed_target
from haze._kernel.errors import ConfigError
from haze.database import dialect_of

__all__ = ["worker_warnings"]


def _database_problem(app: App, connection: str | None) -> str | None:
    dc = app.database_config
    options = dc.connections.get(connection or dc.default)
    if options is None:
        return None
    url = str(options["url"])
    dialect = dialect_of(url)
    if dialect == "sqlite":
        return "a SQLite file (a Worker has no file system and no sqlite3)"
    if dialect in ("postgres", "mysql"):
        return f"a {dialect} server over TCP (Python Workers open no TCP sockets)"
    return None


def _store_problem(app: App, store: str) -> str | None:
    options = app.cache_config.stores.get(store) or app._derived_stores.get(store) or {}
    driver = options.get("driver")
    if driver == "memory":
        return (
            "a memory store (each isolate has its own, but every isolate consumes the "
            "queue: locks and batch counters would not be shared)"
        )
    if driver == "redis":
        return "Redis over TCP (Python Workers open no TCP sockets)"
    if driver == "database":
        return _database_problem(app, options.get("connection"))
    return None


def worker_warnings(app: App) -> list[str]:
    """What in ``app``'s config cannot work inside a Worker (see the module docstring)."""
    default = _default_connection_warning(app)
    return [
        *([default] if default is not None else []),
        *_store_warnings(app),
        *_failed_store_warnings(app),
    ]


def _default_connection_warning(app: App) -> str | None:
    default = app.queue_config.default
    options = app.queue_config.connections.get(default) or {}
    driver = options.get("driver")
    problem: str | None = None
    if driver == "database":
        problem = _database_problem(app, options.get("connection"))
    elif driver == "redis":
        problem = "Redis over TCP (Python Workers open no TCP sockets)"
    elif driver in ("memory", "sync"):
        problem = f"the {driver} driver (jobs would run only inside the isolate that dispatched)"
    if problem is None:
        return None
    return (
        f"the default connection {default!r} is {problem}: dispatch from the Worker "
        "will fail; make the cloudflare connection the default in the Worker (e.g. the "
        'var QUEUE_CONNECTION = "cloudflare" under cloudflare.wrangler.vars)'
    )


def _store_warnings(app: App) -> list[str]:
    """The lock and batch stores a Worker cannot reach."""
    try:
        lock = app._lock_store_name()
    except ConfigError as e:
        return [f"no store for locks and batches: {e}"]
    batch = app.queue_config.batches_store or lock
    stores = (("lock and batch", lock),) if batch == lock else (("lock", lock), ("batch", batch))
    warnings = []
    for what, store in stores:
        problem = _store_problem(app, store)
        if problem is not None:
            warnings.append(
                f"the {what} store {store!r} (config/queue.py store/batches) is "
                f"{problem}; use a D1 database or a KV store"
            )
    return warnings


def _failed_store_warnings(app: App) -> list[str]:
    """The cloudflare connections whose failed jobs would not be kept."""
    warnings = []
    for name, conn in app.queue_config.connections.items():
        if conn.get("driver") != "cloudflare":
            continue
        failed = conn.get("failed_store")
        if not failed:
            warnings.append(
                f"connection {name!r} has no failed_store: final failures would be kept in "
                "the isolate's memory only; set failed_store to a D1 database connection"
            )
            continue
        # Where the driver will keep them: the runtime's own resolution, precedence too.
        target = failed_target(
            str(failed), app.cache_config.stores, app.database_config.connections
        )
        if target is None:
            problem = None  # an unknown name: the connection's first use says so
        elif target[0] == "database":
            problem = _database_problem(app, target[1])
        else:
            problem = _store_problem(app, target[1])
        if problem is not None:
            warnings.append(
                f"connection {name!r}: failed_store {failed!r} is {problem}; use a D1 "
                "database connection"
            )
    return warnings
