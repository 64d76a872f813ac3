"""The app: config, job discovery, connections and stores, and the current-app context.

>>> app = App(queue=define_queue_config(default="memory",
...     connections={"memory": {"driver": "memory", "concurrency": 2}}))
>>> # async with app:
>>> #     await send_invoice.dispatch({"invoice_id": 1})
>>> #     await Queue.idle()
"""

from __future__ import annotations

import asyncio
import contextvars
import importlib
import importlib.machinery
import importlib.util
import logging
import os
import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from .config import (
    CacheConfig,
    DatabaseConfig,
    HazeConfig,
    QueueConfig,
    RedisConfig,
    validate_cache,
    validate_database,
    validate_haze,
    validate_queue,
    validate_redis,
)
from .drivers import Driver, create_driver
from .errors import ConfigError, HazeError
from .stores import Store, create_store

if TYPE_CHECKING:
    from .database import Connector
    from .manager import QueueManager
    from .worker import Worker

__all__ = ["App", "run_in_app", "use_app"]

log = logging.getLogger("haze")
T = TypeVar("T")

_current: contextvars.ContextVar[App | None] = contextvars.ContextVar("haze_app", default=None)
_last_entered: App | None = None
_default_app: App | None = None
_default_lock = threading.Lock()


def use_app() -> App:
    """The current app: the job's app inside a job, else the most recently entered app,
    else the implicit default app (one ``memory`` connection)."""
    app = _current.get()
    if app is not None:
        return app
    if _last_entered is not None and _last_entered._entered:
        return _last_entered
    return _default()


def _default() -> App:
    global _default_app
    with _default_lock:
        if _default_app is None:
            _default_app = App()
        return _default_app


async def run_in_app(app: App, fn: Callable[[], Awaitable[T] | T]) -> T:
    """Run ``fn`` with ``app`` as the current app (for scripts with several apps)."""
    token = _current.set(app)
    try:
        result = fn()
        if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
            return await result  # type: ignore[no-any-return]
        return result  # type: ignore[return-value]
    finally:
        _current.reset(token)


def _load_module_file(path: Path, module_name: str) -> Any:
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:  # pragma: no cover
        raise ConfigError("cannot be imported", source=str(path))
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except HazeError:
        sys.modules.pop(module_name, None)
        raise
    except Exception as e:
        sys.modules.pop(module_name, None)
        raise ConfigError(f"failed to import: {type(e).__name__}: {e}", source=str(path)) from e
    return module


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
        self.root = Path(root).resolve() if root is not None else None
        self._entered = False
        self._key = key
        specs: dict[str, tuple[Any, str | None]] = {
            "queue": (queue, None),
            "cache": (cache, None),
            "redis": (redis, None),
            "database": (database, None),
        }
        haze_spec: tuple[Any, str | None] = (haze, None)
        if self.root is not None:
            if not self.root.is_dir():
                raise ConfigError("the app root is not a directory", source=str(self.root))
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
        self._connectors: dict[str, Connector] = {}
        self._workers: list[Worker] = []
        self._discovered = False
        from .manager import QueueManager

        self.manager: QueueManager = QueueManager(self)
        if self.root is not None:
            self.discover()

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
        return self._key if self._key is not None else os.environ.get("APP_KEY")

    # -- discovery ---------------------------------------------------------------

    def discover(self) -> list[str]:
        """Import every ``app/job/**/*.py`` under the root; returns the module names."""
        if self.root is None:
            return []
        job_dir = self.root / "app" / "job"
        if not job_dir.is_dir():
            return []
        root = str(self.root)
        if root not in sys.path:
            sys.path.insert(0, root)
        names: list[str] = []
        for path in sorted(job_dir.rglob("*.py")):
            if path.name.startswith("_") and path.name != "__init__.py":
                continue
            if path.name == "__init__.py":
                continue
            rel = path.relative_to(self.root).with_suffix("")
            dotted = ".".join(rel.parts)
            names.append(self._import_job_module(path, dotted))
        self._discovered = True
        return names

    def _import_job_module(self, path: Path, dotted: str) -> str:
        existing = sys.modules.get(dotted)
        if existing is not None and Path(getattr(existing, "__file__", "") or "").resolve() == path:
            return dotted
        top = sys.modules.get(dotted.split(".")[0])
        top_paths = [str(Path(p).resolve()) for p in getattr(top, "__path__", [])]
        assert self.root is not None
        if top is None or str(self.root / "app") in top_paths:
            try:
                module = importlib.import_module(dotted)
                # ``app`` is a namespace package spanning every root on sys.path: the
                # name can resolve to another app's module of the same path.
                if Path(getattr(module, "__file__", "") or "").resolve() == path:
                    return dotted
            except HazeError:
                raise
            except ImportError:
                pass
            except Exception as e:
                raise ConfigError(
                    f"failed to import job module: {type(e).__name__}: {e}", source=str(path)
                ) from e
        # Another app already owns the ``app`` package name in this process: load under
        # a private top-level name, with parent packages so relative imports resolve.
        top_name = f"_haze_jobs_{abs(hash(str(self.root)))}"
        name = f"{top_name}.{dotted}"
        if name in sys.modules:  # already imported by a sibling's relative import
            return name
        parts = [top_name, *dotted.split(".")[:-1]]
        for depth in range(1, len(parts) + 1):
            pkg = ".".join(parts[:depth])
            if pkg not in sys.modules:
                where = self.root.joinpath(*parts[1:depth])
                spec = importlib.machinery.ModuleSpec(pkg, None, is_package=True)
                spec.submodule_search_locations = [str(where)]
                sys.modules[pkg] = importlib.util.module_from_spec(spec)
        _load_module_file(path, name)
        return name

    # -- connections and stores ---------------------------------------------------

    def connection_name(self, name: str | None) -> str:
        if name is None:
            return self.queue_config.default
        if name not in self.queue_config.connections:
            known = ", ".join(self.queue_config.connections)
            raise ConfigError(
                f"unknown queue connection {name!r}; configured connections: {known}",
                source=self.queue_config.source,
                key="connections",
            )
        return name

    def driver(self, name: str | None = None) -> Driver:
        """The driver of a queue connection (created on first use)."""
        name = self.connection_name(name)
        d = self._drivers.get(name)
        if d is None:
            options = self.queue_config.connections[name]
            d = self._drivers[name] = create_driver(name, options, self, self.queue_config.source)
        return d

    def store(self, name: str | None = None) -> Store:
        """A cache store from ``config/cache.py`` (the default when ``name`` is None)."""
        cc = self.cache_config
        name = name or cc.default
        s = self._stores.get(name)
        if s is None:
            if name not in cc.stores:
                raise ConfigError(
                    f"unknown store {name!r}; configured stores: {', '.join(cc.stores)}",
                    source=cc.source,
                    key="stores",
                )
            s = self._stores[name] = create_store(name, cc.stores[name], self, cc.source)
        return s

    def database(self, name: str | None = None) -> Connector:
        """A SQL connector from ``config/database.py`` (created on first use, shared)."""
        from .database import connect

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

    @property
    def queue_store(self) -> Store:
        """The store for unique locks and middleware state (``store`` in config/queue.py)."""
        return self.store(self.queue_config.store)

    @property
    def batch_store(self) -> Store:
        """The store for batch state (``batches.store``, default: ``store``)."""
        return self.store(self.queue_config.batches_store or self.queue_config.store)

    # -- lifecycle -----------------------------------------------------------------

    async def __aenter__(self) -> App:
        global _last_entered
        self._entered = True
        self._token = _current.set(self)
        _last_entered = self
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        global _last_entered
        try:
            await self.stop()
        finally:
            self._entered = False
            if _last_entered is self:
                _last_entered = None
            try:
                _current.reset(self._token)
            except ValueError:  # exited in another context (e.g. a fixture's teardown task)
                _current.set(None)

    async def start(self) -> None:
        """Start in-process consumers for the ``memory`` connections."""
        for name, options in self.queue_config.connections.items():
            if options["driver"] == "memory":
                self.manager.ensure_local_worker(name)

    async def stop(self) -> None:
        """Stop taking jobs, wait for running ones, and report what stays queued."""
        await self.manager.shutdown()
        for d in self._drivers.values():
            await d.close()
        for s in self._stores.values():
            await s.close()
        for c in self._connectors.values():
            await c.close()

    def __repr__(self) -> str:
        return f"<haze.App root={str(self.root) if self.root else None!r}>"
