"""What a queue driver is handed when it is built: ``cls(name, options, context)``.

A driver never gets the App. It gets a ``DriverContext``: the few plain facts its
messages name (the app's root, the config file, the default connection), the app's
checked configs to read its own connection from, the shared connectors and stores it
may build on (built, not connected: building a driver does no I/O), the other
connections (a failover's members) and the two engine calls a dispatch-only driver
makes. A driver takes what it needs in its constructor and keeps that, not the context.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from haze.contracts.app import DatabaseConfigView, QueueConfigView
from haze.contracts.driver import Driver
from haze.contracts.store import Store

if TYPE_CHECKING:
    from haze._base.message import Message
    from haze.connectors import Connector

__all__ = ["DriverContext", "RunInline"]

#: Run one message on an inline driver (``sync``) now, in this process.
RunInline = Callable[["Message", str, Driver], Awaitable[None]]


@runtime_checkable
class DriverContext(Protocol):
    """What a queue driver is handed as the third argument of its constructor.

    >>> class MyDriver:
    ...     options = {"connection": "str"}
    ...
    ...     def __init__(self, name, options, context):
    ...         self.db = context.database(options.get("connection"), key="connection")
    """

    @property
    def root(self) -> Path | None:
        """The app's root folder (None for an app built in code)."""
        ...

    @property
    def source(self) -> str:
        """The file that configured the queue connections (for errors)."""
        ...

    @property
    def default_connection(self) -> str:
        """The name of the app's default queue connection."""
        ...

    @property
    def queue_config(self) -> QueueConfigView: ...

    @property
    def database_config(self) -> DatabaseConfigView: ...

    @property
    def cache_config(self) -> Any: ...

    @property
    def redis_config(self) -> Any: ...

    def database(self, name: str | None = None, *, key: str | None = None) -> Connector:
        """The app's shared connector of a ``config/database.py`` connection (the
        default when ``name`` is None), built but not connected. ``key``: the option
        of this connection that named it; an unknown name is then one ``ConfigError``
        there."""
        ...

    def store(self, name: str | None = None) -> Store:
        """A cache store of ``config/cache.py`` (the default when ``name`` is None)."""
        ...

    def driver(self, name: str) -> Driver:
        """The driver of another queue connection (a failover's members)."""
        ...

    def job_queues(self, connection: str) -> dict[str, list[str]]:
        """The queues the registered jobs name on ``connection``, with their jobs."""
        ...

    async def run_inline(self, message: Message, body: str, driver: Driver) -> None:
        """Run ``message`` now on ``driver``, an inline connection."""
        ...

    def ensure_local_worker(self, connection: str) -> None:
        """Start this process's consumer of a local (``memory``) connection."""
        ...
