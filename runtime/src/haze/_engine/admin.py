"""Administration of an app's queues: failed jobs (list, retry, forget, flush), sizes,
purges, and whether an error means a backend is down (the CLI and dashboard)."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from haze._base.errors import BackendUnavailableError, MessageDecodeError
from haze._base.message import RETRIED, RETRY_CLAIM, Message, decode, encode, new_id
from haze._engine.offload import Offload, referenced
from haze.contracts.driver import Driver, FailedJob, unavailable
from haze.contracts.failed import RetriesAtomically, RetryClaims

if TYPE_CHECKING:
    from haze._engine.view import EngineApp

__all__ = ["RETRY_LEASE", "Admin"]

log = logging.getLogger("haze")
_time = time.time

#: Seconds a retry's claim on a failed record holds: a retry that died before it
#: queued the job leaves the record retryable again after this.
RETRY_LEASE = 15 * 60.0
#: What a failed record adds to the stored message's meta (the attempt it failed on, an
#: encrypted job's sealed error) and a retry's own claim: dropped when it is queued again.
_NOT_RETRIED = ("failed_attempt", "failed_exception", RETRY_CLAIM, RETRIED)


class Admin:
    """Failed jobs and queue sizes of one app."""

    def __init__(
        self,
        app: EngineApp,
        run_inline: Callable[[Message, str, Driver], Awaitable[None]],
        ensure_local_worker: Callable[[str], None],
        offload: Offload | None = None,
    ) -> None:
        self.app = app
        self.run_inline = run_inline
        self.ensure_local_worker = ensure_local_worker
        self.offload = offload if offload is not None else Offload(app)

    def unavailable(self, error: BaseException) -> BackendUnavailableError | None:
        """``error`` as a one-line ``BackendUnavailableError`` when it says the backend of
        a connection this app has used cannot be reached (the CLI's one-line errors)."""
        for driver in list(self.app.open_drivers().values()):
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
            if await self._retry_one(rec, driver, single=ids is not None and ids != "all"):
                done.append(rec.id)
        return done

    async def _retry_one(self, rec: FailedJob, driver: Driver, *, single: bool) -> bool:
        """Claim the record, queue its job, then delete the record (see ``RetryClaims``).

        If the process dies after the claim and before the job is queued, the record
        stays, and is retryable again when the claim's lease has passed. A store on the
        queue's own backend (``RetriesAtomically``) queues the job and deletes the record
        in one step. Elsewhere, a process that dies after queueing the job and before
        deleting the record leaves it claimed: the job's first run deletes it (the
        message carries the claim token), and if the lease ends first, a later retry
        queues the job again; of the two copies, the first to run takes a once-key of
        the record, and the other is dropped unrun.
        """
        try:
            message = decode(rec.body)
        except MessageDecodeError as e:
            log.error("failed job %s cannot be retried: %s", rec.id, e)
            return False
        failed = driver.failed
        if not isinstance(failed, RetryClaims):  # a third-party store: unclaimed
            await self._requeue(message, driver, None)
            await failed.forget(rec.id)
            return True
        token = new_id()
        claimed = await failed.claim_retry(rec.id, token, RETRY_LEASE)
        if claimed is None:
            if single:
                raise LookupError(
                    f'failed job "{rec.id}" on connection "{driver.name}" is being retried '
                    "by another caller, or is gone"
                )
            return False
        message = decode(claimed.body)
        if isinstance(failed, RetriesAtomically) and self._target(message, driver) is driver:
            body = self._fresh(message, driver, token, claimed.failed_at)
            if not await failed.requeue_claimed(rec.id, token, body, message):
                return False  # the claim ended and another caller took the record over
            if not driver.remote:
                self.ensure_local_worker(driver.name)
            return True
        await self._requeue(message, driver, token, claimed.failed_at)
        await failed.retried(rec.id, token)
        return True

    def _target(self, message: Message, driver: Driver) -> Driver:
        """The driver a retried job goes to: its own connection's, when the app has it."""
        if message.connection in self.app.queue_config.connections:
            return self.app.driver(message.connection or driver.name)
        return driver

    @staticmethod
    def _fresh(
        message: Message, driver: Driver, token: str | None, record: float | None = None
    ) -> str:
        """``message`` made a fresh run (no attempts, no failure meta), encoded."""
        message.attempts = 0
        message.ts = _time()
        meta = {
            k: v for k, v in (message.meta or {}).items() if k not in _NOT_RETRIED
        }  # a fresh run: its next failure records its own attempt
        if token is not None:
            meta[RETRIED] = {"token": token, "connection": driver.name}
            # The record's failure time rides along: two copies of one retry (a retry
            # that died after queueing, and the one that took its claim over) run once.
            if record is not None:
                meta[RETRIED]["record"] = record
        message.meta = meta or None
        return encode(message)

    async def _requeue(
        self, message: Message, driver: Driver, token: str | None, record: float | None = None
    ) -> None:
        body = self._fresh(message, driver, token, record)
        target = self._target(message, driver)
        if target.inline:
            await self.run_inline(message, body, target)
        else:
            await target.enqueue(body, message, 0.0)
            if not target.remote:
                self.ensure_local_worker(target.name)

    async def forget(self, id: str, connection: str | None = None) -> bool:
        """Delete a failed record, then its offloaded payload (a crash between the two
        leaves an orphan for ``queue:prune-offload``, never a record without its
        payload)."""
        driver = self.app.driver(connection)
        offloads = self.offload.plan(driver.name) is not None
        record = await driver.failed.find(id) if offloads else None
        gone = await driver.failed.forget(id)
        if gone and record is not None:
            await self.offload.forgotten([record], driver.name)
        return gone

    async def flush(
        self,
        connection: str | None = None,
        older_than: float | None = None,
        *,
        queue: str | None = None,
    ) -> int:
        """Delete failed jobs (older than ``older_than`` seconds, from ``queue``); returns
        how many. Their offloaded payloads go with them."""
        driver = self.app.driver(connection)
        failed = driver.failed
        cutoff = _time() - (older_than or 0.0)
        if queue is None and self.offload.plan(driver.name) is None:
            return await failed.flush(older_than)
        n = 0
        for job in await failed.list(queue):
            if job.failed_at <= cutoff and await failed.forget(job.id):
                await self.offload.forgotten([job], driver.name)
                n += 1
        return n

    async def prune_offload(
        self,
        older_than: float,
        connection: str | None = None,
        spare: Callable[[str], Awaitable[bool]] | None = None,
    ) -> int:
        """Delete the offloaded payloads of ``connection`` written more than
        ``older_than`` seconds ago that no failed record refers to and ``spare`` does not
        keep; returns how many."""
        driver = self.app.driver(connection)
        keep = referenced(await driver.failed.list(None))
        return await self.offload.prune(driver.name, older_than, keep, spare)

    async def size(self, queue: str | None = None, connection: str | None = None) -> int:
        return await self.app.driver(connection).size(queue or "default")

    async def clear(self, queue: str | None = None, connection: str | None = None) -> int:
        return await self.app.driver(connection).purge(queue or "default")
