"""Status records, cancellation and progress, on the engine's side (``haze._jobs.status``
holds the record format and ``Queue.status``/``wait``/``cancel``).

``Tracking`` writes a tracked job's record at each step, reads cancel markers before an
attempt and polls them while attempts run, wakes local waiters of a final record, and
reports ``job.progress``. ``StatusRecord`` is the outcome hook that writes the record of
each outcome.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from haze._base.crypto import seal, unseal
from haze._base.errors import BackendUnavailableError, JobCancelledError, MessageDecodeError
from haze._engine.hooks import Outcome, Run
from haze._jobs import status
from haze._jobs.definition import find_job

if TYPE_CHECKING:
    from haze._base.message import Message
    from haze._engine.events import Events
    from haze._engine.stores import EngineStores
    from haze._engine.view import EngineApp
    from haze._jobs.context import JobContext
    from haze._jobs.definition import JobDefinition
    from haze.contracts.store import Store

__all__ = ["StatusRecord", "Tracking"]

log = logging.getLogger("haze")
_time = time.time
_perf = time.perf_counter


class Tracking:
    """Status records, cancel markers and progress for one app (a ``status.StatusHost``)."""

    def __init__(
        self,
        app: EngineApp,
        stores: EngineStores,
        events: Events,
        unavailable: Callable[[BaseException], BaseException | None],
    ) -> None:
        self.app = app
        self.stores = stores
        self.events = events
        self._unavailable = unavailable
        #: job -> its tracking meta (None: untracked), decided at its first dispatch
        self.meta: dict[JobDefinition[Any], dict[str, float] | None] = {}
        #: the attempts running in this process
        self.running: dict[str, JobContext] = {}
        self._watcher: asyncio.Task[None] | None = None
        self._hint_on = False  # a cancel may be outstanding: check markers before runs
        self._hint_at = 0.0  # when the hint was last read from the store
        #: until when (``time.perf_counter`` s) an untracked attempt need not read its
        #: cancel marker: -inf while the hint is on, else a CANCEL_POLL after the hint
        #: was read (kept by ``_hinted``, so that ``may_be_cancelled`` is one
        #: comparison; on the clock a plain run reads anyway to time its job)
        self.quiet_until = -math.inf
        self._final_events: dict[str, asyncio.Event] = {}

    # ------------------------------------------------------------ status.StatusHost

    def state_store(self) -> Store:
        return self.stores.state()

    def final_event(self, job_id: str) -> asyncio.Event:
        event = self._final_events.get(job_id)
        if event is None:
            event = self._final_events[job_id] = asyncio.Event()
        return event

    def drop_final_event(self, job_id: str, event: asyncio.Event) -> None:
        if self._final_events.get(job_id) is event:
            del self._final_events[job_id]

    def notify_final(self, job_id: str) -> None:
        event = self._final_events.pop(job_id, None)
        if event is not None:
            event.set()

    def cancel_hint(self, on: bool) -> None:
        self._hinted(on)

    def abort_running(self, job_id: str) -> None:
        ctx = self.running.get(job_id)
        if ctx is not None and not ctx.signal.aborted:
            ctx.signal.abort(JobCancelledError(f'Job "{ctx.name}" ({job_id}) was cancelled'))

    def open_sealed(self, job_id: str, blob: object) -> dict[str, Any] | None:
        if not self.app.key:
            return None
        what = f"the status record of job {job_id}"
        try:
            opened = unseal(self.app, blob, status.sealed_context(job_id), what)
        except MessageDecodeError as e:
            log.warning("%s", e)
            return None
        return opened if isinstance(opened, dict) else None

    def sealer(self, message: Message) -> status.Sealer | None:
        """How an encrypted job's record fields are encrypted (None: a plain job)."""
        job = find_job(message.job)
        if job is None or not job.encrypted or message.enc is not None:
            # ``enc`` still set: the payload was never decrypted, so the record holds none
            # of it (its error says why it could not be read, as the failed record does in
            # the clear), and this worker may have no key to seal with at all.
            return None
        app, context = self.app, status.sealed_context(message.id)
        return lambda fields: seal(app, fields, context)

    # ------------------------------------------------------------ records

    def meta_for(self, job: JobDefinition[Any]) -> dict[str, float] | None:
        """The ``meta`` fields that mark ``job``'s messages as tracked (None: untracked)."""
        if job in self.meta:
            return self.meta[job]
        track = self.meta[job] = status.tracking(job.track, job.keep_result, self.app)
        return track

    async def queued(self, message: Message, delay: float) -> None:
        """A tracked message is about to be queued (before the enqueue: a worker's
        ``running`` must come after it)."""
        state = "delayed" if delay > 0 else "queued"
        await status.write(self, message, state, wait=delay, seal=self.sealer(message))

    async def record(
        self,
        message: Message,
        ctx: JobContext,
        state: str,
        *,
        result: Any = None,
        error: str | None = None,
        wait: float = 0.0,
        attempt: int | None = None,
    ) -> None:
        """Write a tracked job's record after its pending progress writes (``attempt``:
        other than the context's, for a job that never started)."""
        tasks = ctx._progress_tasks
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        await status.write(
            self,
            message,
            state,
            attempt=ctx.attempt if attempt is None else attempt,
            progress=ctx._progress,
            result=result,
            error=error,
            wait=wait,
            seal=self.sealer(message),
        )

    # ------------------------------------------------------------ cancellation

    def may_be_cancelled(self, tracked: bool) -> bool:
        """Whether an attempt must read its cancel marker before it starts."""
        return tracked or _perf() > self.quiet_until

    def _hinted(self, on: bool) -> None:
        """The cancel hint was read from the store now: ``on`` (a cancel is outstanding)."""
        self._hint_on, self._hint_at = on, _time()
        self.quiet_until = -math.inf if on else _perf() + status.CANCEL_POLL

    async def cancel_seen(self, message: Message, tracked: bool, attempt: int) -> bool:
        """Whether a cancel marker stops this attempt before it starts.

        A tracked job writes ``running`` first, then reads its marker (``status.cancel``
        writes the marker, then reads the record: one of the two sees the other). An
        untracked job reads it only while the cancel hint is set; the hint is re-read at
        most once per ``CANCEL_POLL``.
        """
        if tracked:
            await status.write(self, message, "running", attempt=attempt, seal=self.sealer(message))
        store = self.stores.state()
        try:
            if _time() - self._hint_at > status.CANCEL_POLL:
                keys = [status.HINT_KEY, status.cancel_key(message.id)]
                hint, marker = await store.get_many(keys)
                self._hinted(hint is not None)
            elif tracked or self._hint_on:
                marker = await store.get(status.cancel_key(message.id))
            else:
                return False
        except Exception as e:
            log.warning("could not read the cancel marker of job %s: %s", message.id, e)
            return False
        return marker is not None

    def started(self, ctx: JobContext, inline: bool) -> None:
        """An attempt starts: its markers are polled while it runs."""
        self.running[ctx.id] = ctx
        if self._watcher is None and not inline:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # pragma: no cover
                return
            self._watcher = loop.create_task(self._watch(), name="haze-cancel-watch")

    def ended(self, ctx: JobContext) -> None:
        if self.running.get(ctx.id) is ctx:
            del self.running[ctx.id]

    async def stop_watching(self, loop: asyncio.AbstractEventLoop | None) -> None:
        """End this loop's cancel watch, and wait for it to end (a Lambda invocation
        leaves no task behind)."""
        watcher = self._watcher
        if watcher is not None and watcher.get_loop() is loop:
            self._watcher = None
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)

    async def _watch(self) -> None:
        told = False
        try:
            while True:
                await asyncio.sleep(status.CANCEL_POLL)
                ids = list(self.running)
                # stop_watching awaits this task: it must end even if a store client
                # swallowed the cancellation
                if not ids or self._watcher is not asyncio.current_task():
                    return  # the next attempt to start begins a new watch
                try:
                    keys = [status.HINT_KEY, *(status.cancel_key(i) for i in ids)]
                    values = await self.stores.state().get_many(keys)
                except Exception as e:
                    # An unreachable backend is the worker's outage to report (once per
                    # outage); repeating it here would make every outage two warnings.
                    if (
                        not told
                        and self._unavailable(e) is None
                        and not isinstance(e, BackendUnavailableError)
                    ):
                        told = True
                        log.warning("could not read cancel markers from the store: %s", e)
                    continue
                told = False
                self._hinted(values[0] is not None)
                for job_id, marker in zip(ids, values[1:], strict=True):
                    if marker is not None:
                        self.abort_running(job_id)
        finally:
            if self._watcher is asyncio.current_task():
                self._watcher = None

    # ------------------------------------------------------------ progress

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
            seal_fields = self.sealer(m)
            await status.write(
                self, m, "running", attempt=ctx.attempt, progress=value, seal=seal_fields
            )


class StatusRecord:
    """Outcome hook: a tracked job's record says each outcome, once the queue has it."""

    plain_quiet = True  # wants() is False for a plain success (PlainQuiet)

    def __init__(self, tracking: Tracking) -> None:
        self.tracking = tracking

    def wants(self, run: Run) -> bool:
        return run.tracked

    async def settling(self, run: Run) -> None:
        return None

    async def settled(self, run: Run) -> None:
        if not run.tracked:
            return
        message, ctx, outcome = run.message, run.ctx, run.outcome
        record = self.tracking.record
        if outcome == Outcome.SUCCESS:
            kept, why = status.result_for(message, run.result)
            await record(message, ctx, "done", result=kept, error=why)
        elif outcome == Outcome.FAILED:
            assert run.error is not None
            await record(message, ctx, "failed", error=status.error_text(run.error))
        elif outcome in (Outcome.CANCELLED, Outcome.SKIPPED):
            if run.note is not None:
                # never started: the attempts that ran, not the one it was delivered for
                ran = ctx.attempt if run.started else max(0, ctx.attempt - 1)
                await record(message, ctx, "cancelled", error=run.note, attempt=ran)
        elif outcome == Outcome.RETRY:
            assert run.error is not None
            state = "delayed" if run.delay > 0 else "queued"
            error = status.error_text(run.error)
            await record(message, ctx, state, error=error, wait=run.delay)
        elif outcome == Outcome.RELEASED:
            state = "delayed" if run.delay > 0 else "queued"
            await record(message, ctx, state, wait=run.delay)
