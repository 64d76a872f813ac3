"""The ``DriverContext`` the App hands each queue driver it builds: a narrow window on
the app (its root, configs, shared connectors and stores, the other connections and two
engine calls), so that a driver cannot reach the rest of it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from haze._base.errors import ConfigError
from haze._base.message import Message
from haze.connectors import Connector
from haze.contracts.app import DatabaseConfigView, QueueConfigView
from haze.contracts.driver import Driver
from haze.contracts.store import Store

if TYPE_CHECKING:
    from haze._app.app import App

__all__ = ["AppDriverContext"]


class AppDriverContext:
    """``haze.drivers.context.DriverContext`` for the connection ``name`` of ``app``.

    Anything else a driver asks it for (a plugin written when drivers were handed the
    App) is one ``ConfigError`` naming the attribute and the constructor to use."""

    __slots__ = ("_app", "_driver_class", "_name")

    def __init__(self, app: App, name: str, driver_class: str) -> None:
        self._app = app
        self._name = name
        self._driver_class = driver_class

    @property
    def root(self) -> Path | None:
        return self._app.root

    @property
    def source(self) -> str:
        return self._app.queue_config.source

    @property
    def default_connection(self) -> str:
        return self._app.queue_config.default

    @property
    def queue_config(self) -> QueueConfigView:
        return self._app.queue_config

    @property
    def database_config(self) -> DatabaseConfigView:
        return self._app.database_config

    @property
    def cache_config(self) -> Any:
        return self._app.cache_config

    @property
    def redis_config(self) -> Any:
        return self._app.redis_config

    def database(self, name: str | None = None, *, key: str | None = None) -> Connector:
        app = self._app
        name = name or app.database_config.default
        if key is not None:
            where = f"connections.{self._name}.{key}"
            app.check_database_name(name, app.queue_config.source, where)
        return app.database(name)

    def store(self, name: str | None = None) -> Store:
        return self._app.store(name)

    def driver(self, name: str) -> Driver:
        return self._app.driver(name)

    def job_queues(self, connection: str) -> dict[str, list[str]]:
        return self._app.job_queues(connection)

    async def run_inline(self, message: Message, body: str, driver: Driver) -> None:
        await self._app.manager.run_inline(message, body, driver)

    def ensure_local_worker(self, connection: str) -> None:
        self._app.manager.ensure_local_worker(connection)

    def __getattr__(self, attribute: str) -> NoReturn:
        raise ConfigError(
            f"the driver {self._driver_class} asked what it was handed for {attribute!r}, "
            "which a driver is not given: a driver is built as cls(name, options, context) "
            "and may use only what haze.driver_api.DriverContext declares (root, source, "
            "default_connection, the configs, database(), store(), driver(), job_queues(), "
            "run_inline(), ensure_local_worker())",
            source=self._app.queue_config.source,
            key=f"connections.{self._name}.driver",
        )

    def __repr__(self) -> str:
        return f"<DriverContext {self._name!r}>"
