"""The one resolution of a queue connection's ``failed_store`` option.

Used by every driver that has no failed jobs of its own (sqs, cloudflare) and by the
App, which derives a connection's lock store from the same option.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, Protocol

from haze._base.errors import ConfigError
from haze._failed.memory import WarningFailedJobs
from haze._failed.sql import SqlFailedJobs
from haze._failed.store import StoreFailedJobs
from haze.contracts.failed import FailedJobStore
from haze.contracts.store import Store

if TYPE_CHECKING:
    from haze.connectors import Connector

__all__ = ["FailedStoreHost", "failed_store", "failed_target"]

Kind = Literal["database", "store"]


class _Configs(Protocol):
    @property
    def source(self) -> str: ...


class _Stores(_Configs, Protocol):
    @property
    def stores(self) -> Mapping[str, Mapping[str, Any]]: ...


class _Databases(_Configs, Protocol):
    @property
    def connections(self) -> Mapping[str, Mapping[str, Any]]: ...


class FailedStoreHost(Protocol):
    """What resolving ``failed_store`` needs of the App (the driver's ``app``)."""

    @property
    def queue_config(self) -> _Configs: ...
    @property
    def cache_config(self) -> _Stores: ...
    @property
    def database_config(self) -> _Databases: ...
    def store(self, name: str | None = None) -> Store: ...
    def database(self, name: str | None = None) -> Connector: ...


def failed_target(
    name: str, stores: Mapping[str, Any], databases: Mapping[str, Any]
) -> tuple[Kind, str] | None:
    """Where ``failed_store = name`` keeps failed jobs: ``("database", connection)`` or
    ``("store", store)``; None when ``name`` is neither.

    Precedence: ``database:NAME`` and ``store:NAME`` say which. A bare ``NAME`` is the
    database connection of config/database.py when one has that name (its
    ``failed_jobs`` table: indexed, and written in one statement), else the cache store
    of config/cache.py with that name.

    >>> failed_target("main", {"main": {}}, {"main": {}})
    ('database', 'main')
    >>> failed_target("store:main", {"main": {}}, {"main": {}})
    ('store', 'main')
    """
    kind, _, bare = name.partition(":")
    if kind not in ("store", "database"):
        kind, bare = "", name
    if kind in ("", "database") and bare in databases:
        return "database", bare
    if kind in ("", "store") and bare in stores:
        return "store", bare
    return None


def failed_store(
    connection: str,
    name: str | None,
    app: FailedStoreHost | None,
    log: logging.Logger,
) -> FailedJobStore:
    """The failed-job store of queue connection ``connection`` whose ``failed_store``
    option is ``name`` (see ``failed_target`` for the precedence).

    - a database connection: its ``failed_jobs`` table (created on first use), limited to
      this connection's rows;
    - a shared cache store (redis, database, kv): ``StoreFailedJobs``;
    - no ``failed_store``, or a store only this process sees (memory): this process's
      memory, and a warning on ``log`` at the first failure it keeps.

    A name that is neither raises ``ConfigError`` listing both.
    """
    if name is None:
        return WarningFailedJobs(connection, "no failed_store is set", log)
    key = f"connections.{connection}.failed_store"
    if app is None:
        raise ConfigError("failed_store needs an app", key=key)
    stores = app.cache_config.stores
    databases = app.database_config.connections
    target = failed_target(name, stores, databases)
    if target is None:
        raise ConfigError(
            f"{name!r} is neither a cache store (config/cache.py: {', '.join(stores) or 'none'}) "
            f"nor a database connection (config/database.py: {', '.join(databases) or 'none'})",
            source=app.queue_config.source,
            key=key,
        )
    kind, bare = target
    if kind == "database":
        host = app
        return SqlFailedJobs(lambda: host.database(bare), connection=connection, create=True)
    store = app.store(bare)
    if not store.shared:
        return WarningFailedJobs(connection, f'the "{bare}" store is not shared', log)
    return StoreFailedJobs(store, connection)
