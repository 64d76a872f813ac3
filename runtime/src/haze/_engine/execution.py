"""The execution of one claimed message, once for every driver, in small steps:

    decode ─ guard (unique until processing, debounce, hook guards, once-claims, cancel)
    ─ run (``before`` event, middleware → handler, timeout) ─ classify ─ settle:
        success  → hooks.settling ─ ack ─ hooks.settled
        release  → driver.release(consume_attempt=False)
        retry    → driver.release(backoff, consume_attempt=True)
        failure  → failed() ─ hooks.settling ─ driver.fail ─ hooks.settled
        cancel   → hooks.settling ─ ack ─ hooks.settled

What reacts to an outcome (status records, chains, batches, unique locks, events,
telemetry) is an outcome hook (``haze._engine.hooks``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from haze._engine.hooks import Outcome, Run, Skip
from haze._engine.pipeline import Contained, Pipeline, compose, with_timeout
from haze._engine.throughput import ReadDuration, Tally
from haze._jobs.context import JobContext, _tenant
from haze._jobs.definition import find_job, get_job
from haze._kernel.crypto import decrypt_payload, sealed_error
from haze._kernel.current import app_var
from haze._kernel.describe import cap_text, error_line
from haze._kernel.durations import MAX_DELAY, backoff_delay
from haze._kernel.errors import (
    JobFailedError,
    MaxAttemptsExceededError,
    MessageDecodeError,
    UnknownJobError,
)
from haze._kernel.message import RETRIED, UNRECORDED_FAILURE, decode_payload, encode_payload
from haze.contracts.driver import CappedDelay, DelayStep, Reserved, unavailable
from haze.contracts.failed import RetryClaims

if TYPE_CHECKING:
    from haze._engine.callbacks import Callbacks
    from haze._engine.events import Events
    from haze._engine.failures import Failures
    from haze._engine.hooks import Hooks
    from haze._engine.locks import Locks
    from haze._engine.otel import TelemetrySlot
    from haze._engine.tracking import Tracking
    from haze._engine.view import EngineApp
    from haze._jobs.definition import JobDefinition
    from haze._kernel.message import Message
    from haze.contracts.driver import Driver, FailedJob

__all__ = ["Execution"]

log = logging.getLogger("haze")
job_log = logging.getLogger("haze.job")

_DEBUG = logging.DEBUG
_perf = time.perf_counter
_time = time.time

Result = tuple[str, "BaseException | None"]
#: Middleware that runs before the app's and the job's (the queue limits of the config).
MiddlewareSource = Callable[[], list[Callable[..., Any]]]


class Execution:
    """Runs claimed messages for one app."""

    def __init__(
        self,
        app: EngineApp,
        hooks: Hooks,
        locks: Locks,
        tracking: Tracking,
        failures: Failures,
        callbacks: Callbacks,
        telemetry: TelemetrySlot,
        events: Events,
        read_duration: ReadDuration | None = None,
    ) -> None:
        self.app = app
        self.hooks = hooks
        self.locks = locks
        self.tracking = tracking
        self.failures = failures
        self.callbacks = callbacks
        self.telemetry = telemetry
        self.events = events
        self.read_duration = read_duration
        self.middleware_sources: list[MiddlewareSource] = []
        self._pipelines: dict[JobDefinition[Any], Pipeline] = {}
        self._tally: Tally | None = None  # finished jobs per queue not yet in the store

    def pipeline(self, job: JobDefinition[Any]) -> Pipeline:
        """Leading middleware, global middleware, then the job's own, then the handler:
        composed once per job."""
        p = self._pipelines.get(job)
        if p is None:
            leading = [mw for source in self.middleware_sources for mw in source()]
            chain = [*leading, *self.app.queue_config.middleware, *job.middleware]
            p = self._pipelines[job] = compose(chain, job)
        return p

    async def flush_tally(self) -> None:
        if self._tally is not None:
            await self._tally.flush()

    # ------------------------------------------------------------ entry points

    async def run_inline(self, message: Message, body: str, driver: Driver) -> None:
        """The ``sync`` driver: run now in the caller's context; raise a final failure.

        The job gets a JSON copy of the payload, as from any other driver: the same
        types (a tuple arrives as a list), and the caller's object is never the job's."""
        copy = dataclasses.replace(message, payload=decode_payload(encode_payload(message.payload)))
        reserved = Reserved(copy, 1, body, message.queue)
        outcome, error = await self._process(reserved, driver, inline=True)
        if outcome == Outcome.FAILED and error is not None:
            raise error

    async def process(self, reserved: Reserved, driver: Driver) -> str:
        """Run one claimed message to its outcome; never raises for job errors."""
        if not driver.remote:
            message = reserved.message
            job = find_job(message.job) if message is not None else None
            if message is None or job is None or self.telemetry.get() is not None:
                return (await self._process(reserved, driver, inline=False))[0]
            # What _process does, in this frame: every in-process job passes here.
            app_token = app_var.set(self.app)
            tenant_token = _tenant.set(message.tenant)
            try:
                return (await self._run(job, message, reserved, driver, False))[0]
            finally:
                _tenant.reset(tenant_token)
                app_var.reset(app_token)
        started, clock = _time(), _perf()
        outcome, _ = await self._process(reserved, driver, inline=False)
        # Jobs per minute for queue:stats/top, written to the store every few seconds.
        tally = self._tally
        if tally is None:
            tally = self._tally = Tally(self.app, self.read_duration)
        message = reserved.message
        if tally.add(
            driver.name,
            reserved.queue,
            outcome,
            job=message.job if message is not None else None,
            wait=started - message.ts if message is not None and message.ts else None,
            runtime=_perf() - clock,
        ):
            await tally.flush()
        return outcome

    async def _process(self, reserved: Reserved, driver: Driver, *, inline: bool) -> Result:
        message = reserved.message
        if message is None:
            err = reserved.error or MessageDecodeError("message could not be decoded")
            await self._fail_undecodable(reserved, driver, err)
            return Outcome.FAILED, err
        try:
            job = get_job(message.job)
        except UnknownJobError as e:
            await self._fail_undecodable(reserved, driver, e)
            return Outcome.FAILED, e
        app_token = app_var.set(self.app)
        tenant_token = _tenant.set(message.tenant)
        try:
            otel = self.telemetry.get()
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
            app_var.reset(app_token)

    # ------------------------------------------------------------ the steps

    async def _run(
        self,
        job: JobDefinition[Any],
        message: Message,
        reserved: Reserved,
        driver: Driver,
        inline: bool,
    ) -> Result:
        ctx = JobContext(
            id=message.id,
            name=job.name,
            attempt=reserved.attempt,
            tries=job.tries,
            queue=message.queue,
            connection=driver.name,
            app=self.app,
            message=message,
        )
        run = Run(job, message, reserved, driver, ctx, inline)
        try:
            run.payload = self._decode(job, message)
        except Exception as e:
            return await self._final(run, e)
        if message.meta is not None and UNRECORDED_FAILURE in message.meta:
            return await self._unrecorded(run)
        if reserved.attempt > job.tries and job.retry_until is None and not inline:
            # Reclaimed after a worker crash with no try left: fail it, do not run it again.
            err = MaxAttemptsExceededError(
                f'Job "{job.name}" was claimed for attempt {reserved.attempt} of {job.tries}: '
                "its worker stopped (crash or retry_after passed) after using the last try"
            )
            return await self._final(run, err)
        if self._guarded(run):
            skipped = await self._guard(run)
            if skipped is not None:
                return skipped
        tracking = self.tracking
        if tracking.may_be_cancelled(run.tracked) and await tracking.cancel_seen(
            message, run.tracked, reserved.attempt
        ):
            return await self._cancelled(run, None)
        elapsed = await self._attempt(run)
        ctx = run.ctx
        if run.error is None and ctx._fail_error is None and ctx._release_delay is None:
            return await self._success(run, elapsed)
        return await self._classify(run, elapsed)

    def _decode(self, job: JobDefinition[Any], message: Message) -> Any:
        if message.enc is not None:
            message.payload = decrypt_payload(self.app, message)
            message.enc = None
        if job._n_params == 0:
            return None
        return job.from_wire(message.payload)

    def _guarded(self, run: Run) -> bool:
        """Whether ``_guard`` has anything to check (a plain message: no)."""
        message = run.message
        return message.unique is not None or message.meta is not None or self.hooks.guarded(run)

    async def _guard(self, run: Run) -> Result | None:
        """Whatever stops the attempt before it runs; None: it runs."""
        message = run.message
        if message.unique is not None and message.unique.get("until") == "processing":
            await self.locks.unlock(message)
            message.unique = None
        retried = message.meta is not None and RETRIED in message.meta
        if retried and not await self._retried(message):
            log.warning(
                'Job "%s" (%s) skipped: a retry that died queued it, the next retry '
                "queued it again, and the other copy has run",
                run.job.name,
                message.id,
            )
            await self._ack(run.driver, run.reserved)
            return Outcome.SKIPPED, None
        debounced = message.meta is not None and "debounce" in message.meta
        if debounced and await self.locks.superseded(run.job, message):
            await self._ack(run.driver, run.reserved)
            if run.tracked:
                why = "superseded (debounce)"
                await self.tracking.record(message, run.ctx, "cancelled", error=why)
            return Outcome.SKIPPED, None
        skip = await self.hooks.admit(run) or await self._claimed_elsewhere(run)
        if skip is None:
            return None
        run.outcome, run.note = Outcome.SKIPPED, skip.note
        await self.hooks.settling(run)
        await self._ack(run.driver, run.reserved)
        await self.hooks.settled(run)
        return Outcome.SKIPPED, None

    async def _retried(self, message: Message) -> bool:
        """A job retried from failed jobs: delete the record its retry claimed, in case
        the retrying process died after queueing it (``Admin`` deletes it otherwise).
        False when it must not run: a retry that died after queueing it left its claim
        to lapse, and the retry that took the claim over queued a second copy of the
        same record, which ran first (a redelivery of one copy still runs)."""
        claim = (message.meta or {}).get(RETRIED)
        if not isinstance(claim, dict):
            return True
        token, connection = claim.get("token"), claim.get("connection")
        if not isinstance(token, str) or connection not in self.app.queue_config.connections:
            return True
        record = claim.get("record")
        if isinstance(record, (int, float)) and not await self.callbacks.claim_once(
            f"haze:retry-once:{message.id}:{record!r}", token
        ):
            return False
        failed = self.app.driver(connection).failed
        if isinstance(failed, RetryClaims):
            await failed.retried(message.id, token)
        return True

    async def _claimed_elsewhere(self, run: Run) -> Skip | None:
        """A callback dispatched with a claim key that another message owns."""
        meta = run.message.meta
        once = meta.get("once") if meta is not None else None
        if isinstance(once, str) and not await self.callbacks.claim_once(
            once, run.message.id, _once_ttl(meta)
        ):
            log.info(
                'Job "%s" (%s) skipped: its callback already ran', run.job.name, run.message.id
            )
            return Skip()
        return None

    async def _attempt(self, run: Run) -> float:
        """Run the pipeline; its error (or result) is kept on ``run``. Returns seconds."""
        job, ctx = run.job, run.ctx
        if self.events.before:
            await self.events.emit("before", ctx)
        if job_log.isEnabledFor(_DEBUG):
            # ``state`` marks the lifecycle records `haze queue:work` prints as job lines.
            job_log.debug(
                'Job "%s" running (attempt %d/%d)',
                job.name,
                run.reserved.attempt,
                job.tries,
                extra=_extra(run, "running"),
            )
        started = _perf()
        run.started = True
        self.tracking.started(ctx, run.inline)
        try:
            if job.timeout is None:
                run.result = await self.pipeline(job)(run.payload, ctx)
            else:
                run.result = await with_timeout(job, self.pipeline(job), run.payload, ctx)
        except Exception as e:
            run.error = e.error if isinstance(e, Contained) else e
        except asyncio.CancelledError as e:
            task = asyncio.current_task()
            if task is None or task.cancelling():
                # The worker itself is being cancelled: put the job back untouched.
                owned = await run.driver.release(run.reserved, 0.0, consume_attempt=False)
                self.owned(owned, run.reserved, "release")
                raise
            run.error = e  # raised by the job's own code, not a cancellation of this worker
        except GeneratorExit:
            raise  # the coroutine itself is being closed: it must not go on
        except BaseException as e:
            # KeyboardInterrupt, SystemExit ... raised by job code: that job's failure (the
            # worker's own signals never get here: its handlers stop it without raising).
            run.error = e
        finally:
            self.tracking.ended(ctx)
        return _perf() - started

    async def _classify(self, run: Run, elapsed: float) -> Result:
        ctx, error = run.ctx, run.error
        if error is not None and ctx._signal is not None and ctx.cancelled():
            # Stopped after Queue.cancel(): cancelled, not failed (no retry, no failed()).
            return await self._cancelled(run, error)
        if ctx._fail_error is not None:
            return await self._final(run, ctx._fail_error)
        if error is not None:
            return await self._failure(run, error)
        if ctx._release_delay is not None:
            return await self._release(run, ctx._release_delay)
        return await self._success(run, elapsed)

    # ------------------------------------------------------------ the outcomes

    async def _success(self, run: Run, elapsed: float) -> Result:
        job = run.job
        if job_log.isEnabledFor(_DEBUG):
            job_log.debug(
                'Job "%s" done in %dms (attempt %d/%d)',
                job.name,
                round(elapsed * 1000),
                run.reserved.attempt,
                job.tries,
                extra={**_extra(run, "done"), "elapsed": elapsed},
            )
        run.outcome = Outcome.SUCCESS
        # A plain job (no chain, batch, lock, record or listener) awaits no hook at all.
        hooks = self.hooks.choose(run)
        if hooks:
            await self.hooks.settling(run)
        await self._ack(run.driver, run.reserved)
        if hooks:
            await self.hooks.settled(run)
        if run.raise_after is not None:
            raise run.raise_after
        return Outcome.SUCCESS, None

    async def _release(self, run: Run, delay: float) -> Result:
        job, message = run.job, run.message
        if run.inline:
            log.warning(
                'Job "%s" (%s) called release() on the sync connection, which cannot run '
                "it later; the job was dropped.",
                job.name,
                message.id,
            )
            await self.locks.unlock(message)
            return Outcome.RELEASED, None
        if isinstance(run.driver, CappedDelay):
            delay = run.driver.cap_delay(delay)
        if job_log.isEnabledFor(_DEBUG):
            job_log.debug(
                'Job "%s" released, back in %gs',
                job.name,
                delay,
                extra={**_extra(run, "released"), "retry_in": delay},
            )
        run.outcome, run.delay = Outcome.RELEASED, delay
        await self.hooks.settling(run)
        owned = await run.driver.release(run.reserved, delay, consume_attempt=False)
        self.owned(owned, run.reserved, "release")
        await self.hooks.settled(run)
        return Outcome.RELEASED, None

    async def _failure(self, run: Run, error: BaseException) -> Result:
        final_error = await self.failures.final_reason(run, error)
        if final_error is not None or run.inline:
            return await self._final(run, final_error or error)
        job, ctx, driver, attempt = run.job, run.ctx, run.driver, run.reserved.attempt
        delay = (
            ctx._retry_delay
            if ctx._retry_delay is not None
            else backoff_delay(job.backoff, attempt)
        )
        delay = min(delay, MAX_DELAY)  # "exponential" doubles up to 2**40 s
        if isinstance(driver, CappedDelay):
            delay = driver.cap_delay(delay)  # its warning first, then the line below
        step = driver.delay_step if isinstance(driver, DelayStep) else None
        waits = -(-delay // step) * step if step and delay > 0 else delay
        job_log.warning(
            'Job "%s" failed (attempt %d/%s), retrying in %ss: %s',
            job.name,
            attempt,
            "∞" if job.retry_until else job.tries,
            f"{waits:g}",
            _shown(run, error),
            extra={**_extra(run, "retry"), "retry_in": waits, **_error_fields(run, error)},
        )
        run.outcome, run.error, run.delay, run.shown_delay = Outcome.RETRY, error, delay, waits
        await self.hooks.settling(run)
        owned = await driver.release(run.reserved, delay, consume_attempt=True)
        self.owned(owned, run.reserved, "retry")
        await self.hooks.settled(run)
        return Outcome.RETRY, error

    async def _final(self, run: Run, error: BaseException) -> Result:
        job, message, ctx, reserved = run.job, run.message, run.ctx, run.reserved
        claim = None
        if job.failed is not None and not run.inline:  # inline: never delivered again
            claim = await self.failures.claim_failed(message)
            if claim.wait is not None:
                return await self._failed_elsewhere(run, claim.wait)
        job_log.error(
            'Job "%s" failed after %d attempt(s): %s',
            job.name,
            reserved.attempt,
            _shown(run, error),
            exc_info=error if not run.inline and not _sealed(run) else None,
            extra={**_extra(run, "failed"), **_error_fields(run, error)},
        )
        if self.events.failing:
            await self.events.emit("failing", ctx, error)
        if job.failed is not None and (claim is None or claim.run):
            payload = run.payload if run.payload is not None else message.payload
            await self.failures.run_failed(claim, job, payload, error, ctx)
        run.outcome, run.error = Outcome.FAILED, error
        await self._record_failure(run, error)
        return Outcome.FAILED, error

    async def _failed_elsewhere(self, run: Run, wait: float) -> Result:
        """Another delivery of this message holds the lease of its ``failed()`` (it runs
        it, or died in it): back in the queue until the lease ends, as the same attempt.
        The next delivery finds it done (and records the failure) or lapsed (and runs
        ``failed()`` itself)."""
        job_log.info(
            'Job "%s" (%s) failed again while its failed() handler runs (or ran when its '
            "worker died) elsewhere: back in %.1fs",
            run.job.name,
            run.message.id,
            wait,
        )
        owned = await run.driver.release(run.reserved, wait, consume_attempt=False)
        self.owned(owned, run.reserved, "release")
        return Outcome.RELEASED, None

    async def _unrecorded(self, run: Run) -> Result:
        """A final failure that the failed-job store could not keep when it happened, sent
        back by the driver to be recorded now: with the job's own error, without running
        the job or its ``failed()`` again."""
        pending = (run.message.meta or {}).get(UNRECORDED_FAILURE)
        pending = pending if isinstance(pending, dict) else {}
        text = pending.get("exception")
        text = text if isinstance(text, str) else "(the error of this failure was not kept)"
        attempt = pending.get("attempt")
        job_log.info(
            'Job "%s" (%s): recording the failure that the failed-job store could not keep '
            "when it happened",
            run.job.name,
            run.message.id,
        )
        error = JobFailedError(text)
        run.outcome, run.error = Outcome.FAILED, error
        await self._record_failure(
            run, error, exception=text, attempt=attempt if type(attempt) is int else None
        )
        return Outcome.FAILED, error

    async def _record_failure(
        self,
        run: Run,
        error: BaseException,
        *,
        exception: str | None = None,
        attempt: int | None = None,
    ) -> None:
        """Settle a final failure. An error of the failure path itself (a hook's bug, a
        record that cannot be built or stored) must not leave the job reserved, to be
        reclaimed and fail the same way for ever: it is added to the record, and the job
        is settled. Only an outage raises (the job waits for the backend, as a worker
        does for any outage)."""
        reserved, driver = run.reserved, run.driver
        also: list[BaseException] = []
        # Batch counts settle before fail(): once the job has left the queue, a crash
        # would leave the batch waiting for it forever (counted twice, it counts once).
        try:
            await self.hooks.settling(run)
        except Exception as e:
            self._unless_outage(e, also)
        try:
            record = self.failures.record(
                run.message, driver.name, error, attempt or reserved.attempt, exception=exception
            )
        except Exception as e:  # e.g. a payload that cannot be encrypted again
            also.append(e)
            record = self.failures.undecodable(reserved, driver.name, error)
            if run.job.encrypted:
                record.payload = None  # decrypted for the run: never kept in plaintext
        if also:
            record.exception = self.failures.also_raised(record.exception, also)
        self.owned(await self._store_failure(driver, reserved, record), reserved, "failure")
        try:
            await self.hooks.settled(run)
        except Exception as e:
            self._unless_outage(e, [])
            log.exception('haze: after job "%s" failed, an outcome hook raised', run.job.name)

    async def _store_failure(self, driver: Driver, reserved: Reserved, record: FailedJob) -> bool:
        """``driver.fail``; when it raises other than for an outage, once more with its
        error in the record, and then, as a last resort, the record goes to the log
        and the message is acknowledged: never left to fail the same way for ever."""
        try:
            return await driver.fail(reserved, record)
        except Exception as e:
            if self._outage(e):
                raise
            # if the record's text was the trouble, it is now bounded and plain
            record.exception = self.failures.also_raised(record.exception, [e])
        try:
            return await driver.fail(reserved, record)
        except Exception as e:
            if self._outage(e):
                raise
            log.error(
                'haze: the failure of job "%s" (%s) on %s/%s could not be recorded (%s); the '
                "message is removed from its queue and this line is its only record: %s\n%s",
                record.name,
                record.id,
                driver.name,
                record.queue,
                error_line(e),
                record.exception,
                cap_text(record.body, 4096),
            )
        return await driver.ack(reserved)

    def _outage(self, error: BaseException) -> bool:
        """Whether ``error`` says a backend cannot be reached (of any connection in use)."""
        if isinstance(error, OSError):  # BackendUnavailableError and database outages too
            return True
        return any(
            unavailable(d, error) is not None for d in list(self.app.open_drivers().values())
        )

    def _unless_outage(self, error: Exception, also: list[BaseException]) -> None:
        if self._outage(error):
            raise error
        also.append(error)

    async def _cancelled(self, run: Run, error: BaseException | None) -> Result:
        """End a cancelled job: acked, no retry, no ``failed()``; a batch counts it like
        the jobs a cancelled batch skips; the rest of its chain does not run."""
        job_log.info(
            'Job "%s" cancelled%s',
            run.job.name,
            " while running" if error is not None else " before it ran",
            extra=_extra(run, "cancelled"),
        )
        run.outcome = Outcome.CANCELLED
        run.note = "cancelled while running" if error is not None else "cancelled before it ran"
        await self.hooks.settling(run)
        await self._ack(run.driver, run.reserved)
        await self.hooks.settled(run)
        return Outcome.CANCELLED, None

    # ------------------------------------------------------------ the driver's record

    async def _fail_undecodable(
        self, reserved: Reserved, driver: Driver, error: BaseException
    ) -> None:
        log.error("haze: cannot run a message on %s/%s: %s", driver.name, reserved.queue, error)
        record = self.failures.undecodable(reserved, driver.name, error)
        self.owned(await self._store_failure(driver, reserved, record), reserved, "failure")

    async def _ack(self, driver: Driver, reserved: Reserved) -> None:
        later = reserved.ack_later
        if later is not None:
            # A batching worker sends it with other acks in a few ms, and warns then if
            # the lease was lost. Chains, batches and unique locks were settled before.
            later(reserved)
            return
        try:
            owned = await driver.ack(reserved)
        except Exception as e:
            if reserved.ack_failed is None:
                raise  # no consumer keeps it: the lease runs out and the job runs again
            reserved.ack_failed(reserved, e)  # the worker sends it again
            return
        self.owned(owned, reserved, "completion")

    def owned(self, owned: bool, reserved: Reserved, what: str) -> None:
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


def _once_ttl(meta: dict[str, Any] | None) -> float | None:
    """How long the message asks its once key to be kept (a schedule's tick: its own
    window); None, or a value that is not a positive number, keeps the default."""
    ttl = None if meta is None else meta.get("once_ttl")
    if ttl.__class__ in (int, float) and 0 < ttl < math.inf:
        return float(ttl)
    return None


def _extra(run: Run, state: str) -> dict[str, Any]:
    """The fields of a lifecycle log record (``state`` marks the job lines). A job
    cancelled before its handler started shows the attempts that ran (0 for a first
    delivery), not the one it was delivered for."""
    attempt = run.reserved.attempt
    if state == "cancelled" and not run.started:
        attempt = max(0, attempt - 1)
    return {"job": run.job.name, "job_id": run.message.id, "attempt": attempt, "state": state}


def _sealed(run: Run) -> bool:
    """Whether the run's error stays encrypted: an encrypted job's text (often made of its
    payload: "card 4242 declined") is kept in its encrypted failed record only. A payload
    that could not be decrypted (``enc`` still set) was never read: its error is plain."""
    return run.job.encrypted and run.message.enc is None


def _shown(run: Run, error: BaseException) -> str:
    """The error as a log line shows it."""
    return sealed_error(error) if _sealed(run) else error_line(error)


def _error_fields(run: Run, error: BaseException) -> dict[str, Any]:
    """The log record's error: the exception itself, or only what ``_shown`` shows."""
    return {"error_text": sealed_error(error)} if _sealed(run) else {"error": error}
