"""The queue manager: one app's engine, composed of its parts.

Follow one message::

    dispatcher ─ build ─ encode ─ (after-commit? defer) ─ debounce ─ unique lock ─ sink
    worker ─ driver.reserve ─ execution:
        decode ─ guard ─ run (middleware → handle, timeout) ─ classify ─ settle:
            hooks.settling ─ driver.ack / fail / release ─ hooks.settled

The parts: ``Dispatcher`` (dispatcher.py), ``Locks`` (locks.py), ``Execution``
(execution.py, with pipeline.py and failures.py), ``Hooks`` (hooks.py: the outcome
hooks chains, batches, unique locks, status records, events and telemetry plug into),
``Tracking`` (tracking.py: status records and cancellation), ``Callbacks``
(callbacks.py), ``LocalWorkers`` (local.py) and ``Admin`` (admin.py). The app builds
the manager and adds the hooks of the layers above the engine (chains, batches).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from haze._engine.admin import Admin
from haze._engine.callbacks import Callbacks
from haze._engine.dispatcher import Dispatcher
from haze._engine.events import AfterEvent, events
from haze._engine.execution import Execution
from haze._engine.failures import ExceptionCount, Failures
from haze._engine.hooks import Hooks, Stage
from haze._engine.local import LocalWorkers, WorkerFactory
from haze._engine.locks import Locks, UniqueRelease, scoped_key
from haze._engine.offload import Offload, OffloadCleanup
from haze._engine.otel import TelemetryHook, TelemetrySlot
from haze._engine.stores import EngineStores
from haze._engine.throughput import ReadDuration
from haze._engine.tracking import StatusRecord, Tracking

if TYPE_CHECKING:
    from haze._base.message import Message
    from haze._engine.otel import Telemetry
    from haze._engine.view import EngineApp
    from haze._jobs.context import JobContext
    from haze._jobs.definition import DispatchResult, JobDefinition, PendingDispatch
    from haze.contracts.driver import Driver, FailedJob, Reserved
    from haze.contracts.store import Store

__all__ = ["QueueManager", "events"]


class QueueManager:
    """Dispatch and execution for one app: a thin facade over the engine's parts.

    ``worker_factory`` builds the in-process consumers of memory connections (none
    without it); ``warn_implicit`` is told when a job goes to the implicit default app;
    ``read_duration`` reads duration settings (``HAZE_METRICS_RETENTION``)."""

    def __init__(
        self,
        app: EngineApp,
        *,
        worker_factory: WorkerFactory | None = None,
        warn_implicit: Callable[[], None] = lambda: None,
        read_duration: ReadDuration | None = None,
    ) -> None:
        self.app = app
        self.events = events
        self.stores = EngineStores(app)
        self.hooks = Hooks()
        self.locks = Locks(app, self.stores)
        self.local = LocalWorkers(app, worker_factory)
        self.otel = TelemetrySlot(app)
        self.tracking = Tracking(app, self.stores, events, self.unavailable)
        self.failures = Failures(app, self.stores)
        self.offload = Offload(app)
        # Looked up on the manager at each call: a test may replace them on it.
        run_inline = lambda *a: self.run_inline(*a)  # noqa: E731
        ensure_local_worker = lambda c: self.ensure_local_worker(c)  # noqa: E731
        self.dispatcher = Dispatcher(
            app,
            self.locks,
            self.tracking,
            self.otel,
            run_inline=run_inline,
            ensure_local_worker=ensure_local_worker,
            warn_implicit=warn_implicit,
            offload=self.offload,
            local_workers=self.local.workers,
        )
        self.callbacks = Callbacks(app, self.stores, self.dispatcher.dispatch, self.offload)
        self.execution = Execution(
            app,
            self.hooks,
            self.locks,
            self.tracking,
            self.failures,
            self.callbacks,
            self.otel,
            events,
            read_duration,
            self.offload,
        )
        self.admin = Admin(app, run_inline, ensure_local_worker, self.offload)
        self.hooks.add(StatusRecord(self.tracking), Stage.RECORD)
        self.hooks.add(UniqueRelease(self.locks), Stage.RELEASE)
        self.hooks.add(ExceptionCount(self.stores), Stage.RELEASE)
        self.hooks.add(AfterEvent(events), Stage.NOTIFY)
        self.hooks.add(TelemetryHook(self.otel), Stage.NOTIFY)
        self.hooks.add(OffloadCleanup(self.offload), Stage.NOTIFY)

    # ------------------------------------------------------------ telemetry

    def telemetry(self) -> Telemetry | None:
        """The app's OpenTelemetry recorder (None when off); decided at first use, so an
        SDK set up after the app was created still counts."""
        return self.otel.get()

    @property
    def _otel(self) -> Telemetry | None:
        return self.otel.value

    @_otel.setter
    def _otel(self, value: Telemetry | None) -> None:
        self.otel.set(value)  # a recorder of one's own (tests)

    @property
    def _tracking(self) -> dict[JobDefinition[Any], dict[str, float] | None]:
        return self.tracking.meta  # read again after the queue config's track changed

    # ------------------------------------------------------------ dispatch

    def resolve(
        self,
        pending: PendingDispatch[Any],
        *,
        queue: str | None = None,
        connection: str | None = None,
    ) -> tuple[str, str]:
        return self.dispatcher.resolve(pending, queue=queue, connection=connection)

    def build(
        self, pending: PendingDispatch[Any], connection: str, queue: str, **fields: Any
    ) -> Message:
        return self.dispatcher.build(pending, connection, queue, **fields)

    def encode(self, message: Message, driver: Driver, job: JobDefinition[Any]) -> str:
        return self.dispatcher.encode(message, driver, job)

    async def dispatch(self, pending: PendingDispatch[Any], **options: Any) -> DispatchResult:
        """Queue one pending dispatch (the path under ``Job.dispatch`` and ``with_().dispatch``)."""
        return await self.dispatcher.dispatch(pending, **options)

    async def bulk(self, pendings: Sequence[PendingDispatch[Any]], **options: Any) -> list[str]:
        """Queue many jobs, grouped by connection with each driver's batch primitive."""
        return await self.dispatcher.bulk(pendings, **options)

    def scoped_key(self, kind: str, *parts: object) -> str:
        """A store key scoped by the current tenant (locks and middleware state)."""
        return scoped_key(kind, *parts)

    # ------------------------------------------------------------ local workers

    def ensure_local_worker(self, connection: str) -> None:
        """Make sure an in-process consumer runs for a memory connection on this loop."""
        self.local.ensure(connection)

    async def stop_local_workers(self) -> None:
        """Stop this loop's in-process consumers after their running jobs. Queued jobs
        stay in their memory driver: the next dispatch starts a consumer again (a Lambda
        invocation ends with no task left on its loop)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # pragma: no cover
            loop = None
        await self.local.stop(loop)
        await self.tracking.stop_watching(loop)

    async def shutdown(self) -> None:
        """Stop local consumers after their running jobs; warn about what is lost."""
        await self.stop_local_workers()
        self.local.workers.clear()
        await self.execution.flush_tally()
        await self.locks.finish_releases()
        self.local.warn_lost()

    async def idle(self) -> None:
        """Wait until memory connections have nothing queued, delayed or running."""
        await self.local.idle()

    # ------------------------------------------------------------ execution

    async def run_inline(self, message: Message, body: str, driver: Driver) -> None:
        """The ``sync`` driver: run now in the caller's context; raise a final failure."""
        await self.execution.run_inline(message, body, driver)

    def process(self, reserved: Reserved, driver: Driver) -> Coroutine[Any, Any, str]:
        """Run one claimed message to its outcome; never raises for job errors.

        Hands back the execution's coroutine rather than awaiting it in one of its own:
        every job passes here, and a facade frame per job is measurable."""
        return self.execution.process(reserved, driver)

    def owned(self, owned: bool, reserved: Reserved, what: str) -> None:
        """Warn (and mark ``reserved``) when the driver said the job was no longer ours."""
        self.execution.owned(owned, reserved, what)

    def report_progress(self, ctx: JobContext, value: Any) -> None:
        self.tracking.report_progress(ctx, value)

    # ------------------------------------------------------------ callbacks

    def callback_ref(self, cb: object, connection: str, where: str) -> dict[str, Any]:
        return self.callbacks.ref(cb, connection, where)

    def forget_callbacks(self, refs: Any) -> None:
        self.callbacks.forget(refs)

    async def run_callback(
        self, ref: dict[str, Any], args: tuple[Any, ...], *, once: str | None = None, **opts: Any
    ) -> None:
        await self.callbacks.run(ref, args, once=once, **opts)

    # ------------------------------------------------------------ status.StatusHost

    def state_store(self) -> Store:
        """Locks, middleware state, status records and cancel markers (``Queue.fake()``:
        the recorder's store)."""
        return self.stores.state()

    def notify_final(self, job_id: str) -> None:
        self.tracking.notify_final(job_id)

    def final_event(self, job_id: str) -> asyncio.Event:
        return self.tracking.final_event(job_id)

    def drop_final_event(self, job_id: str, event: asyncio.Event) -> None:
        self.tracking.drop_final_event(job_id, event)

    def cancel_hint(self, on: bool) -> None:
        self.tracking.cancel_hint(on)

    def abort_running(self, job_id: str) -> None:
        self.tracking.abort_running(job_id)

    def open_sealed(self, job_id: str, blob: object) -> dict[str, Any] | None:
        return self.tracking.open_sealed(job_id, blob)

    # ------------------------------------------------------------ admin

    def unavailable(self, error: BaseException) -> Any:
        """``error`` as a one-line ``BackendUnavailableError`` when a backend this app
        has used is down, else None."""
        return self.admin.unavailable(error)

    async def failed(
        self, connection: str | None = None, queue: str | None = None
    ) -> list[FailedJob]:
        return await self.admin.failed(connection, queue)

    async def retry(self, ids: Any = None, **where: Any) -> list[str]:
        """Put failed jobs back on their queue (all when ``ids`` is None); returns their ids."""
        return await self.admin.retry(ids, **where)

    async def forget(self, id: str, connection: str | None = None) -> bool:
        return await self.admin.forget(id, connection)

    async def flush(
        self, connection: str | None = None, older_than: float | None = None, **where: Any
    ) -> int:
        return await self.admin.flush(connection, older_than, **where)

    async def prune_offload(
        self,
        older_than: float,
        connection: str | None = None,
        spare: Callable[[str], Awaitable[bool]] | None = None,
    ) -> int:
        return await self.admin.prune_offload(older_than, connection, spare)

    async def size(self, queue: str | None = None, connection: str | None = None) -> int:
        return await self.admin.size(queue, connection)

    async def clear(self, queue: str | None = None, connection: str | None = None) -> int:
        return await self.admin.clear(queue, connection)
