"""The app: config, job discovery, connections and stores, and the current-app context.

>>> app = App(queue=define_queue_config(default="memory",
...     connections={"memory": {"driver": "memory", "concurrency": 2}}))
>>> # async with app:
>>> #     await send_invoice.dispatch({"invoice_id": 1})
>>> #     await Queue.idle()
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, cast

from haze._app.config import (
    CacheConfig,
    DatabaseConfig,
    HazeConfig,
    QueueConfig,
    RedisConfig,
    read_env,
    validate_cache,
    validate_database,
    validate_haze,
    validate_queue,
    validate_redis,
)
from haze._app.discovery import _app_root, discover_jobs, load_schedules
from haze._app.discovery import _load_module_file as _load_module_file  # cli, build
from haze._app.driver_context import AppDriverContext
from haze._app.env import env_duration
from haze._base import current
from haze._base.blocking import run_blocking
from haze._base.crypto import check_keys
from haze._base.current import run_in_app
from haze._base.errors import ConfigError, MissingDependencyError
from haze._base.hints import did_you_mean
from haze._engine.manager import QueueManager
from haze._failed import failed_target
from haze._jobs.definition import registered_jobs
from haze._orchestration import batch_settle
from haze._orchestration.install import install as install_orchestration
from haze._workers.worker import Worker
from haze.connectors import Connector, connect, dialect_of
from haze.contracts.recorder import DispatchRecorder
from haze.drivers import Driver, create_driver
from haze.stores import Store, create_store

if TYPE_CHECKING:
    from haze._engine.view import EngineApp
    from haze._jobs.views import JobsApp

__all__ = ["App", "run_in_app", "use_app"]

log = logging.getLogger("haze")

#: The current-app context (kept under this name: tests and older callers read it).
_current = current.app_var
_warned_implicit = False


def use_app() -> App:
    """The current app: the job's app inside a job, else the most recently entered app,
    else the implicit default app (one ``memory`` connection)."""
    return cast(App, current.use_app())


def _default() -> App:
    return cast(App, current.default_app())


def _views(app: App) -> tuple[EngineApp, JobsApp]:
    """An App is each view the layers below it read (mypy checks this line)."""
    return app, app


def _new_default_app() -> App:
    app = App()
    app._implicit = True
    return app


current.set_default_factory(_new_default_app)


def warn_implicit_dispatch() -> None:
    """Say once per process that jobs went to the implicit app (they die with it)."""
    global _warned_implicit
    if _warned_implicit:
        return
    _warned_implicit = True
    lost = (
        "haze: no App was created, so this job went to the implicit in-memory app: its jobs "
        "are lost when this process exits. "
    )
    if (Path.cwd() / "config" / "queue.py").is_file():
        log.warning(
            lost + "config/queue.py is here, but only an App reads it: dispatch inside "
            "`with App(root=__file__):` (`async with` in async code), or enter the App once "
            "where your web framework starts."
        )
        return
    log.warning(
        lost + "Create config/queue.py naming a database or redis connection and load it "
        "with App(root=__file__) (or pass App(queue=...))."
    )


class App:
    """A haze application: config, connections, stores and the queue manager.

    ``App(root=".")`` reads ``config/{queue,cache,redis,database}.py`` and imports every
    ``app/job/**/*.py`` under ``root``. Config objects passed in win over the files.
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        *,
        queue: Any = None,
        cache: Any = None,
        redis: Any = None,
        database: Any = None,
        haze: Any = None,
        key: str | None = None,
    ) -> None:
        self.root = _app_root(root) if root is not None else None
        self._entered = False
        self._implicit = False  # the process-wide default app (see use_app)
        #: Set by ``Queue.fake()``: dispatches are recorded on it instead of queued.
        self.recorder: DispatchRecorder | None = None
        self._key = key
        specs: dict[str, tuple[Any, str | None]] = {
            "queue": (queue, None),
            "cache": (cache, None),
            "redis": (redis, None),
            "database": (database, None),
        }
        haze_spec: tuple[Any, str | None] = (haze, None)
        if self.root is not None:
            for kind in specs:
                if specs[kind][0] is None:
                    path = self.root / "config" / f"{kind}.py"
                    if path.is_file():
                        specs[kind] = (self._read_config(path, kind), str(path))
            hz = self.root / "haze.config.py"
            if haze is None and hz.is_file():
                haze_spec = (self._read_config(hz, "haze"), str(hz))
        self.queue_config: QueueConfig = validate_queue(*specs["queue"])
        self.cache_config: CacheConfig = validate_cache(*specs["cache"])
        self.redis_config: RedisConfig = validate_redis(*specs["redis"])
        self.database_config: DatabaseConfig = validate_database(*specs["database"])
        self.haze_config: HazeConfig = validate_haze(*haze_spec)
        self._check_store_names()
        self._drivers: dict[str, Driver] = {}
        self._stores: dict[str, Store] = {}
        # Stores the lock/batch store resolves to without config/cache.py naming them.
        self._derived_stores: dict[str, dict[str, Any]] = {}
        self._lock_store: str | None = None
        self._connectors: dict[str, Connector] = {}
        self._workers: list[Worker] = []
        self._discovered = False
        self.manager: QueueManager = QueueManager(
            self,
            worker_factory=lambda connection, n: Worker(self, connection, None, n),
            warn_implicit=warn_implicit_dispatch,
            read_duration=env_duration,
        )
        install_orchestration(self.manager)
        if self.root is not None:
            self.discover()
            load_schedules(self.root)
        self.check_keys()

    # -- config ------------------------------------------------------------------

    def _read_config(self, path: Path, kind: str) -> Any:
        name = f"_haze_config_{abs(hash(str(path)))}_{kind}"
        module = _load_module_file(path, name)
        if not hasattr(module, "config"):
            raise ConfigError(
                f"defines no module-level 'config'; add config = define_{kind}_config(...)",
                source=str(path),
            )
        return module.config

    def _check_store_names(self) -> None:
        qc, cc = self.queue_config, self.cache_config
        for key, name in (("store", qc.store), ("batches.store", qc.batches_store)):
            if name is not None and name not in cc.stores:
                raise ConfigError(
                    f"{name!r} is not a store in config/cache.py (stores: {', '.join(cc.stores)})",
                    source=qc.source,
                    key=key,
                )

    @property
    def key(self) -> str | None:
        """The app key for ``encrypted`` jobs: ``App(key=...)`` or the ``APP_KEY`` env var."""
        # read_env: inside a Cloudflare Worker, its secret of this invocation
        return self._key if self._key is not None else read_env("APP_KEY")

    @property
    def previous_keys(self) -> str | None:
        """``APP_PREVIOUS_KEYS`` (comma-separated keys that still decrypt), read like
        ``APP_KEY``: inside a Cloudflare Worker, its secret of this invocation."""
        return read_env("APP_PREVIOUS_KEYS")

    def check_keys(self) -> None:
        """When a registered job is ``encrypted``: ``ConfigError`` naming the variable if
        the app key or one of ``APP_PREVIOUS_KEYS`` cannot be a key (an unusable key is
        found when the app starts, not job by job)."""
        if any(job.encrypted for job in registered_jobs().values()):
            where = "APP_KEY" if self._key is None else "App(key=...)"
            check_keys(self.key, where, self.previous_keys)

    # -- discovery ---------------------------------------------------------------

    def discover(self) -> list[str]:
        """Import every ``app/job/**/*.py`` under the root; returns the module names."""
        if self.root is None:
            return []
        names = discover_jobs(self.root)
        self._discovered = True
        return names

    # -- connections and stores ---------------------------------------------------

    def connection_name(self, name: str | None) -> str:
        if name is None:
            return self.queue_config.default
        if name not in self.queue_config.connections:
            connections = self.queue_config.connections
            known = ", ".join(connections)
            source = self.queue_config.source
            if source.startswith("<"):  # no config/queue.py: the built-in default
                where = (
                    f"there is no config/queue.py under {self.root}, so the only connection "
                    f"is the built-in {known}"
                    if self.root is not None
                    else f"this app's queue config has only: {known}"
                )
            else:
                where = f"configured connections (defined in {source}): {known}"
            raise ConfigError(
                f"unknown queue connection {name!r}{did_you_mean(name, connections)}; {where}",
            )
        return name

    @property
    def implicit(self) -> bool:
        """True for the process-wide default app (its jobs die with the process)."""
        return self._implicit

    def open_drivers(self) -> Mapping[str, Driver]:
        """The drivers built so far, by connection (a read-only view; none is created)."""
        return MappingProxyType(self._drivers)

    def driver(self, name: str | None = None) -> Driver:
        """The driver of a queue connection (created on first use)."""
        name = self.connection_name(name)
        d = self._drivers.get(name)
        if d is None:
            options = self.queue_config.connections[name]
            # The driver is handed a narrow context, never the App (it keeps what it needs).
            context = AppDriverContext(self, name, repr(options["driver"]))
            d = self._drivers[name] = create_driver(
                name, options, context, self.queue_config.source
            )
        return d

    def store(self, name: str | None = None) -> Store:
        """A cache store from ``config/cache.py`` (the default when ``name`` is None)."""
        cc = self.cache_config
        name = name or cc.default
        s = self._stores.get(name)
        if s is None:
            options = cc.stores.get(name) or self._derived_stores.get(name)
            if options is None:
                raise ConfigError(
                    f"unknown store {name!r}; configured stores: {', '.join(cc.stores)}",
                    source=cc.source,
                    key="stores",
                )
            s = self._stores[name] = create_store(name, options, self, cc.source)
        return s

    def check_database_name(self, name: str, source: str, key: str) -> None:
        """Refuse ``name`` when config/database.py has no such connection, as the
        mistake of ``source`` (the file that named it) at ``key``."""
        known = self.database_config.connections
        if name not in known:
            raise ConfigError(
                f"{name!r} is not a connection in config/database.py (connections: "
                f"{', '.join(known) or 'none'}){did_you_mean(name, known)}",
                source=source,
                key=key,
            )

    def database(self, name: str | None = None) -> Connector:
        """A SQL connector from ``config/database.py`` (created on first use, shared)."""
        dc = self.database_config
        name = name or dc.default
        c = self._connectors.get(name)
        if c is None:
            if name not in dc.connections:
                raise ConfigError(
                    f"unknown database connection {name!r}; "
                    f"configured: {', '.join(dc.connections)}",
                    source=dc.source,
                    key="connections",
                )
            c = self._connectors[name] = connect(
                name, dc.connections[name], root=self.root, source=dc.source
            )
        return c

    def job_queues(self, connection: str) -> dict[str, list[str]]:
        """The queues the registered jobs land on on ``connection``, each with those
        jobs' names: the definition's ``queue``/``connection``, else the route of the
        job's name in ``routes``, else ``default`` and the default connection."""
        found: dict[str, list[str]] = {}
        routes = self.queue_config.routes
        for job in registered_jobs().values():
            conn = routes.connection_for(job.name, job.connection)
            if (conn or self.queue_config.default) == connection:
                found.setdefault(routes.queue_for(job.name, job.queue) or "default", []).append(
                    job.name
                )
        return {q: sorted(found[q]) for q in sorted(found)}

    def known_queues(self, connection: str) -> list[str]:
        """The connection's configured ``queues`` (else ``default``), then every other
        queue a registered job names on it: what failed/retry/size/flush look at."""
        configured = self.queue_config.connections[connection].get("queues") or ["default"]
        return list(dict.fromkeys([*configured, *self.job_queues(connection)]))

    @property
    def queue_store(self) -> Store:
        """The store for unique locks and middleware state: ``store`` in config/queue.py,
        else the ``default`` of config/cache.py, else the shared store of the default
        connection's backend (a database connection keeps them in its database, redis in
        its Redis). Raises ``ConfigError`` for sqs and cloudflare when no store fits."""
        return self.store(self._lock_store_name())

    @property
    def batch_store(self) -> Store:
        """The store for batch state (``batches.store``, default: the queue store)."""
        return self.store(self.queue_config.batches_store or self._lock_store_name())

    def _lock_store_name(self) -> str:
        qc, cc = self.queue_config, self.cache_config
        if qc.store is not None:
            return qc.store
        if cc.default_named:
            return cc.default
        if self._lock_store is None:
            self._lock_store = self._store_of_connection(qc.default)
        return self._lock_store

    def _store_of_connection(self, connection: str) -> str:
        """The shared store of a queue connection's own backend (registered if needed)."""
        qc, cc, dc = self.queue_config, self.cache_config, self.database_config
        options = qc.connections[connection]
        driver = options["driver"]
        if driver == "failover":
            return self._store_of_connection(options["connections"][0])
        if driver == "database":
            db = options.get("connection") or dc.default
            return self._derived_store("database", {"driver": "database", "connection": db})
        if driver == "redis":
            redis = {"driver": "redis", "connection": options.get("connection")}
            if options.get("url"):
                redis["url"] = options["url"]
            return self._derived_store("redis", redis)
        if driver not in ("sqs", "cloudflare", "vercel"):  # memory, sync: this process only
            mem = [n for n, o in cc.stores.items() if o["driver"] == "memory"]
            return mem[0] if mem else self._derived_store("memory", {"driver": "memory"})
        failed: str | None = options.get("failed_store")
        # The failed jobs' own resolution (and precedence) picks the shared backend.
        target = None if failed is None else failed_target(failed, cc.stores, dc.connections)
        if target is not None:
            kind, bare = target
            if kind == "store" and cc.stores[bare]["driver"] != "memory":
                return bare
            if kind == "database":
                return self._derived_store("database", {"driver": "database", "connection": bare})
        where = f'connection "{connection}" ({driver}) has no store for unique locks and batches'
        if driver == "cloudflare":
            d1 = [n for n, c in dc.connections.items() if dialect_of(c["url"]) == "d1"]
            if d1:
                return self._derived_store("database", {"driver": "database", "connection": d1[0]})
            kv = [n for n, o in cc.stores.items() if o["driver"] == "kv"]
            if kv:
                return kv[0]
            raise ConfigError(
                f"{where}: add a D1 database to config/database.py "
                '({"url": "d1://ACCOUNT/DATABASE", "options": {"binding": "DB"}}) or a KV '
                'store to config/cache.py ({"driver": "kv", "binding": "KV"}), or set store= '
                "in config/queue.py",
                source=qc.source,
                key="store",
            )
        raise ConfigError(
            f"{where}, and {'SQS' if driver == 'sqs' else 'Vercel Queues'} cannot hold one: "
            "set store= in config/queue.py to a redis or "
            'database store of config/cache.py (e.g. "locks": {"driver": "database", '
            '"connection": "main"}), or set failed_store on the connection to a database '
            "connection",
            source=qc.source,
            key="store",
        )

    def _derived_store(self, driver: str, options: dict[str, Any]) -> str:
        """A configured store with these options, else one registered under a new name."""
        cc = self.cache_config
        defaults = {"database": self.database_config.default, "redis": self.redis_config.default}

        def target(o: dict[str, Any]) -> tuple[Any, ...]:
            return (o["driver"], o.get("connection") or defaults.get(driver), o.get("url"))

        for name, configured in cc.stores.items():
            if target(configured) == target(options):
                return name
        name = driver
        if name in cc.stores:
            name = f"{driver}:{options.get('connection') or options.get('url') or 'default'}"
        self._derived_stores[name] = options
        return name

    # -- lifecycle -----------------------------------------------------------------

    @property
    def entered(self) -> bool:
        """True from entering the app (``async with app``, ``start_blocking``) until it is
        left."""
        return self._entered

    async def ensure_entered(self) -> App:
        """Enter the app unless it is entered already, and return it: for a host that
        boots it once and keeps it for the process (a Cloudflare Worker isolate)."""
        if not self._entered:
            await self.__aenter__()
        return self

    async def __aenter__(self) -> App:
        self._entered = True
        self._token = current.entered(self)
        try:
            await self.start()
        except BaseException:
            # A refused start (a connection that cannot be built) leaves no app behind.
            self._entered = False
            current.left(self, self._token)
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.stop()
        finally:
            self._entered = False
            current.left(self, self._token)

    def __enter__(self) -> App:
        """``with App(root=...) as app:`` for sync code: :meth:`start_blocking` on entry,
        :meth:`stop_blocking` on exit."""
        return self.start_blocking()

    def __exit__(self, *exc: object) -> None:
        self.stop_blocking()

    def start_blocking(self) -> App:
        """Enter the app from sync code (Flask, Django, scripts); returns the app.

        The app becomes current for the whole process and its ``memory`` consumers run
        on haze's background event loop, so ``job.dispatch_blocking(...)`` works from any
        thread until :meth:`stop_blocking`.

        >>> # app = App(root=".").start_blocking()
        >>> # send_invoice.dispatch_blocking({"invoice_id": 1})
        >>> # app.stop_blocking()
        """
        run_blocking(self.__aenter__(), "App.start")
        return self

    def stop_blocking(self) -> None:
        """Leave the app from sync code: stop taking jobs and wait for the running ones."""
        if self._entered:
            run_blocking(self.__aexit__(None, None, None), "App.stop")

    async def start(self) -> None:
        """Resolve every connection's route (a bad connection is refused here, not at
        its first dispatch) and start in-process consumers for the ``memory`` ones."""
        self._lock_store_name()  # no usable lock/batch store is a start-up error
        self.check_keys()  # jobs imported since App() was built
        for name in self.queue_config.connections:
            try:
                # Builds the driver object only: no connection is opened.
                self.manager.dispatcher.route(name)
            except MissingDependencyError:
                continue  # its client is not installed here: its first dispatch says so
        for name, options in self.queue_config.connections.items():
            if options["driver"] == "memory":
                self.manager.ensure_local_worker(name)

    async def stop(self) -> None:
        """Stop taking jobs, wait for running ones, and report what stays queued."""
        batch_settle.stop_asking(self.manager)
        await self.manager.shutdown()
        for d in self._drivers.values():
            await d.close()
        for s in self._stores.values():
            await s.close()
        for c in self._connectors.values():
            await c.close()

    def __repr__(self) -> str:
        return f"<haze.App root={str(self.root) if self.root else None!r}>"
