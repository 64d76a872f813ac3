"""Administration of an app's queues: failed jobs (list, retry, forget, flush), sizes,
purges, and whether an error means a backend is down (the CLI and dashboard)."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from haze._kernel.errors import BackendUnavailableError, MessageDecodeError
from haze._kernel.message import Message, decode, encode
from haze.contracts.driver import Driver, FailedJob, unavailable

if TYPE_CHECKING:
    from haze._app.app import App

__all__ = ["Admin"]

log = logging.getLogger("haze")
_time = time.time
#: What a failed record adds to the stored message's meta, dropped when it is retried.
_FAILURE_META = frozenset(("failed_attempt", "failed_exception"))


class Admin:
    """Failed jobs and queue sizes of one app."""

    def __init__(
        self,
        app: App,
        run_inline: Callable[[Message, str, Driver], Awaitable[None]],
        ensure_local_worker: Callable[[str], None],
    ) -> None:
        self.app = app
        self.run_inline = run_inline
        self.ensure_local_worker = ensure_local_worker

    def unavailable(self, error: BaseException) -> BackendUnavailableError | None:
        """``error`` as a one-line ``BackendUnavailableError`` when it says the backend of
        a connection this app has used cannot be reached (the CLI's one-line errors)."""
        for driver in list(self.app._drivers.values()):
            down = unavailable(driver, error)
            if down is not None:
                return down
        return None

    async def failed(
        self, connection: str | None = None, queue: str | None = None
    ) -> list[FailedJob]:
        return await self.app.driver(connection).failed.list(queue)

    async def retry(
        self,
        ids: str | Sequence[str] | None = None,
        *,
        connection: str | None = None,
        queue: str | None = None,
    ) -> list[str]:
        """Put failed jobs back on their queue (all when ``ids`` is None); returns their ids."""
        driver = self.app.driver(connection)
        if ids is None or ids == "all":
            records = await driver.failed.list(queue)
        else:
            wanted = [ids] if isinstance(ids, str) else list(ids)
            records = []
            for i in wanted:
                rec = await driver.failed.find(i)
                if rec is None:
                    raise LookupError(f'no failed job with id "{i}" on connection "{driver.name}"')
                records.append(rec)
        done: list[str] = []
        for rec in records:
            if await self._requeue(rec, driver):
                await driver.failed.forget(rec.id)
                done.append(rec.id)
        return done

    async def _requeue(self, rec: FailedJob, driver: Driver) -> bool:
        try:
            message = decode(rec.body)
        except MessageDecodeError as e:
            log.error("failed job %s cannot be retried: %s", rec.id, e)
            return False
        message.attempts = 0
        message.ts = _time()
        if message.meta is not None and not _FAILURE_META.isdisjoint(message.meta):
            # A fresh run: its next failure records its own attempt and exception.
            message.meta = {k: v for k, v in message.meta.items() if k not in _FAILURE_META}
            message.meta = message.meta or None
        body = encode(message)
        target = (
            self.app.driver(message.connection or driver.name)
            if message.connection in self.app.queue_config.connections
            else driver
        )
        if target.inline:
            await self.run_inline(message, body, target)
        else:
            await target.enqueue(body, message, 0.0)
            if not target.remote:
                self.ensure_local_worker(target.name)
        return True

    async def forget(self, id: str, connection: str | None = None) -> bool:
        return await self.app.driver(connection).failed.forget(id)

    async def flush(
        self,
        connection: str | None = None,
        older_than: float | None = None,
        *,
        queue: str | None = None,
    ) -> int:
        """Delete failed jobs (older than ``older_than`` seconds, from ``queue``); returns
        how many."""
        failed = self.app.driver(connection).failed
        if queue is None:
            return await failed.flush(older_than)
        cutoff = _time() - (older_than or 0.0)
        n = 0
        for job in await failed.list(queue):
            if job.failed_at <= cutoff and await failed.forget(job.id):
                n += 1
        return n

    async def size(self, queue: str | None = None, connection: str | None = None) -> int:
        return await self.app.driver(connection).size(queue or "default")

    async def clear(self, queue: str | None = None, connection: str | None = None) -> int:
        return await self.app.driver(connection).purge(queue or "default")
