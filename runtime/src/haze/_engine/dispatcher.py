"""The dispatch path, once for every driver: build -> encode -> defer -> sink.

build message ─ (after-commit in a transaction? defer to COMMIT) ─ debounce
─ unique lock ─ sink: the app's recorder (a test fake), or the status record
then driver.enqueue (an inline driver runs the job now)
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from haze._jobs.context import _tenant
from haze._jobs.definition import DispatchResult, PendingDispatch
from haze._kernel.crypto import encrypt_payload, seal, unseal
from haze._kernel.durations import check_delay
from haze._kernel.errors import PayloadTooLargeError
from haze._kernel.message import (
    MAX_QUEUE_NAME,
    Message,
    check_queue_name,
    encode,
    encode_payload,
    encode_plain,
    new_id,
)
from haze.contracts.driver import KeepsMessages, unavailable
from haze.transactions import current_transaction

if TYPE_CHECKING:
    from haze._engine.locks import Locks
    from haze._engine.otel import TelemetrySlot
    from haze._engine.tracking import Tracking
    from haze._engine.view import EngineApp
    from haze._jobs.definition import JobDefinition
    from haze.contracts.driver import Driver

__all__ = ["Dispatcher"]

log = logging.getLogger("haze")
_time = time.time

#: Runs a message now, in the caller's context (the ``sync`` driver).
RunInline = Callable[[Message, str, "Driver"], Awaitable[None]]
Batch = list[tuple[str, Message, float]]


class Dispatcher:
    """Dispatch for one app."""

    def __init__(
        self,
        app: EngineApp,
        locks: Locks,
        tracking: Tracking,
        telemetry: TelemetrySlot,
        *,
        run_inline: RunInline,
        ensure_local_worker: Callable[[str], None],
        warn_implicit: Callable[[], None],
    ) -> None:
        self.app = app
        self.locks = locks
        self.tracking = tracking
        self.telemetry = telemetry
        self.run_inline = run_inline
        self.ensure_local_worker = ensure_local_worker
        self.warn_implicit = warn_implicit
        #: id(driver) -> (driver, the driver if it keeps plain messages): checked once
        self._keepers: dict[int, tuple[Driver, KeepsMessages | None]] = {}

    # ------------------------------------------------------------ build and encode

    def resolve(
        self,
        pending: PendingDispatch[Any],
        *,
        queue: str | None = None,
        connection: str | None = None,
    ) -> tuple[str, str]:
        """Connection and queue by precedence: pending > chain/batch > define_job > config."""
        job = pending.job
        conn = self.app.connection_name(pending._connection or connection or job.connection)
        q = pending._queue or queue or job.queue or "default"
        return conn, q

    def build(
        self,
        pending: PendingDispatch[Any],
        connection: str,
        queue: str,
        *,
        id: str | None = None,
        chain: list[dict[str, Any]] | None = None,
        chain_id: str | None = None,
        chain_catch: list[dict[str, Any]] | None = None,
        batch_id: str | None = None,
        attempts: int = 0,
        meta: dict[str, Any] | None = None,
    ) -> Message:
        job = pending.job
        if queue.__class__ is not str or not 0 < len(queue) <= MAX_QUEUE_NAME or "," in queue:
            check_queue_name(queue, f'job "{job.name}": queue')  # raises, saying why
        payload = job.to_wire(pending.payload)
        if pending._group is not None:
            meta = {**(meta or {}), "group": pending._group}
        track = self.tracking.meta_for(job)
        if track is not None:
            meta = {**(meta or {}), **track}
        # Positional, in field order (as in Message.from_dict): keywords cost more.
        return Message(
            id or new_id(),  # id
            job.name,  # job
            payload,  # payload
            queue,  # queue
            connection,  # connection
            _time(),  # ts
            attempts,  # attempts
            _tenant.get(),  # tenant
            chain,  # chain
            chain_id,  # chain_id
            chain_catch,  # chain_catch
            batch_id,  # batch_id
            None,  # unique
            meta,  # meta
        )

    def encode(self, message: Message, driver: Driver, job: JobDefinition[Any]) -> str:
        if job.encrypted:
            # Encrypt a copy: the message keeps its plain payload for unique/debounce key
            # functions, the fake's assertions and inline runs.
            message = copy.copy(message)
            encrypt_payload(self.app, message)
        return self._checked_size(encode(message), driver, job)

    @staticmethod
    def _checked_size(body: str, driver: Driver, job: JobDefinition[Any]) -> str:
        limit = driver.max_message_size
        if limit is not None:
            size = len(body) if body.isascii() else len(body.encode("utf-8"))
            if size > limit:
                raise PayloadTooLargeError(
                    f'job "{job.name}": the message is {size} bytes, over the {limit}-byte limit '
                    f'of connection "{driver.name}"; pass ids instead of data (nothing was '
                    "enqueued)"
                )
        return body

    # ------------------------------------------------------------ one dispatch

    async def dispatch(
        self,
        pending: PendingDispatch[Any],
        *,
        queue: str | None = None,
        connection: str | None = None,
        chain: list[dict[str, Any]] | None = None,
        chain_id: str | None = None,
        chain_catch: list[dict[str, Any]] | None = None,
        batch_id: str | None = None,
        attempts: int = 0,
        id: str | None = None,
        defer: bool = True,
        meta: dict[str, Any] | None = None,
    ) -> DispatchResult:
        """Queue one pending dispatch (the path under ``Job.dispatch`` and ``with_().dispatch``)."""
        job = pending.job
        conn, q = self.resolve(pending, queue=queue, connection=connection)
        after_commit = (
            pending._after_commit if pending._after_commit is not None else job.after_commit
        )
        message = self.build(
            pending,
            conn,
            q,
            id=id,
            chain=chain,
            chain_id=chain_id,
            chain_catch=chain_catch,
            batch_id=batch_id,
            attempts=attempts,
            meta=meta,
        )
        # The option name is only formatted when there is a delay to check.
        delay = check_delay(pending._delay, f'job "{job.name}": delay') if pending._delay else 0.0
        if defer and after_commit:
            tx = current_transaction()
            if tx is not None:
                encode(message)  # a payload JSON cannot carry raises TypeError now, not at COMMIT
                return self._defer(tx, message, job, delay)
        if self.telemetry.get() is not None and self.app.recorder is None:
            return await self.send(message, job, delay)
        return await self._send_now(message, job, delay)  # what send() does with no span

    def _defer(
        self, tx: Any, message: Message, job: JobDefinition[Any], delay: float
    ) -> DispatchResult:
        sealed: str | None = None
        if job.encrypted:
            # The buffer lives until COMMIT: it holds the payload encrypted, like the queue.
            sealed, message.payload = seal(self.app, message.payload, f"buffer:{message.id}"), None

        async def later() -> None:
            try:
                if sealed is not None:
                    message.payload = unseal(self.app, sealed, f"buffer:{message.id}", job.name)
                await self.send(message, job, delay)
            except Exception:
                log.exception('after-commit dispatch of job "%s" (%s) failed', job.name, message.id)

        tx.on_commit(later)
        return DispatchResult(message.id, skipped=False, deferred=True, chain_id=message.chain_id)

    async def send(self, message: Message, job: JobDefinition[Any], delay: float) -> DispatchResult:
        """The message is built: lock, then hand it to the sink (in a producer span)."""
        otel = self.telemetry.get()
        if otel is not None and self.app.recorder is None:
            result: DispatchResult = await otel.send(
                message, delay, lambda: self._send_now(message, job, delay)
            )
            return result
        return await self._send_now(message, job, delay)

    async def _send_now(
        self, message: Message, job: JobDefinition[Any], delay: float
    ) -> DispatchResult:
        recorder = self.app.recorder
        assert message.connection is not None
        if self.app.implicit and recorder is None:
            self.warn_implicit()
        driver = self.app.driver(message.connection)
        if recorder is None and job.debounce is None and job.unique is None:
            keeper = self._keeper(driver)
            if keeper is not None and not job.encrypted and not driver.inline and _plain(message):
                # _sink, minus its frame: no status record or lock to write or undo
                payload = encode_payload(message.payload)
                body = self._checked_size(encode_plain(message, payload), driver, job)
                keeper.keep_next(message, body, payload)
                try:
                    await driver.enqueue(body, message, delay)
                except Exception as e:
                    down = unavailable(driver, e)
                    if down is None:
                        raise
                    raise down from None
                if not driver.remote:
                    self.ensure_local_worker(driver.name)
                return DispatchResult(message.id, chain_id=message.chain_id)
        body = self.encode(message, driver, job)
        if job.debounce is not None and message.batch_id is None:
            delay = await self.locks.debounce(job, message, delay)
            body = self.encode(message, driver, job)  # now carries meta.debounce
        if job.unique is not None and message.batch_id is None:
            holder = await self.locks.lock(job, message, driver)
            if holder is not None:
                if recorder is not None:
                    recorder.record_skipped(job, message)
                return DispatchResult(holder, skipped=True, chain_id=message.chain_id)
            try:
                body = self.encode(message, driver, job)  # now carries the lock
            except BaseException:
                # Too large with the lock's few bytes: a lock held for a job that was
                # never queued would block every dispatch until it expires.
                await self.locks.unlock(message)
                raise
        if recorder is not None:
            recorder.record(job, message, delay)
            return DispatchResult(message.id, chain_id=message.chain_id)
        await self._sink(message, body, driver, delay)
        return DispatchResult(message.id, chain_id=message.chain_id)

    def _keeper(self, driver: Driver) -> KeepsMessages | None:
        """``driver`` if it can keep plain messages (checked once per driver)."""
        got = self._keepers.get(id(driver))
        if got is None or got[0] is not driver:
            keeps = driver if isinstance(driver, KeepsMessages) else None
            got = self._keepers[id(driver)] = (driver, keeps)
        return got[1]

    async def _sink(self, message: Message, body: str, driver: Driver, delay: float) -> None:
        """The status record, then the driver (or the inline run)."""
        tracked = message.meta is not None and "track" in message.meta
        if tracked:
            await self.tracking.queued(message, delay)
        try:
            if driver.inline:
                await self.run_inline(message, body, driver)
            else:
                await driver.enqueue(body, message, delay)
        except BaseException as e:
            if not driver.inline:
                await self._undo(message, tracked)
            down = unavailable(driver, e) if isinstance(e, Exception) else None
            if down is not None and not driver.inline:
                raise down from None  # one line, not the client library's traceback chain
            raise
        if not driver.remote and not driver.inline:
            self.ensure_local_worker(driver.name)

    async def _undo(self, message: Message, tracked: bool) -> None:
        """The enqueue failed: no record or lock may outlive a job that was not queued."""
        if tracked:
            await self.tracking.state_store().delete(f"haze:status:{message.id}")
        if message.unique is not None:
            await self.locks.unlock(message)

    # ------------------------------------------------------------ many dispatches

    async def bulk(
        self,
        pendings: Sequence[PendingDispatch[Any]],
        *,
        queue: str | None = None,
        connection: str | None = None,
        batch_id: str | None = None,
    ) -> list[str]:
        """Queue many jobs, grouped by connection with each driver's batch primitive.

        Jobs that need more than a plain enqueue (unique or debounced outside a batch, an
        after-commit dispatch inside a transaction, a test recorder) go one by one."""
        groups: dict[str, Batch] = {}
        ids: list[str] = []
        singles: list[PendingDispatch[Any]] = []
        in_tx = current_transaction() is not None
        for p in pendings:
            if not isinstance(p, PendingDispatch):
                raise TypeError(f"Queue.bulk: expected job.with_(payload) items, got {p!r}")
            if self._alone(p, batch_id, in_tx):
                singles.append(p)
                ids.append("")
                continue
            conn, message, item = self._grouped(p, queue, connection, batch_id)
            groups.setdefault(conn, []).append(item)
            ids.append(message.id)
        if groups and self.app.implicit:
            self.warn_implicit()
        for conn, items in groups.items():
            await self._enqueue_many(conn, items)
        if singles:
            it = iter(singles)
            for i, v in enumerate(ids):
                if v == "":
                    sent = await self.dispatch(
                        next(it), queue=queue, connection=connection, batch_id=batch_id
                    )
                    ids[i] = sent.id
        return ids

    def _alone(self, p: PendingDispatch[Any], batch_id: str | None, in_tx: bool) -> bool:
        job = p.job
        after_commit = p._after_commit if p._after_commit is not None else job.after_commit
        return (
            (batch_id is None and (job.unique is not None or job.debounce is not None))
            or self.app.recorder is not None
            or (in_tx and after_commit)
        )

    def _grouped(
        self,
        p: PendingDispatch[Any],
        queue: str | None,
        connection: str | None,
        batch_id: str | None,
    ) -> tuple[str, Message, tuple[str, Message, float]]:
        job = p.job
        conn, q = self.resolve(p, queue=queue, connection=connection)
        message = self.build(p, conn, q, batch_id=batch_id)
        otel = self.telemetry.get()
        if otel is not None:
            otel.created(message)
        body = self.encode(message, self.app.driver(conn), job)
        delay = check_delay(p._delay or 0.0, f'job "{job.name}": delay')
        return conn, message, (body, message, delay)

    async def _enqueue_many(self, conn: str, items: Batch) -> None:
        driver = self.app.driver(conn)
        for _, message, delay in items:
            if message.meta is not None and "track" in message.meta:
                await self.tracking.queued(message, delay)
        if driver.inline:
            for body, message, _ in items:
                await self.run_inline(message, body, driver)
            return
        try:
            await driver.enqueue_many(items)
        except Exception as e:
            down = unavailable(driver, e)
            if down is None:
                raise
            raise down from None
        if not driver.remote:
            self.ensure_local_worker(conn)


def _plain(message: Message) -> bool:
    """Nothing in the envelope but immutable fields and the payload (``KeepsMessages``)."""
    return (
        message.chain is None
        and message.chain_catch is None
        and message.chain_id is None
        and message.batch_id is None
        and message.unique is None
        and message.meta is None
        and message.enc is None
    )
