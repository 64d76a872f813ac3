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
import contextvars
import dataclasses
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from haze._base.crypto import decrypt_payload
from haze._base.current import app_var
from haze._base.errors import (
    MaxAttemptsExceededError,
    MessageDecodeError,
    OffloadError,
    OffloadStoreError,
    UnknownJobError,
)
from haze._base.message import (
    OFFLOADED,
    RETRIED,
    UNRECORDED_FAILURE,
    decode_payload,
    encode_payload,
)
from haze._engine.hooks import Outcome, Run, Skip
from haze._engine.offload import Offload
from haze._engine.pipeline import Contained, Pipeline, compose, with_timeout
from haze._engine.settle import Result, Settle, _extra
from haze._engine.throughput import ReadDuration, Tally
from haze._jobs.context import _tenant
from haze._jobs.definition import find_job, get_job
from haze._jobs.lines import job_lines
from haze.contracts.driver import Reserved
from haze.contracts.failed import RetryClaims

if TYPE_CHECKING:
    from haze._base.message import Message
    from haze._engine.callbacks import Callbacks
    from haze._engine.events import Events
    from haze._engine.failures import Failures
    from haze._engine.hooks import Hooks
    from haze._engine.locks import Locks
    from haze._engine.otel import TelemetrySlot
    from haze._engine.tracking import Tracking
    from haze._engine.view import EngineApp
    from haze._jobs.definition import JobDefinition
    from haze.contracts.driver import Driver

__all__ = ["Execution"]

log = logging.getLogger("haze")
job_log = logging.getLogger("haze.job")

_DEBUG = logging.DEBUG


class _InlineRun:
    """The jobs an inline run queued while settling (a chain's next link, a callback).

    They run after the job that queued them has settled, in the same ``dispatch()``:
    run inside its settling, each link would nest in the one before, and a long chain
    would exhaust the stack."""

    __slots__ = ("pending", "settling")

    def __init__(self) -> None:
        self.pending: list[tuple[Message, str, Driver]] = []
        self.settling = False


_inline_run: contextvars.ContextVar[_InlineRun | None] = contextvars.ContextVar(
    "haze_inline_run", default=None
)
_perf = time.perf_counter
_time = time.time

#: Seconds until a job whose offloaded payload could not be read (the store is down)
#: is claimed again; its attempt is handed back, so an outage never uses up its tries.
OFFLOAD_OUTAGE_DELAY = 5.0

#: Middleware that runs before the app's and the job's (the queue limits of the config).
MiddlewareSource = Callable[[], list[Callable[..., Any]]]


class Execution(Settle):
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
        offload: Offload | None = None,
    ) -> None:
        self.app = app
        self.offload = offload if offload is not None else Offload(app)
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

        A job dispatched while another inline job settles runs right after that one
        settled, before the outer ``dispatch()`` returns (a loop, not a nesting)."""
        outer = _inline_run.get()
        if outer is not None and outer.settling:
            outer.pending.append((message, body, driver))
            return
        state = _InlineRun()
        token = _inline_run.set(state)
        failure: BaseException | None = None
        try:
            failure = await self._run_inline_one(message, body, driver)
            while state.pending:
                state.settling = False
                error = await self._run_inline_one(*state.pending.pop(0))
                failure = failure or error
        finally:
            _inline_run.reset(token)
        if failure is not None:
            raise failure

    async def _run_inline_one(
        self, message: Message, body: str, driver: Driver
    ) -> BaseException | None:
        """Its final failure, raised by ``run_inline`` once what it queued has run (a
        chain's catch job). The job gets a JSON copy of the payload, as from any other
        driver: the same types (a tuple arrives as a list), and the caller's object is
        never the job's."""
        copy = dataclasses.replace(message, payload=decode_payload(encode_payload(message.payload)))
        reserved = Reserved(copy, 1, body, message.queue)
        outcome, error = await self._process(reserved, driver, inline=True)
        return error if outcome == Outcome.FAILED else None

    async def process(self, reserved: Reserved, driver: Driver) -> str:
        """Run one claimed message to its outcome; never raises for job errors."""
        if not driver.remote:
            message = reserved.message
            job = find_job(message.job) if message is not None else None
            slot = self.telemetry
            otel = slot.value if slot.resolved else slot.get()
            if message is None or job is None or otel is not None:
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
        run = Run(job, message, reserved, driver, self.app, inline)
        meta = message.meta
        if meta is not None and OFFLOADED in meta and UNRECORDED_FAILURE not in meta:
            stopped = await self._restore(run)
            if stopped is not None:
                return stopped
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
        if message.unique is not None or message.meta is not None or self.hooks.guarded(run):
            skipped = await self._guard(run)
            if skipped is not None:
                return skipped
        tracking = self.tracking
        meta = message.meta
        tracked = meta is not None and "track" in meta  # run.tracked, without its frame
        if tracking.may_be_cancelled(tracked) and await tracking.cancel_seen(
            message, tracked, reserved.attempt
        ):
            return await self._cancelled(run, None)
        elapsed = await self._attempt(run)
        if inline:
            state = _inline_run.get()
            if state is not None:
                state.settling = True
        ctx = run.ctx
        if run.error is None and ctx._fail_error is None and ctx._release_delay is None:
            return await self._success(run, elapsed)
        return await self._classify(run, elapsed)

    async def _restore(self, run: Run) -> Result | None:
        """Read an offloaded payload back; None: it is in the message now. A missing or
        corrupt object fails the job. A store that cannot be read is an outage, not a
        lost payload: the job is released with its attempt handed back (one warning),
        to run once the store is back."""
        try:
            await self.offload.restore(run.message, run.driver.name)
        except OffloadStoreError as e:
            if run.inline:  # sync: no queue to put it back on
                return await self._final(run, e)
            log.warning(
                "%s; the job is back in its queue in %gs, as the same attempt",
                e,
                OFFLOAD_OUTAGE_DELAY,
                extra={"job": run.job.name, "job_id": run.message.id},
            )
            return await self._release(run, OFFLOAD_OUTAGE_DELAY)
        except OffloadError as e:
            return await self._final(run, e)
        except Exception as e:
            return await self._failure(run, e)
        return None

    def _decode(self, job: JobDefinition[Any], message: Message) -> Any:
        if message.enc is not None:
            message.payload = decrypt_payload(self.app, message)
            message.enc = None
        if job._n_params == 0:
            return None
        return job.from_wire(message.payload)

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
            # Its object is the other copy's too, which owns it: that copy may still
            # be retried, or be in failed jobs again.
            await self._ack(run.driver, run.reserved)
            return Outcome.SKIPPED, None
        debounced = message.meta is not None and "debounce" in message.meta
        if debounced and await self.locks.superseded(run.job, message):
            await self._ack(run.driver, run.reserved)
            await self.offload.discard(message.meta, run.driver.name)
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
            # ``state`` marks the lifecycle records `haze queue:work` prints as job lines;
            # this one is logged once the job has started (_jobs/lines.py)
            job_lines.debug(
                _time(),
                'Job "%s" running (attempt %d/%d)',
                (job.name, run.reserved.attempt, job.tries),
                _extra(run, "running"),
            )
        started = _perf()
        run.started = True
        self.tracking.started(ctx, run.inline)
        pipe = self._pipelines.get(job)
        if pipe is None:
            pipe = self.pipeline(job)
        try:
            if job.timeout is None:
                run.result = await pipe(run.payload, ctx)
            else:
                run.result = await with_timeout(job, pipe, run.payload, ctx)
        except Exception as e:
            run.error = e.error if isinstance(e, Contained) else e
        except BaseException as e:
            await self._stopped(run, e)
        finally:
            self.tracking.ended(ctx)
        return _perf() - started

    async def _stopped(self, run: Run, error: BaseException) -> None:
        """A BaseException out of the handler: the run's error, or raised on."""
        if isinstance(error, asyncio.CancelledError):
            task = asyncio.current_task()
            if task is None or task.cancelling():
                # The worker itself is being cancelled: put the job back untouched.
                owned = await run.driver.release(run.reserved, 0.0, consume_attempt=False)
                self.owned(owned, run.reserved, "release")
                raise error
        elif isinstance(error, GeneratorExit):
            raise error  # the coroutine itself is being closed: it must not go on
        # the job's own CancelledError, KeyboardInterrupt, SystemExit...: its failure (the
        # worker's own signals never get here: its handlers stop it without raising)
        run.error = error

    async def resume(self, run: Run, rest: Awaitable[Any], started: float) -> str:
        """Finish an attempt begun on the short path of a plain job (``haze._engine.
        plain``): ``rest`` is the rest of its handler (or raises what it raised), then
        the outcome as ``_run`` settles it."""
        app_token = app_var.set(self.app)
        tenant_token = _tenant.set(run.message.tenant)
        try:
            try:
                run.result = await rest
            except Exception as e:
                run.error = e
            except BaseException as e:
                await self._stopped(run, e)
            finally:
                self.tracking.ended(run.ctx)
            elapsed = _perf() - started
            ctx = run.ctx
            if run.error is None and ctx._fail_error is None and ctx._release_delay is None:
                return (await self._success(run, elapsed))[0]
            return (await self._classify(run, elapsed))[0]
        finally:
            _tenant.reset(tenant_token)
            app_var.reset(app_token)


def _once_ttl(meta: dict[str, Any] | None) -> float | None:
    """How long the message asks its once key to be kept (a schedule's tick: its own
    window); None, or a value that is not a positive number, keeps the default."""
    ttl = None if meta is None else meta.get("once_ttl")
    if ttl.__class__ in (int, float) and 0 < ttl < math.inf:
        return float(ttl)
    return None
