"""In-process consumers of the app's ``memory`` connections, and ``Queue.idle()``.

The engine does not build workers (they live above it, in ``haze._workers``): the app
hands it a factory, and the engine starts one consumer per memory connection and event
loop when a job is queued there.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from haze.contracts.driver import Backlog, Concurrent
from haze.transactions import wait_pending

if TYPE_CHECKING:
    from haze._engine.view import EngineApp

__all__ = ["LocalWorker", "LocalWorkers", "WorkerFactory"]

log = logging.getLogger("haze")


class LocalWorker(Protocol):
    """What the engine needs of an in-process consumer (``haze._workers.worker.Worker``)."""

    stopping: bool

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None: ...
    def start(self) -> None: ...
    async def stop(self) -> None: ...


#: (connection, concurrency) -> a consumer of that connection, not started yet.
WorkerFactory = Callable[[str, int], LocalWorker]


class LocalWorkers:
    """The in-process consumers of one app, one per memory connection and loop."""

    def __init__(self, app: EngineApp, factory: WorkerFactory | None) -> None:
        self.app = app
        self.factory = factory
        self.workers: dict[str, LocalWorker] = {}

    def ensure(self, connection: str) -> None:
        """Make sure an in-process consumer runs for a memory connection on this loop."""
        worker = self.workers.get(connection)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if worker is not None and worker.loop is loop and not worker.stopping:
            return
        if self.factory is None:
            return  # an engine without consumers (nothing runs memory jobs here)
        driver = self.app.driver(connection)
        concurrency = driver.concurrency if isinstance(driver, Concurrent) else 1
        worker = self.factory(connection, concurrency)
        self.workers[connection] = worker
        worker.start()

    async def stop(self, loop: asyncio.AbstractEventLoop | None) -> None:
        """Stop ``loop``'s consumers after their running jobs."""
        stopping = {n: w for n, w in self.workers.items() if w.loop is loop}
        await asyncio.gather(*(w.stop() for w in stopping.values()), return_exceptions=True)
        for name, worker in stopping.items():
            if self.workers.get(name) is worker:
                del self.workers[name]

    def warn_lost(self) -> None:
        """The app stops: say how many jobs its memory connections lose."""
        for name, driver in self.app.open_drivers().items():
            if isinstance(driver, Backlog) and not driver.remote:
                n = driver.waiting()
                if n:
                    log.warning(
                        "The app stopped with %d queued or delayed job(s) on memory connection "
                        '"%s"; they are lost (memory queues do not outlive the app).',
                        n,
                        name,
                    )

    async def idle(self) -> None:
        """Wait until memory connections have nothing queued, delayed or running."""
        while True:
            await wait_pending()
            busy = False
            for name, driver in list(self.app.open_drivers().items()):
                if not isinstance(driver, Backlog) or driver.remote:
                    continue
                if driver.pending():
                    busy = True
                    self.ensure(name)
                    await driver.wait_idle()
            if not busy:
                await wait_pending()
                if not any(
                    d.pending()
                    for d in self.app.open_drivers().values()
                    if isinstance(d, Backlog) and not d.remote
                ):
                    return
