"""The queue manager: the dispatch path and the execution pipeline, once for every driver.

Follow one message::

    dispatch ─ build message ─ (after-commit? defer) ─ unique lock ─ driver.enqueue
    worker ─ driver.reserve ─ process:
        decode ─ unique(processing) ─ debounce ─ batch cancelled? ─ before
        ─ middleware → handle (timeout) ─ settle:
            success  → chain next ─ batch done ─ unique release ─ ack ─ after
            release  → driver.release(consume_attempt=False)
            retry    → driver.release(backoff, consume_attempt=True)
            failure  → failed() ─ driver.fail ─ unique release ─ chain catch ─ batch failed
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from haze import testing as _testing
from haze._engine.events import Events
from haze._jobs.context import JobContext, _tenant, current_tenant
from haze._jobs.definition import DispatchResult, JobDefinition, PendingDispatch, get_job
from haze._kernel.durations import MAX_DELAY, backoff_delay, check_delay
from haze._kernel.errors import (
    BackendUnavailableError,
    ConfigError,
    HazeError,
    JobTimeoutError,
    MaxAttemptsExceededError,
    MaxExceptionsError,
    MessageDecodeError,
    PayloadTooLargeError,
    RetryUntilExpiredError,
    UnknownJobError,
)
from haze._kernel.message import Message, check_queue_name, encode, new_id
from haze.contracts.driver import unavailable
from haze.transactions import current_transaction, wait_pending

if TYPE_CHECKING:
    from haze._app.app import App
    from haze._engine.otel import Telemetry
    from haze._engine.throughput import Tally
    from haze._runners.worker import Worker
    from haze.drivers import Driver, FailedJob, Reserved

__all__ = ["QueueManager", "events"]

log = logging.getLogger("haze")
job_log = logging.getLogger("haze.job")

#: Process-wide queue events (``Queue.on``): listeners registered at import time work
#: for every app.
events = Events()

_EMSCRIPTEN = sys.platform == "emscripten"
_CANCEL_POLL = 1.0  # = haze.status.CANCEL_POLL (not imported: untracked jobs never load it)
_DEBUG = logging.DEBUG
_perf = time.perf_counter
_time = time.time

Pipeline = Callable[[Any, JobContext], Awaitable[Any]]
_UNRESOLVED: Any = object()


class _Outcome:
    SUCCESS = "done"
    RELEASED = "released"
    RETRY = "retry"
    FAILED = "failed"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"


class QueueManager:
    """Dispatch and execution for one app. Chains, batches, unique locks, middleware,
    retries and callbacks are implemented here and nowhere else."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.events = events
        self._workers: dict[str, Worker] = {}
        self._pipelines: dict[JobDefinition[Any], Pipeline] = {}
        # Plain-function callbacks (sync/memory only): id -> callable.
        self._local_callbacks: dict[str, Callable[..., Any]] = {}
        self._warned_store: set[str] = set()  # what ("unique jobs", "batches") was warned
        self._otel: Any = _UNRESOLVED  # haze.otel.Telemetry, or None when telemetry is off
        self._tally: Tally | None = None  # finished jobs per queue not yet in the store
        # Status records and cancellation (haze.status): job -> its tracking meta (None:
        # untracked); the attempts running in this process; the cancel-marker poller.
        self._tracking: dict[JobDefinition[Any], dict[str, float] | None] = {}
        self._running: dict[str, JobContext] = {}
        self._watcher: asyncio.Task[None] | None = None
        self._hint_on = False  # a cancel may be outstanding: check markers before runs
        self._hint_at = 0.0  # when the hint was last read from the store
        self._final_events: dict[str, asyncio.Event] = {}

    def telemetry(self) -> Telemetry | None:
        """The app's OpenTelemetry recorder (None when off); decided at first use, so an
        SDK set up after the app was created still counts."""
        otel = self._otel
        if otel is _UNRESOLVED:
            from haze._engine.otel import telemetry_for

            otel = self._otel = telemetry_for(self.app)
        return otel  # type: ignore[no-any-return]

    # ================================================================ dispatch path

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
        check_queue_name(queue, f'job "{job.name}": queue')
        payload = job.to_wire(pending.payload)
        if pending._group is not None:
            meta = {**(meta or {}), "group": pending._group}
        track = self._tracking.get(job, _UNRESOLVED)
        if track is _UNRESOLVED:
            from haze._jobs.status import tracking

            track = self._tracking[job] = tracking(job.track, job.keep_result, self.app)
        if track is not None:
            meta = {**(meta or {}), **track}
        return Message(
            id=id or new_id(),
            job=job.name,
            payload=payload,
            queue=queue,
            connection=connection,
            ts=_time(),
            attempts=attempts,
            tenant=_tenant.get(),
            chain=chain,
            chain_id=chain_id,
            chain_catch=chain_catch,
            batch_id=batch_id,
            meta=meta,
        )

    def encode(self, message: Message, driver: Driver, job: JobDefinition[Any]) -> str:
        if job.encrypted:
            import copy

            from haze._kernel.crypto import encrypt_payload

            # Encrypt a copy: the message keeps its plain payload for unique/debounce key
            # functions, the fake's assertions and inline runs.
            message = copy.copy(message)
            encrypt_payload(self.app, message)
        body = encode(message)
        limit = driver.max_message_size
        if limit is not None:
            size = len(body.encode("utf-8"))
            if size > limit:
                raise PayloadTooLargeError(
                    f'job "{job.name}": the message is {size} bytes, over the {limit}-byte limit '
                    f'of connection "{driver.name}"; pass ids instead of data (nothing was '
                    "enqueued)"
                )
        return body

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
        delay = check_delay(pending._delay or 0.0, f'job "{job.name}": delay')
        if defer and after_commit:
            tx = current_transaction()
            if tx is not None:
                encode(message)  # a payload JSON cannot carry raises TypeError now, not at COMMIT
                return self._defer(tx, message, job, delay)
        return await self._send(message, job, delay)

    def _defer(
        self, tx: Any, message: Message, job: JobDefinition[Any], delay: float
    ) -> DispatchResult:
        sealed: str | None = None
        if job.encrypted:
            from haze._kernel.crypto import seal, unseal

            # The buffer lives until COMMIT: it holds the payload encrypted, like the queue.
            sealed, message.payload = seal(self.app, message.payload, f"buffer:{message.id}"), None

        async def later() -> None:
            try:
                if sealed is not None:
                    message.payload = unseal(self.app, sealed, f"buffer:{message.id}", job.name)
                await self._send(message, job, delay)
            except Exception:
                log.exception('after-commit dispatch of job "%s" (%s) failed', job.name, message.id)

        tx.on_commit(later)
        return DispatchResult(message.id, skipped=False, deferred=True, chain_id=message.chain_id)

    async def _send(
        self, message: Message, job: JobDefinition[Any], delay: float
    ) -> DispatchResult:
        otel: Telemetry | None = self._otel
        if otel is _UNRESOLVED:
            otel = self.telemetry()
        if otel is not None and _testing._active_fake is None:
            result: DispatchResult = await otel.send(
                message, delay, lambda: self._send_now(message, job, delay)
            )
            return result
        return await self._send_now(message, job, delay)

    async def _send_now(
        self, message: Message, job: JobDefinition[Any], delay: float
    ) -> DispatchResult:
        fake = _testing._active_fake
        assert message.connection is not None
        if self.app._implicit and fake is None:
            from haze._app.app import warn_implicit_dispatch

            warn_implicit_dispatch()
        driver = self.app.driver(message.connection)
        body = self.encode(message, driver, job)
        if job.debounce is not None and message.batch_id is None:
            delay = await self._debounce(job, message, delay, fake)
            body = self.encode(message, driver, job)  # now carries meta.debounce
        if job.unique is not None and message.batch_id is None:
            holder = await self._lock_unique(job, message, driver, fake)
            if holder is not None:
                if fake is not None:
                    fake.record_skipped(job, message)
                return DispatchResult(holder, skipped=True, chain_id=message.chain_id)
            try:
                body = self.encode(message, driver, job)  # now carries the lock
            except BaseException:
                # Too large with the lock's few bytes: a lock held for a job that was
                # never queued would block every dispatch until it expires.
                await self._unlock_unique(message)
                raise
        if fake is not None:
            fake.record(job, message, delay)
            return DispatchResult(message.id, chain_id=message.chain_id)
        tracked = message.meta is not None and "track" in message.meta
        if tracked:
            from haze._jobs.status import write

            # Before the enqueue: a worker's "running" must come after it.
            await write(self, message, "delayed" if delay > 0 else "queued", wait=delay)
        try:
            if driver.inline:
                await self.run_inline(message, body, driver)
            else:
                await driver.enqueue(body, message, delay)
        except BaseException as e:
            if tracked and not driver.inline:
                await self._state_store().delete(f"haze:status:{message.id}")
            if message.unique is not None and not driver.inline:
                await self._unlock_unique(message)
            down = unavailable(driver, e) if isinstance(e, Exception) else None
            if down is not None and not driver.inline:
                raise down from None  # one line, not the client library's traceback chain
            raise
        if not driver.remote and not driver.inline:
            self.ensure_local_worker(driver.name)
        return DispatchResult(message.id, chain_id=message.chain_id)

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
        after-commit dispatch inside a transaction, a test fake) go one by one."""
        groups: dict[str, list[tuple[str, Message, float]]] = {}
        ids: list[str] = []
        singles: list[PendingDispatch[Any]] = []
        in_tx = current_transaction() is not None
        otel = self.telemetry()
        for p in pendings:
            if not isinstance(p, PendingDispatch):
                raise TypeError(f"Queue.bulk: expected job.with_(payload) items, got {p!r}")
            job = p.job
            if (
                (batch_id is None and (job.unique is not None or job.debounce is not None))
                or _testing._active_fake
                or (
                    in_tx and (p._after_commit if p._after_commit is not None else job.after_commit)
                )
            ):
                singles.append(p)
                ids.append("")
                continue
            conn, q = self.resolve(p, queue=queue, connection=connection)
            message = self.build(p, conn, q, batch_id=batch_id)
            if otel is not None:
                otel.created(message)
            driver = self.app.driver(conn)
            body = self.encode(message, driver, job)
            delay = check_delay(p._delay or 0.0, f'job "{job.name}": delay')
            groups.setdefault(conn, []).append((body, message, delay))
            ids.append(message.id)
        if groups and self.app._implicit:
            from haze._app.app import warn_implicit_dispatch

            warn_implicit_dispatch()
        for conn, items in groups.items():
            driver = self.app.driver(conn)
            for _, message, delay in items:
                if message.meta is not None and "track" in message.meta:
                    from haze._jobs.status import write

                    await write(self, message, "delayed" if delay > 0 else "queued", wait=delay)
            if driver.inline:
                for body, message, _ in items:
                    await self.run_inline(message, body, driver)
            else:
                try:
                    await driver.enqueue_many(items)
                except Exception as e:
                    down = unavailable(driver, e)
                    if down is None:
                        raise
                    raise down from None
                if not driver.remote:
                    self.ensure_local_worker(conn)
        if singles:
            it = iter(singles)
            for i, v in enumerate(ids):
                if v == "":
                    sent = await self.dispatch(
                        next(it), queue=queue, connection=connection, batch_id=batch_id
                    )
                    ids[i] = sent.id
        return ids

    # ---------------------------------------------------------------- unique locks

    def _key_suffix(self, job: JobDefinition[Any], value: object) -> str:
        """A lock key's last part: the key function's value, or for an encrypted job a
        keyed hash of it (the value is often a field of the secret payload)."""
        if not job.encrypted:
            return str(value)
        from haze._kernel.crypto import keyed_digest

        return keyed_digest(self.app, str(value))

    def scoped_key(self, kind: str, *parts: object) -> str:
        """A store key scoped by the current tenant (locks and middleware state)."""
        tenant = current_tenant()
        rest = ":".join(str(p) for p in parts)
        return f"haze:{kind}:{tenant}:{rest}" if tenant else f"haze:{kind}:{rest}"

    async def _lock_unique(
        self, job: JobDefinition[Any], message: Message, driver: Driver, fake: Any
    ) -> str | None:
        """Take the unique lock for ``message``; returns the holder's id when it is taken."""
        opts = job.unique
        assert opts is not None
        suffix = ""
        if opts.key is not None:
            value = opts.key(job.from_wire(message.payload))
            if inspect.isawaitable(value):
                value = await value
            suffix = self._key_suffix(job, value)
        key = self.scoped_key("unique", job.name, suffix)
        store = fake.store if fake is not None else self.app.queue_store
        if fake is None:
            self._check_lock_store(store, driver, "unique jobs")
        # The holder's lock can expire between a failed add and the get: try again
        # rather than report a skip with no holder id.
        for _ in range(3):
            if await store.add(key, message.id, opts.ttl):
                message.unique = {"key": key, "until": opts.until}
                return None
            holder = await store.get(key)
            if holder is not None:
                return str(holder)
        raise HazeError(
            f'job "{job.name}": the unique lock {key!r} kept changing hands; dispatch again'
        )

    async def _unlock_unique(self, message: Message) -> None:
        if message.unique is None:
            return
        fake = _testing._active_fake
        store = fake.store if fake is not None else self.app.queue_store
        try:
            await store.delete(message.unique["key"], owner=message.id)
        except Exception:
            log.exception("could not release unique lock %s", message.unique.get("key"))

    def _check_lock_store(self, store: Any, driver: Driver, what: str) -> None:
        if what in self._warned_store:
            return
        if driver.remote and not getattr(store, "shared", False):
            self._warned_store.add(what)
            lost = (
                "which cannot release locks taken here; later dispatches will be skipped until "
                "the lock expires"
                if what == "unique jobs"
                else "which cannot see them: a batch's then/catch/finally callbacks never run"
            )
            log.warning(
                'The "%s" store holds %s, but connection "%s" is consumed by other processes, '
                "%s. Set store='redis' (or 'database') in config/queue.py.",
                store.name,
                what,
                driver.name,
                lost,
            )
        elif not getattr(store, "atomic", True):
            self._warned_store.add(what)
            log.warning(
                'The "%s" store is not atomic: %s may be held twice. Use redis or database.',
                store.name,
                what,
            )

    async def _debounce(
        self, job: JobDefinition[Any], message: Message, delay: float, fake: Any
    ) -> float:
        opts = job.debounce
        assert opts is not None
        suffix = ""
        if opts.key is not None:
            value = opts.key(job.from_wire(message.payload))
            if inspect.isawaitable(value):
                value = await value
            suffix = self._key_suffix(job, value)
        key = self.scoped_key("debounce", job.name, suffix)
        store = fake.store if fake is not None else self.app.queue_store
        now = _time()
        wait = max(delay, opts.wait)
        ttl = (opts.max_wait or opts.wait) + wait + 60
        if opts.max_wait is not None:
            await store.add(key + ":first", now, ttl)
            first = await store.get(key + ":first")
            if first is not None:
                wait = max(0.0, min(wait, float(first) + opts.max_wait - now))
        await store.put(key, message.id, ttl)
        message.meta = {**(message.meta or {}), "debounce": key}
        return wait

    # ================================================================ local workers

    def ensure_local_worker(self, connection: str) -> None:
        """Make sure an in-process consumer runs for a memory connection on this loop."""
        worker = self._workers.get(connection)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if worker is not None and worker.loop is loop and not worker.stopping:
            return
        from haze._runners.worker import Worker

        driver = self.app.driver(connection)
        concurrency = getattr(driver, "concurrency", 1)
        worker = Worker(self.app, connection, None, concurrency)
        self._workers[connection] = worker
        worker.start()

    async def stop_local_workers(self) -> None:
        """Stop this loop's in-process consumers after their running jobs. Queued jobs
        stay in their memory driver: the next dispatch starts a consumer again (a Lambda
        invocation ends with no task left on its loop)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # pragma: no cover
            loop = None
        stopping = {n: w for n, w in self._workers.items() if w.loop is loop}
        await asyncio.gather(*(w.stop() for w in stopping.values()), return_exceptions=True)
        for name, worker in stopping.items():
            if self._workers.get(name) is worker:
                del self._workers[name]
        watcher = self._watcher
        if watcher is not None and watcher.get_loop() is loop:
            self._watcher = None
            watcher.cancel()

    async def shutdown(self) -> None:
        """Stop local consumers after their running jobs; warn about what is lost."""
        await self.stop_local_workers()
        self._workers.clear()
        if self._tally is not None:
            await self._tally.flush()
        for name, driver in self.app._drivers.items():
            waiting = getattr(driver, "waiting", None)
            if waiting is not None and not driver.remote:
                n = waiting()
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
            for name, driver in list(self.app._drivers.items()):
                wait_idle = getattr(driver, "wait_idle", None)
                if wait_idle is None or driver.remote:
                    continue
                if driver.pending():  # type: ignore[attr-defined]
                    busy = True
                    self.ensure_local_worker(name)
                    await wait_idle()
            if not busy:
                await wait_pending()
                if not any(
                    getattr(d, "pending", lambda: 0)()
                    for d in self.app._drivers.values()
                    if not d.remote
                ):
                    return

    # ================================================================ execution

    def pipeline(self, job: JobDefinition[Any]) -> Pipeline:
        """Global middleware, then the job's own, then the handler: composed once per job."""
        p = self._pipelines.get(job)
        if p is None:
            from haze._orchestration.middleware import queue_limits

            p = self._pipelines[job] = _compose(
                [*queue_limits(self.app), *self.app.queue_config.middleware, *job.middleware], job
            )
        return p

    async def run_inline(self, message: Message, body: str, driver: Driver) -> None:
        """The ``sync`` driver: run now in the caller's context; raise a final failure."""
        reserved = _reserved(message, body)
        outcome, error = await self._process(reserved, driver, inline=True)
        if outcome == _Outcome.FAILED and error is not None:
            raise error

    async def process(self, reserved: Reserved, driver: Driver) -> str:
        """Run one claimed message to its outcome; never raises for job errors."""
        started, clock = _time(), time.perf_counter()
        outcome, _ = await self._process(reserved, driver, inline=False)
        if driver.remote:
            # Jobs per minute for queue:stats/top, written to the store every few seconds.
            tally = self._tally
            if tally is None:
                from haze._engine.throughput import Tally

                tally = self._tally = Tally(self.app)
            message = reserved.message
            if tally.add(
                driver.name,
                reserved.queue,
                outcome,
                job=message.job if message is not None else None,
                wait=started - message.ts if message is not None and message.ts else None,
                runtime=time.perf_counter() - clock,
            ):
                await tally.flush()
        return outcome

    async def _process(
        self, reserved: Reserved, driver: Driver, *, inline: bool
    ) -> tuple[str, BaseException | None]:
        message = reserved.message
        if message is None:
            err = reserved.error or MessageDecodeError("message could not be decoded")
            await self._fail_undecodable(reserved, driver, err)
            return _Outcome.FAILED, err
        try:
            job = get_job(message.job)
        except UnknownJobError as e:
            await self._fail_undecodable(reserved, driver, e)
            return _Outcome.FAILED, e
        app_token = (_app_var or _bind_app_var()).set(self.app)
        tenant_token = _tenant.set(message.tenant)
        try:
            otel: Telemetry | None = self._otel
            if otel is _UNRESOLVED:
                otel = self.telemetry()
            if otel is not None:
                return await otel.process(
                    job,
                    message,
                    reserved,
                    driver,
                    lambda: self._run(job, message, reserved, driver, inline),
                )
            return await self._run(job, message, reserved, driver, inline)
        finally:
            _tenant.reset(tenant_token)
            _app_var.reset(app_token)

    async def _run(
        self,
        job: JobDefinition[Any],
        message: Message,
        reserved: Reserved,
        driver: Driver,
        inline: bool,
    ) -> tuple[str, BaseException | None]:
        tries = job.tries
        ctx = JobContext(
            id=message.id,
            name=job.name,
            attempt=reserved.attempt,
            tries=tries,
            queue=message.queue,
            connection=driver.name,
            app=self.app,
            message=message,
        )
        try:
            payload = self._payload(job, message)
        except Exception as e:
            return await self._final(job, message, reserved, driver, ctx, None, e, inline)
        if reserved.attempt > tries and job.retry_until is None and not inline:
            # Reclaimed after a worker crash with no try left: fail it, do not run it again.
            err = MaxAttemptsExceededError(
                f'Job "{job.name}" was claimed for attempt {reserved.attempt} of {tries}: its '
                "worker stopped (crash or retry_after passed) after using the last try"
            )
            return await self._final(job, message, reserved, driver, ctx, payload, err, inline)

        if message.unique is not None and message.unique.get("until") == "processing":
            await self._unlock_unique(message)
            message.unique = None
        if message.meta is not None and "debounce" in message.meta:
            store = self._state_store()
            latest = await store.get(message.meta["debounce"])
            max_wait = job.debounce.max_wait if job.debounce is not None else None
            if latest is not None and latest != message.id:
                # superseded: skip, unless the burst has waited max_wait already (a stream
                # of dispatches faster than the workers must not postpone the job forever)
                first = None
                if max_wait is not None:
                    first = await store.get(message.meta["debounce"] + ":first")
                if first is None or max_wait is None or _time() < float(first) + max_wait:
                    await self._ack(driver, reserved)
                    if "track" in message.meta:
                        await self._track(message, ctx, "cancelled", error="superseded (debounce)")
                    return _Outcome.SKIPPED, None
            if max_wait is not None:
                # the burst is over: the next dispatch starts a new max_wait window
                await store.delete(message.meta["debounce"] + ":first")
        if message.batch_id is not None:
            from haze._orchestration.batches import load_for_job

            batch = await load_for_job(self, message.batch_id)
            ctx._batch = batch
            if batch is not None and batch.cancelled:
                await self._settle_batch(message, "skipped", None)
                await self._unlock_unique(message)
                await self._ack(driver, reserved)
                if message.meta is not None and "track" in message.meta:
                    await self._track(message, ctx, "cancelled", error="its batch was cancelled")
                return _Outcome.SKIPPED, None
        once = message.meta.get("once") if message.meta is not None else None
        if isinstance(once, str):
            from haze._orchestration.batches import claim_once

            if not await claim_once(self, once, message.id):
                log.info('Job "%s" (%s) skipped: its callback already ran', job.name, message.id)
                await self._unlock_unique(message)
                await self._ack(driver, reserved)
                return _Outcome.SKIPPED, None

        track = message.meta.get("track") if message.meta is not None else None
        if (
            track is not None or self._hint_on or _time() - self._hint_at > _CANCEL_POLL
        ) and await self._cancel_seen(message, track is not None, reserved.attempt):
            return await self._cancelled(job, message, reserved, driver, ctx, None)
        if self.events.before:
            await self.events.emit("before", ctx)
        if job_log.isEnabledFor(_DEBUG):
            # ``state`` marks the lifecycle records `haze queue:work` prints as job lines.
            job_log.debug(
                'Job "%s" running (attempt %d/%d)',
                job.name,
                reserved.attempt,
                tries,
                extra={
                    "job": job.name,
                    "job_id": message.id,
                    "attempt": reserved.attempt,
                    "state": "running",
                },
            )
        started = _perf()
        error: BaseException | None = None
        result: Any = None
        running = self._running
        running[message.id] = ctx
        if self._watcher is None and not inline:
            self._watch_cancels()
        try:
            if job.timeout is None:
                result = await self.pipeline(job)(payload, ctx)
            else:
                result = await self._with_timeout(job, payload, ctx)
        except Exception as e:
            error = e.error if isinstance(e, _Contained) else e
        except asyncio.CancelledError as e:
            task = asyncio.current_task()
            if task is None or task.cancelling():
                # The worker itself is being cancelled: put the job back untouched.
                owned = await driver.release(reserved, 0.0, consume_attempt=False)
                self._owned(owned, reserved, "release")
                raise
            error = e  # raised by the job's own code, not a cancellation of this worker
        except GeneratorExit:
            raise  # the coroutine itself is being closed: it must not go on
        except BaseException as e:
            # KeyboardInterrupt, SystemExit ... raised by job code: that job's failure (the
            # worker's own signals never get here: its handlers stop it without raising).
            error = e
        finally:
            if running.get(message.id) is ctx:
                del running[message.id]
        elapsed = _perf() - started

        if error is not None and ctx._signal is not None and ctx.cancelled():
            # Stopped after Queue.cancel(): cancelled, not failed (no retry, no failed()).
            return await self._cancelled(job, message, reserved, driver, ctx, error)
        if ctx._fail_error is not None:
            return await self._final(
                job, message, reserved, driver, ctx, payload, ctx._fail_error, inline
            )
        if error is not None:
            return await self._failure(job, message, reserved, driver, ctx, payload, error, inline)
        if ctx._release_delay is not None:
            if inline:
                log.warning(
                    'Job "%s" (%s) called release() on the sync connection, which cannot run '
                    "it later; the job was dropped.",
                    job.name,
                    message.id,
                )
                await self._unlock_unique(message)
                return _Outcome.RELEASED, None
            if job_log.isEnabledFor(_DEBUG):
                job_log.debug(
                    'Job "%s" released, back in %gs',
                    job.name,
                    ctx._release_delay,
                    extra={
                        "job": job.name,
                        "job_id": message.id,
                        "attempt": reserved.attempt,
                        "state": "released",
                        "retry_in": ctx._release_delay,
                    },
                )
            if self._otel is not None:
                self._otel.releasing(ctx._release_delay)
            owned = await driver.release(reserved, ctx._release_delay, consume_attempt=False)
            self._owned(owned, reserved, "release")
            if track is not None:
                wait = ctx._release_delay
                await self._track(message, ctx, "delayed" if wait > 0 else "queued", wait=wait)
            return _Outcome.RELEASED, None

        if job_log.isEnabledFor(_DEBUG):
            job_log.debug(
                'Job "%s" done in %dms (attempt %d/%d)',
                job.name,
                round(elapsed * 1000),
                reserved.attempt,
                tries,
                extra={
                    "job": job.name,
                    "job_id": message.id,
                    "attempt": reserved.attempt,
                    "state": "done",
                    "elapsed": elapsed,
                },
            )
        next_error: BaseException | None = None
        if message.chain_catch and not (
            message.chain or ctx._chain_appended or ctx._chain_prepended
        ):
            self.forget_callbacks(message.chain_catch)  # the chain ended well
        if message.chain or ctx._chain_appended or ctx._chain_prepended:
            try:
                await self._continue_chain(message, ctx)
            except Exception as e:
                # sync: the next link ran inline and failed; finish this job first,
                # then raise that failure to the dispatch() caller.
                if inline:
                    next_error = e
                else:
                    # This job did its work; leaving it un-acked would only run it again.
                    log.exception(
                        'job "%s" (%s) succeeded but dispatching the next link of chain %s failed',
                        job.name,
                        message.id,
                        message.chain_id,
                    )
        if message.batch_id is not None:
            await self._settle_batch(message, "done", None)
        if message.unique is not None:
            await self._unlock_unique(message)
        if job.max_exceptions is not None:
            await self._state_store().delete(self._exceptions_key(message))
        await self._ack(driver, reserved)
        if track is not None:
            from haze._jobs.status import result_for

            kept, why = result_for(message, result)
            await self._track(message, ctx, "done", result=kept, error=why)
        if self.events.after:
            await self.events.emit("after", ctx)
        if next_error is not None:
            raise next_error
        return _Outcome.SUCCESS, None

    def _payload(self, job: JobDefinition[Any], message: Message) -> Any:
        if message.enc is not None:
            from haze._kernel.crypto import decrypt_payload

            message.payload = decrypt_payload(self.app, message)
            message.enc = None
        if job._n_params == 0:
            return None
        return job.from_wire(message.payload)

    def _state_store(self) -> Any:
        fake = _testing._active_fake
        return fake.store if fake is not None else self.app.queue_store

    def _exceptions_key(self, message: Message) -> str:
        return f"haze:exceptions:{message.id}"

    # ---------------------------------------------------------------- status and cancel

    async def _track(
        self,
        message: Message,
        ctx: JobContext,
        state: str,
        *,
        result: Any = None,
        error: str | None = None,
        wait: float = 0.0,
    ) -> None:
        """Write a tracked job's record after its pending progress writes."""
        from haze._jobs.status import write

        tasks = ctx._progress_tasks
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        await write(
            self,
            message,
            state,
            attempt=ctx.attempt,
            progress=ctx._progress,
            result=result,
            error=error,
            wait=wait,
        )

    async def _cancel_seen(self, message: Message, tracked: bool, attempt: int) -> bool:
        """Whether a cancel marker stops this attempt before it starts.

        A tracked job writes ``running`` first, then reads its marker (``status.cancel``
        writes the marker, then reads the record: one of the two sees the other). An
        untracked job reads it only while the cancel hint is set; the hint is re-read at
        most once per ``CANCEL_POLL``.
        """
        from haze._jobs.status import HINT_KEY, cancel_key, write

        if tracked:
            await write(self, message, "running", attempt=attempt)
        store = self._state_store()
        try:
            if _time() - self._hint_at > _CANCEL_POLL:
                hint, marker = await store.get_many([HINT_KEY, cancel_key(message.id)])
                self._hint_on, self._hint_at = hint is not None, _time()
            elif tracked or self._hint_on:
                marker = await store.get(cancel_key(message.id))
            else:
                return False
        except Exception as e:
            log.warning("could not read the cancel marker of job %s: %s", message.id, e)
            return False
        return marker is not None

    async def _cancelled(
        self,
        job: JobDefinition[Any],
        message: Message,
        reserved: Reserved,
        driver: Driver,
        ctx: JobContext,
        error: BaseException | None,
    ) -> tuple[str, BaseException | None]:
        """End a cancelled job: acked, no retry, no ``failed()``; a batch counts it like
        the jobs a cancelled batch skips; the rest of its chain does not run."""
        job_log.info(
            'Job "%s" cancelled%s',
            job.name,
            " while running" if error is not None else " before it ran",
            extra={
                "job": job.name,
                "job_id": message.id,
                "attempt": reserved.attempt,
                "state": "cancelled",
            },
        )
        if message.batch_id is not None:
            from haze._orchestration.batches import settle_cancelled

            await settle_cancelled(self, message)
        if message.chain_catch:
            self.forget_callbacks(message.chain_catch)
        await self._unlock_unique(message)
        if job.max_exceptions is not None:
            await self._state_store().delete(self._exceptions_key(message))
        await self._ack(driver, reserved)
        if message.meta is not None and "track" in message.meta:
            why = "cancelled while running" if error is not None else "cancelled before it ran"
            await self._track(message, ctx, "cancelled", error=why)
        return _Outcome.CANCELLED, None

    def _watch_cancels(self) -> None:
        """Start polling the cancel markers of the jobs running in this process."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # pragma: no cover
            return
        self._watcher = loop.create_task(self._watch(), name="haze-cancel-watch")

    async def _watch(self) -> None:
        from haze._jobs.status import CANCEL_POLL, HINT_KEY, cancel_key

        told = False
        try:
            while True:
                await asyncio.sleep(CANCEL_POLL)
                ids = list(self._running)
                if not ids:
                    return  # the next attempt to start begins a new watch
                try:
                    values = await self._state_store().get_many(
                        [HINT_KEY, *(cancel_key(i) for i in ids)]
                    )
                except Exception as e:
                    # An unreachable backend is the worker's outage to report (once per
                    # outage); repeating it here would make every outage two warnings.
                    if (
                        not told
                        and self.unavailable(e) is None
                        and not isinstance(e, BackendUnavailableError)
                    ):
                        told = True
                        log.warning("could not read cancel markers from the store: %s", e)
                    continue
                told = False
                self._hint_on, self._hint_at = values[0] is not None, _time()
                for job_id, marker in zip(ids, values[1:], strict=True):
                    if marker is not None:
                        self._abort_running(job_id)
        finally:
            if self._watcher is asyncio.current_task():
                self._watcher = None

    def _abort_running(self, job_id: str) -> None:
        ctx = self._running.get(job_id)
        if ctx is not None and not ctx.signal.aborted:
            from haze._kernel.errors import JobCancelledError

            ctx.signal.abort(JobCancelledError(f'Job "{ctx.name}" ({job_id}) was cancelled'))

    def _cancel_hint(self, on: bool) -> None:
        self._hint_on, self._hint_at = on, _time()

    def _final_event(self, job_id: str) -> asyncio.Event:
        event = self._final_events.get(job_id)
        if event is None:
            event = self._final_events[job_id] = asyncio.Event()
        return event

    def _drop_final_event(self, job_id: str, event: asyncio.Event) -> None:
        if self._final_events.get(job_id) is event:
            del self._final_events[job_id]

    def _notify_final(self, job_id: str) -> None:
        event = self._final_events.pop(job_id, None)
        if event is not None:
            event.set()

    def report_progress(self, ctx: JobContext, value: Any) -> None:
        """``job.progress(value)``: emit the event and update a tracked job's record, in
        the background (a plain ``def`` handler calls this from its thread)."""
        m = ctx.message
        tracked = m is not None and m.meta is not None and "track" in m.meta
        if not tracked and not self.events.progress:
            return
        loop = ctx._loop
        if loop is not None:
            try:
                here = asyncio.get_running_loop()
            except RuntimeError:
                here = None
            if here is not loop:
                loop.call_soon_threadsafe(self._progress_task, ctx, value, tracked)
                return
        self._progress_task(ctx, value, tracked)

    def _progress_task(self, ctx: JobContext, value: Any, tracked: bool) -> None:
        task = asyncio.ensure_future(self._progress_step(ctx, value, tracked))
        tasks = ctx._progress_tasks
        if tasks is None:
            tasks = ctx._progress_tasks = set()
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def _progress_step(self, ctx: JobContext, value: Any, tracked: bool) -> None:
        if self.events.progress:
            await self.events.emit("progress", ctx, value)
        m = ctx.message
        if tracked and m is not None and ctx._progress is value:  # a newer value is due
            from haze._jobs.status import write

            await write(self, m, "running", attempt=ctx.attempt, progress=value)

    async def _with_timeout(self, job: JobDefinition[Any], payload: Any, ctx: JobContext) -> Any:
        timeout = job.timeout
        assert timeout is not None
        task = asyncio.ensure_future(_contained(self.pipeline(job)(payload, ctx)))
        done, _ = await asyncio.wait({task}, timeout=timeout)
        if task in done:
            return task.result()
        err = JobTimeoutError(
            f'Job "{job.name}" timed out after {timeout:g}s (attempt {ctx.attempt})'
        )
        ctx.signal.abort(err)  # the signal is set first, then the handler is cancelled
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        except Exception:
            pass
        raise err

    async def _failure(
        self,
        job: JobDefinition[Any],
        message: Message,
        reserved: Reserved,
        driver: Driver,
        ctx: JobContext,
        payload: Any,
        error: BaseException,
        inline: bool,
    ) -> tuple[str, BaseException | None]:
        final_error = await self._final_reason(job, message, reserved, ctx, error)
        if final_error is not None or inline:
            return await self._final(
                job, message, reserved, driver, ctx, payload, final_error or error, inline
            )
        delay = (
            ctx._retry_delay
            if ctx._retry_delay is not None
            else backoff_delay(job.backoff, reserved.attempt)
        )
        delay = min(delay, MAX_DELAY)  # "exponential" doubles up to 2**40 s
        step = getattr(driver, "delay_step", None)  # e.g. whole seconds on SQS, Cloudflare
        waits = -(-delay // step) * step if step and delay > 0 else delay
        job_log.warning(
            'Job "%s" failed (attempt %d/%s), retrying in %ss: %s: %s',
            job.name,
            reserved.attempt,
            "∞" if job.retry_until else job.tries,
            f"{waits:g}",
            type(error).__name__,
            error,
            extra={
                "job": job.name,
                "job_id": message.id,
                "attempt": reserved.attempt,
                "state": "retry",
                "retry_in": waits,
                "error": error,
            },
        )
        if self._otel is not None:
            self._otel.retrying(waits, error)
        owned = await driver.release(reserved, delay, consume_attempt=True)
        self._owned(owned, reserved, "retry")
        if message.meta is not None and "track" in message.meta:
            from haze._jobs.status import error_text

            state = "delayed" if delay > 0 else "queued"
            await self._track(message, ctx, state, error=error_text(error), wait=delay)
        return _Outcome.RETRY, error

    async def _final_reason(
        self,
        job: JobDefinition[Any],
        message: Message,
        reserved: Reserved,
        ctx: JobContext,
        error: BaseException,
    ) -> BaseException | None:
        """None to retry; otherwise the error to fail with."""
        if job.dont_retry and isinstance(error, job.dont_retry):
            return error
        if isinstance(error, JobTimeoutError) and job.fail_on_timeout:
            return error
        if job.max_exceptions is not None:
            n = await self._state_store().increment(self._exceptions_key(message), 1, 7 * 86400)
            if n >= job.max_exceptions:
                return MaxExceptionsError(
                    f'Job "{job.name}" raised {n} exceptions '
                    f"(max_exceptions={job.max_exceptions}); "
                    f"last: {type(error).__name__}: {error}"
                )
        if job.retry_until is not None:
            first = float((message.meta or {}).get("first_ts") or message.ts)
            if _time() >= first + job.retry_until:
                return RetryUntilExpiredError(
                    f'Job "{job.name}" passed retry_until ({job.retry_until:g}s after its first '
                    f"dispatch); last: {type(error).__name__}: {error}"
                )
            return None
        if reserved.attempt >= job.tries:
            return error
        return None

    async def _final(
        self,
        job: JobDefinition[Any],
        message: Message,
        reserved: Reserved,
        driver: Driver,
        ctx: JobContext,
        payload: Any,
        error: BaseException,
        inline: bool,
    ) -> tuple[str, BaseException | None]:
        job_log.error(
            'Job "%s" failed after %d attempt(s): %s: %s',
            job.name,
            reserved.attempt,
            type(error).__name__,
            error,
            exc_info=error if not inline else None,
            extra={
                "job": job.name,
                "job_id": message.id,
                "attempt": reserved.attempt,
                "state": "failed",
                "error": error,
            },
        )
        if self.events.failing:
            await self.events.emit("failing", ctx, error)
        if job.failed is not None:
            await self._call_failed(
                job, payload if payload is not None else message.payload, error, ctx
            )
        if message.batch_id is not None:
            # Before fail(): once the job has left the queue, a crash here would leave
            # the batch waiting for it forever. Counted twice, it still counts once.
            await self._settle_batch(message, "failed", error)
        owned = await driver.fail(
            reserved, self.failed_record(message, driver.name, error, reserved.attempt)
        )
        self._owned(owned, reserved, "failure")
        if message.meta is not None and "track" in message.meta:
            from haze._jobs.status import error_text

            await self._track(message, ctx, "failed", error=error_text(error))
        await self._unlock_unique(message)
        if job.max_exceptions is not None:
            await self._state_store().delete(self._exceptions_key(message))
        if message.chain_id is not None:
            await self._chain_failed(message, error)
        return _Outcome.FAILED, error

    async def _call_failed(
        self, job: JobDefinition[Any], payload: Any, error: BaseException, ctx: JobContext
    ) -> None:
        fn = job.failed
        assert fn is not None
        try:
            n = len(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            n = 3
        args = (payload, error, ctx)[: max(0, min(n, 3))]
        try:
            result = fn(*args)
            if inspect.isawaitable(result):
                await result
        except asyncio.CancelledError:
            raise
        except BaseException:  # job code: whatever it raises, the worker goes on
            log.exception('the failed() handler of job "%s" raised', job.name)

    def failed_record(
        self,
        message: Message,
        connection: str,
        error: BaseException,
        attempt: int | None = None,
    ) -> FailedJob:
        import copy

        from haze.drivers import FailedJob

        # A retried job must not release a lock it no longer holds: the stored body drops
        # ``unique``, but ``message`` keeps it so that _final can still release the lock.
        body_message = copy.copy(message)
        body_message.unique = None
        if attempt is not None:
            # The attempt it failed on rides in the stored body's meta: every driver's
            # failed record keeps that body, so no failed-table column is needed.
            body_message.meta = {**(message.meta or {}), "failed_attempt": attempt}
        if (
            message.enc is None
            and message.job in _registry_names()
            and get_job(message.job).encrypted
        ):
            from haze._kernel.crypto import encrypt_payload

            encrypt_payload(self.app, body_message)
        return FailedJob(
            id=message.id,
            name=message.job,
            connection=connection,
            queue=message.queue,
            payload=None if body_message.enc is not None else message.payload,
            exception=_format_error(error),
            failed_at=_time(),
            chain_id=message.chain_id,
            batch_id=message.batch_id,
            body=encode(body_message),
        )

    async def _fail_undecodable(
        self, reserved: Reserved, driver: Driver, error: BaseException
    ) -> None:
        from haze.drivers import FailedJob

        m = reserved.message
        log.error("haze: cannot run a message on %s/%s: %s", driver.name, reserved.queue, error)
        owned = await driver.fail(
            reserved,
            FailedJob(
                id=m.id if m else new_id(),
                name=m.job if m else "<undecodable>",
                connection=driver.name,
                queue=reserved.queue,
                payload=m.payload if m else reserved.body,
                exception=_format_error(error),
                failed_at=_time(),
                chain_id=m.chain_id if m else None,
                batch_id=m.batch_id if m else None,
                body=reserved.body,
            ),
        )
        self._owned(owned, reserved, "failure")

    async def _ack(self, driver: Driver, reserved: Reserved) -> None:
        later = reserved.ack_later
        if later is not None:
            # A batching worker sends it with other acks in a few ms, and warns then if
            # the lease was lost. Chains, batches and unique locks were settled before.
            later(reserved)
            return
        self._owned(await driver.ack(reserved), reserved, "completion")

    def _owned(self, owned: bool, reserved: Reserved, what: str) -> None:
        """Warn when ack/release/fail found the job no longer this worker's (and mark it,
        for the worker's ``leases_lost``): the outcome was not recorded."""
        if owned is not False:  # a driver from before the bool return says None
            return
        reserved.lease_lost = True
        m = reserved.message
        name = m.job if m is not None else "<undecodable>"
        job_id = m.id if m is not None else str(reserved.token)
        job_log.warning(
            'Job "%s" (%s): its %s was not recorded, because this worker no longer owned the '
            "job: its lease expired (retry_after passed without a heartbeat) and another "
            "worker took it over, so it may run again. An async job that blocks the event "
            "loop (time.sleep, CPU-bound work) stops the heartbeat: await asyncio.sleep or "
            "asyncio.to_thread instead, or make it a plain def job (it runs in a thread).",
            name,
            job_id,
            what,
            extra={"job": name, "job_id": job_id, "attempt": reserved.attempt},
        )

    # ================================================================ chains

    async def _continue_chain(self, message: Message, ctx: JobContext) -> None:
        from haze._orchestration.chains import dispatch_next_link

        await dispatch_next_link(self, message, ctx)

    async def _chain_failed(self, message: Message, error: BaseException) -> None:
        from haze._orchestration.chains import chain_failed

        await chain_failed(self, message, error)

    async def _settle_batch(
        self, message: Message, outcome: str, error: BaseException | None
    ) -> None:
        from haze._orchestration.batches import settle

        await settle(self, message, outcome, error)

    # ================================================================ callbacks

    def callback_ref(self, cb: object, connection: str, where: str) -> dict[str, Any]:
        """Serialise a callback: a job reference anywhere, a function on sync/memory only."""
        if isinstance(cb, PendingDispatch):
            return cb.to_link(self.app)
        if isinstance(cb, JobDefinition):
            return PendingDispatch(cb, None).to_link(self.app)
        if callable(cb):
            driver = self.app.driver(connection)
            if not driver.local_callbacks:
                raise ValueError(
                    f"{where}: a plain function cannot travel to the workers of connection "
                    f'"{connection}" (driver {type(driver).__name__}); pass a job reference '
                    "such as cleanup.with_({...}) instead"
                )
            ref = new_id()
            self._local_callbacks[ref] = cb
            return {"fn": ref}
        raise ValueError(f"{where}: expected a job reference or a function, got {cb!r}")

    def forget_callbacks(self, refs: Any) -> None:
        """Drop plain-function callbacks that can no longer fire (no leak in long apps)."""
        for ref in refs or ():
            if isinstance(ref, dict) and "fn" in ref:
                self._local_callbacks.pop(ref["fn"], None)

    async def run_callback(
        self, ref: dict[str, Any], args: tuple[Any, ...], *, once: str | None = None, **opts: Any
    ) -> None:
        """Dispatch a job-reference callback, or call a local function with ``args``.

        With ``once`` (a claim key, see ``batches.claim_once``), only one of any number
        of dispatches of this callback runs.
        """
        if "fn" in ref:
            fn = self._local_callbacks.get(ref["fn"])
            if fn is None:
                log.warning("a callback function is no longer registered in this process")
                return
            if once is not None:
                from haze._orchestration.batches import claim_once

                if not await claim_once(self, once, new_id()):  # a call is never redelivered
                    return
            try:
                result = fn(*args)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("callback %r raised", fn)
            return
        meta = None if once is None else {"once": once}
        await self.dispatch(link_to_pending(ref, self.app), meta=meta, **opts)

    # ================================================================ facade helpers

    def unavailable(self, error: BaseException) -> BackendUnavailableError | None:
        """``error`` as a one-line ``BackendUnavailableError`` when it says the backend of
        a connection this app has used cannot be reached (the CLI's one-line errors)."""
        for driver in list(self.app._drivers.values()):
            down = unavailable(driver, error)
            if down is not None:
                return down
        return None

    def connection_names(self, connection: str | None) -> list[str]:
        return [self.app.connection_name(connection)]

    async def failed(
        self, connection: str | None = None, queue: str | None = None
    ) -> list[FailedJob]:
        driver = self.app.driver(connection)
        return await driver.failed.list(queue)

    async def retry(
        self,
        ids: str | Sequence[str] | None = None,
        *,
        connection: str | None = None,
        queue: str | None = None,
    ) -> list[str]:
        """Put failed jobs back on their queue (all when ``ids`` is None); returns their ids."""
        from haze._kernel.message import decode

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
            try:
                message = decode(rec.body)
            except MessageDecodeError as e:
                log.error("failed job %s cannot be retried: %s", rec.id, e)
                continue
            message.attempts = 0
            message.ts = _time()
            if message.meta is not None and "failed_attempt" in message.meta:
                # A fresh run: its next failure records its own attempt.
                message.meta = {k: v for k, v in message.meta.items() if k != "failed_attempt"}
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
            await driver.failed.forget(rec.id)
            done.append(rec.id)
        return done

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
        driver = self.app.driver(connection)
        return await driver.size(queue or "default")

    async def clear(self, queue: str | None = None, connection: str | None = None) -> int:
        driver = self.app.driver(connection)
        return await driver.purge(queue or "default")


_app_var: Any = None


def _bind_app_var() -> Any:
    # haze.app imports this module; importing its ContextVar inside _process cost
    # about 1us of import machinery per job.
    global _app_var
    from haze._app.app import _current

    _app_var = _current
    return _current


def _registry_names() -> dict[str, Any]:
    from haze._jobs.definition import _registry

    return _registry


def link_to_pending(link: dict[str, Any], app: App | None = None) -> PendingDispatch[Any]:
    """Rebuild a pending dispatch from its JSON link (chains, callbacks); an encrypted
    link is decrypted with the key of ``app`` (default: the current app)."""
    job = get_job(link["job"])
    payload = link.get("payload")
    if "enc" in link:
        from haze._app.app import use_app
        from haze._kernel.crypto import unseal_link

        payload = unseal_link(app if app is not None else use_app(), link)
    p: PendingDispatch[Any] = PendingDispatch(job, job.from_wire(payload))
    if link.get("queue"):
        p._queue = link["queue"]
    if link.get("connection"):
        p._connection = link["connection"]
    if link.get("delay"):
        p._delay = float(link["delay"])
    if link.get("group"):
        p._group = link["group"]
    return p


class _Contained(Exception):
    """A BaseException raised by job code in a task of its own (``timeout``), carried
    out as an Exception: raised out of a task, KeyboardInterrupt and SystemExit would
    stop the event loop, and so the worker and every other running job."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.error = error


async def _contained(aw: Awaitable[Any]) -> Any:
    try:
        return await aw
    except (Exception, asyncio.CancelledError, GeneratorExit):
        raise
    except BaseException as e:
        raise _Contained(e) from None


def _reserved(message: Message, body: str) -> Reserved:
    from haze.drivers import Reserved

    return Reserved(message, 1, body, message.queue)


def _format_error(error: BaseException) -> str:
    import traceback

    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return text.strip() or f"{type(error).__name__}: {error}"


def _compose(middleware: list[Callable[..., Any]], job: JobDefinition[Any]) -> Pipeline:
    handler = job.handler
    n = job._n_params
    call: Pipeline
    if job.is_async:
        if n == 0:

            async def call(payload: Any, ctx: JobContext) -> Any:
                return await handler()
        elif n == 1:

            async def call(payload: Any, ctx: JobContext) -> Any:
                return await handler(payload)
        else:
            call = handler
    else:
        call = _sync_call(handler, n)
    for mw in reversed(middleware):
        call = _wrap(mw, call)
    return call


def _sync_call(handler: Callable[..., Any], n: int) -> Pipeline:
    def invoke(payload: Any, ctx: JobContext) -> Any:
        if n == 0:
            return handler()
        if n == 1:
            return handler(payload)
        return handler(payload, ctx)

    if _EMSCRIPTEN:  # no threads under Pyodide: run inline

        async def inline(payload: Any, ctx: JobContext) -> Any:
            return invoke(payload, ctx)

        return inline

    import contextvars

    async def threaded(payload: Any, ctx: JobContext) -> Any:
        loop = ctx._loop = asyncio.get_running_loop()  # for job.progress() from the thread
        cv = contextvars.copy_context()
        return await loop.run_in_executor(None, cv.run, invoke, payload, ctx)

    return threaded


def _wrap(mw: Callable[..., Any], nxt: Pipeline) -> Pipeline:
    async def step(payload: Any, ctx: JobContext) -> Any:
        async def call_next() -> Any:
            return await nxt(payload, ctx)

        result = mw(payload, ctx, call_next)
        if inspect.isawaitable(result):
            result = await result
        return result

    return step


# re-exported for type checkers of the facade
_ = (ConfigError, HazeError)
