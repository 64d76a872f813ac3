"""How an attempt's outcome is recorded on the driver: the settle step of ``Execution``.

    success  → hooks.settling ─ ack ─ hooks.settled
    release  → driver.release(consume_attempt=False)
    retry    → driver.release(backoff, consume_attempt=True)
    failure  → failed() ─ hooks.settling ─ driver.fail ─ hooks.settled
    cancel   → hooks.settling ─ ack ─ hooks.settled

A hook's ``settling`` step runs before the driver records the outcome (work that must
survive a crash is redone on redelivery), its ``settled`` step after it. A failed
record the store cannot keep is handed back to the queue, never dropped.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from haze._base.crypto import sealed_error
from haze._base.describe import cap_text, error_line
from haze._base.durations import MAX_DELAY, backoff_delay
from haze._base.errors import JobFailedError, WorkflowError
from haze._base.message import UNRECORDED_FAILURE
from haze._engine.hooks import Outcome, Run
from haze._jobs.lines import job_lines
from haze.contracts.driver import CappedDelay, DelayStep, unavailable

if TYPE_CHECKING:
    from haze._engine.events import Events
    from haze._engine.failures import Failures
    from haze._engine.hooks import Hooks
    from haze._engine.locks import Locks
    from haze._engine.view import EngineApp
    from haze.contracts.driver import Driver, FailedJob, Reserved

__all__ = ["Settle"]

log = logging.getLogger("haze")
job_log = logging.getLogger("haze.job")

_DEBUG = logging.DEBUG
_time = time.time

#: seconds a job whose final failure no failed-job store would keep waits in its queue
#: before it runs again (not dropped: the log line alone is no record)
UNRECORDED_RETRY = 60.0

Result = tuple[str, "BaseException | None"]


class Settle:
    """The outcome steps of ``Execution`` (which sets these attributes)."""

    app: EngineApp
    hooks: Hooks
    locks: Locks
    failures: Failures
    events: Events

    async def _classify(self, run: Run, elapsed: float) -> Result:
        job_lines.flush()  # its RUNNING line before the outcome's
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
            # logged while the ack is on its way (_jobs/lines.py)
            job_lines.debug(
                _time(),
                'Job "%s" done in %dms (attempt %d/%d)',
                (job.name, round(elapsed * 1000), run.reserved.attempt, job.tries),
                {**_extra(run, "done"), "elapsed": elapsed},
            )
        run.outcome = Outcome.SUCCESS
        # A plain job (no chain, batch, lock, record or listener) awaits no hook at all.
        hooks = self.hooks.choose(run)
        if hooks:
            await self.hooks.settling(run)
        await self._ack(run.driver, run.reserved)
        job_lines.flush()  # written already unless the ack did not wait
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
            exc_info=error if _traceback(run, error) else None,
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
                run.message,
                driver.name,
                error,
                attempt or reserved.attempt,
                exception=exception,
                delivered=reserved.body,
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
        error in the record, and then, as a last resort, the record goes to the log and
        the message goes back to its queue for ``UNRECORDED_RETRY`` seconds: a job is
        never dropped with no failed record (it runs again later, and is recorded once
        the store takes it)."""
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
                "message goes back to its queue and runs again in %.0fs: %s\n%s",
                record.name,
                record.id,
                driver.name,
                record.queue,
                error_line(e),
                UNRECORDED_RETRY,
                record.exception,
                cap_text(record.body, 4096),
            )
        return await driver.release(reserved, UNRECORDED_RETRY, consume_attempt=False)

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
            reserved.ack_pending = True
            later(reserved)
            return
        try:
            owned = await driver.ack(reserved)
        except Exception as e:
            if reserved.ack_failed is None:
                raise  # no consumer keeps it: the lease runs out and the job runs again
            reserved.ack_pending = True
            reserved.ack_failed(reserved, e)  # the worker sends it again
            return
        self.owned(owned, reserved, "completion")

    def owned(self, owned: bool, reserved: Reserved, what: str) -> None:
        """Warn when ack/release/fail found the job no longer this worker's (and mark it,
        for the worker's ``leases_lost``): the outcome was not recorded."""
        if owned is not False:  # a driver from before the bool return says None
            return
        reserved.lease_lost = True
        job_lines.flush()  # the job's DONE line before this one
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


def _traceback(run: Run, error: BaseException) -> bool:
    """Whether the failure's log line carries its traceback: a crash's, not a broken
    workflow rule's (the user's error, which its one line names), an inline run's (its
    caller gets the error) or a sealed one's (the traceback would show its text)."""
    return not (run.inline or _sealed(run) or isinstance(error, WorkflowError))


def _shown(run: Run, error: BaseException) -> str:
    """The error as a log line shows it."""
    return sealed_error(error) if _sealed(run) else error_line(error)


def _error_fields(run: Run, error: BaseException) -> dict[str, Any]:
    """The log record's error: the exception itself, or only what ``_shown`` shows."""
    return {"error_text": sealed_error(error)} if _sealed(run) else {"error": error}
