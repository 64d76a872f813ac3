"""What the layers below the composition root see of an App: the ``AppView`` Protocol.

The engine, jobs, runners and orchestration never name ``haze.App``: they are handed
(or look up with :func:`use_app`) an object that has these attributes, and ``App``
has them. The view is generic in the engine type, because the engine lives above this
module: the engine and the layers above it read ``AppView[QueueManager]``, the jobs
layer ``AppView[JobEngine]`` (the part of the engine a job definition calls). The
composition root states that an ``App`` is each of them, so mypy checks it there.

>>> # def queued_on(app: AppView[object], job_connection: str | None) -> str:
>>> #     return app.connection_name(job_connection)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from haze._base import current

if TYPE_CHECKING:
    from haze._base.routes import JobRoutes
    from haze.contracts.driver import Driver
    from haze.contracts.recorder import DispatchRecorder
    from haze.contracts.store import Store

__all__ = ["AppView", "DatabaseConfigView", "QueueConfigView", "use_app"]

EngineT_co = TypeVar("EngineT_co", covariant=True)


class QueueConfigView(Protocol):
    """The validated ``config/queue.py`` (read-only)."""

    @property
    def default(self) -> str: ...
    @property
    def connections(self) -> dict[str, dict[str, Any]]: ...
    @property
    def store(self) -> str | None: ...
    @property
    def batches_store(self) -> str | None: ...
    @property
    def batches_ttl(self) -> float: ...
    @property
    def middleware(self) -> list[Callable[..., Any]]: ...
    @property
    def source(self) -> str: ...
    @property
    def telemetry(self) -> bool | str: ...
    @property
    def queue_limits(self) -> dict[str, dict[str, dict[str, float]]]: ...
    @property
    def track(self) -> bool: ...
    @property
    def keep_result(self) -> float | None: ...
    @property
    def routes(self) -> JobRoutes:
        """``routes``: job-name glob -> queue/connection, below the call site and the
        job definition."""


class DatabaseConfigView(Protocol):
    """The validated ``config/database.py`` (read-only)."""

    @property
    def default(self) -> str: ...
    @property
    def connections(self) -> dict[str, dict[str, Any]]: ...
    @property
    def source(self) -> str: ...


class AppView(Protocol[EngineT_co]):
    """An App as the engine, jobs, runners and orchestration see it: its config, its
    drivers and stores, the test recorder, its keys and its engine (``manager``)."""

    @property
    def root(self) -> Path | None:
        """The app folder (None for an app built from config objects alone)."""

    @property
    def queue_config(self) -> QueueConfigView: ...
    @property
    def database_config(self) -> DatabaseConfigView: ...
    @property
    def recorder(self) -> DispatchRecorder | None:
        """Set by ``Queue.fake()``: dispatches are recorded on it instead of queued."""

    @property
    def implicit(self) -> bool:
        """True for the process-wide default app (its jobs die with the process)."""

    @property
    def manager(self) -> EngineT_co:
        """The app's engine."""

    @property
    def key(self) -> str | None: ...
    @property
    def previous_keys(self) -> str | None: ...
    @property
    def queue_store(self) -> Store: ...
    @property
    def batch_store(self) -> Store: ...

    def connection_name(self, name: str | None) -> str:
        """``name`` checked against config/queue.py (None: the default connection)."""

    def driver(self, name: str | None = None) -> Driver:
        """The driver of a queue connection (created on first use)."""

    def open_drivers(self) -> Mapping[str, Driver]:
        """The drivers built so far, by connection (none is created)."""

    def job_queues(self, connection: str) -> dict[str, list[str]]: ...


def use_app() -> AppView[Any]:
    """The current app: the job's app inside a job, else the most recently entered app,
    else the implicit default app (one ``memory`` connection).

    The engine type is open here (the caller names the view it reads, e.g.
    ``app: AppView[JobEngine] = use_app()``); the composition root checks that an
    ``App`` is each view a layer names."""
    return cast("AppView[Any]", current.use_app())
