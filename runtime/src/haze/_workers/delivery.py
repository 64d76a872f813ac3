"""The consumer core: run delivered jobs through the manager, whoever delivered them.

Three consumers hand haze jobs: a worker's slot claims them (``haze queue:work``), an
AWS Lambda SQS trigger gets a batch of records, a Cloudflare Worker's ``queue()`` gets a
batch of messages. Each turns what it got into a ``Reserved`` (``Reserved.delivered``
decodes a body the same way for all), and a ``Delivery`` runs it: the manager's
execution decides the outcome and settles the job on the driver it is given (ack,
release, fail); the delivery keeps the running jobs (whose leases its heartbeat renews)
and counts outcomes.

What differs per platform stays with its consumer: how a job is claimed or admitted,
what a backend error means for the message (a worker logs the outage and lets the lease
run out, Lambda reports the record as a batch item failure, Cloudflare calls
``message.retry()``), and how a batch is reported back.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, TypeVar

from haze.contracts.driver import Driver, Leased, Reserved

if TYPE_CHECKING:
    from haze._engine.manager import QueueManager

__all__ = ["Delivery"]

_T = TypeVar("_T")
_R = TypeVar("_R")


class Delivery:
    """Runs one consumer's delivered jobs through ``manager`` (see the module doc).

    ``connection``: the consumed connection, named in the ``looping`` and
    ``worker_idle`` events of ``run_batch(..., events=True)``.
    """

    def __init__(self, manager: QueueManager, connection: str | None = None) -> None:
        self.manager = manager
        self.connection = connection
        #: Outcomes so far ("success", "retry", ...), plus any a consumer counts itself.
        self.outcomes: collections.Counter[str] = collections.Counter()
        #: The running jobs, each with the driver that renews its lease (None: none does).
        self._running: dict[int, tuple[Leased | None, Reserved]] = {}

    def running(self) -> list[Reserved]:
        """The jobs running now, oldest first."""
        return [job for _, job in self._running.values()]

    async def run(
        self,
        job: Reserved,
        driver: Driver,
        *,
        leased: Leased | None = None,
        resumed: Awaitable[str] | None = None,
    ) -> str:
        """Run ``job`` to its outcome, settled on ``driver``; ``leased`` renews its lease
        meanwhile (``renew``). Job errors are outcomes; a backend error raises, for the
        consumer to answer its platform's way. ``resumed``: the rest of a run that began
        on the short path of a plain job (``haze._engine.plain``), awaited instead."""
        self._running[id(job)] = (leased, job)
        try:
            if resumed is None:
                outcome = await self.manager.process(job, driver)
            else:
                outcome = await resumed
        finally:
            del self._running[id(job)]
        self.outcomes[outcome] += 1
        return outcome

    async def run_batch(
        self,
        items: Sequence[_T],
        handle: Callable[[_T], Awaitable[_R]],
        *,
        concurrency: int = 1,
        stop: Callable[[_R], bool] | None = None,
        events: bool = False,
    ) -> list[_R]:
        """``handle`` every item of a delivered batch; the results, in the items' order.

        Up to ``concurrency`` at once; with ``stop``, one at a time in order, ending after
        the first result ``stop`` accepts (a FIFO batch: what follows it must not run
        before it). ``events``: emit ``looping`` before each item and ``worker_idle``
        after the batch, as a worker's loop does around its claims.
        """
        emitting = self.manager.events if events and self.connection is not None else None

        async def one(item: _T) -> _R:
            if emitting is not None and emitting.looping:
                await emitting.emit("looping", self.connection, None)
            return await handle(item)

        results: list[_R] = []
        if stop is not None or concurrency <= 1 or len(items) <= 1:
            for item in items:
                results.append(await one(item))
                if stop is not None and stop(results[-1]):
                    break
        else:
            limit = asyncio.Semaphore(concurrency)

            async def bounded(item: _T) -> _R:
                async with limit:
                    return await one(item)

            results = list(await asyncio.gather(*(bounded(item) for item in items)))
        if emitting is not None and emitting.worker_idle:
            await emitting.emit("worker_idle", self.connection, None)
        return results

    async def renew(
        self,
        on_error: Callable[[Exception], None],
        also: Iterable[tuple[Leased, Reserved]] = (),
    ) -> None:
        """One heartbeat: renew the leases of the running jobs (and ``also``, jobs claimed
        but not started or finished but not acknowledged), one call per driver; a
        driver's error goes to ``on_error``."""
        by_driver: dict[int, tuple[Leased, list[Reserved]]] = {}
        for leased, job in [*self._leased(), *also]:
            by_driver.setdefault(id(leased), (leased, []))[1].append(job)
        for leased, jobs in by_driver.values():
            try:
                await leased.heartbeat(jobs)
            except Exception as e:
                on_error(e)

    def _leased(self) -> list[tuple[Leased, Reserved]]:
        """The running jobs whose lease a driver renews."""
        return [(leased, job) for leased, job in self._running.values() if leased is not None]

    async def keep_leases(
        self,
        interval: float,
        on_error: Callable[[Exception], None],
        *,
        alive: Callable[[], bool] = lambda: True,
        also: Callable[[], Iterable[tuple[Leased, Reserved]]] = lambda: (),
        late: Callable[[float, int], None] | None = None,
    ) -> None:
        """``renew`` every ``interval`` seconds while ``alive()`` (or until cancelled).

        Each round is due ``interval`` after the previous one was due, not after it
        ended: a round that takes long (thousands of leases, a loaded server) does not
        push every later one back by its own length. ``late(behind, leases)``: a round
        ended more than ``interval`` after it was due (the event loop woke it late, or
        renewing took that long), so leases may run out before the next one."""
        # Ends on the flag, not only on cancel(): a client library can swallow a
        # cancellation that lands mid-command, and a task that outlives its consumer
        # would keep asyncio.run() from returning.
        loop = asyncio.get_running_loop()
        due = loop.time() + interval
        while alive():
            await asyncio.sleep(max(0.0, due - loop.time()))
            if not alive():
                return
            extra = list(also())
            await self.renew(on_error, extra)
            ended = loop.time()
            leases = len(self._running) + len(extra)
            # a round with nothing to renew cannot lose a lease, however late it ran
            if late is not None and leases and ended - due > interval:
                late(ended - due, leases)
            # Behind schedule: the next round at once.
            due = max(due + interval, ended)
