"""Failures: whether a failed attempt retries, the failed-job record, ``failed()``.

An attempt that raised retries unless the error is final: listed in ``dont_retry``, a
timeout with ``fail_on_timeout``, the ``max_exceptions``-th exception of the job, past
``retry_until``, or on its last try. The ``max_exceptions`` counter lives in the
state store under ``haze:exceptions:<id>`` until the job ends (``ExceptionCount``).

A job's ``failed()`` runs at least once per final failure, and once unless a process
dies while it runs: its key ``haze:failed-once:<id>:<dispatch time>`` in the state store
holds a lease (``lease:<token>``, ``FAILED_LEASE`` seconds, renewed while ``failed()``
runs), then ``done`` (a week) once ``failed()`` returned. A delivery of the same message
that finds ``done`` records the failure without running ``failed()``; one that finds a
live lease hands the message back until the lease ends; one that finds it lapsed (its
holder died) takes it over and runs ``failed()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import inspect
import logging
import time
from typing import TYPE_CHECKING, Any, NamedTuple

from haze._base.crypto import encrypt_payload, seal_failure, sealed_error
from haze._base.describe import cap_text, error_line, format_error
from haze._base.errors import JobTimeoutError, MaxExceptionsError, RetryUntilExpiredError
from haze._base.message import (
    OFFLOADED,
    RETRIED,
    UNRECORDED_FAILURE,
    Message,
    decode,
    encode,
    new_id,
)
from haze._engine.hooks import Outcome, Run
from haze._jobs.definition import find_job
from haze.contracts.driver import FailedJob

if TYPE_CHECKING:
    from haze._engine.stores import EngineStores
    from haze._engine.view import EngineApp
    from haze._jobs.context import JobContext
    from haze._jobs.definition import JobDefinition
    from haze.contracts.driver import Reserved

__all__ = ["FAILED_LEASE", "ExceptionCount", "FailedClaim", "Failures", "format_error"]

log = logging.getLogger("haze")
_time = time.time
#: Meta fields of a delivery, never of the stored failed record.
_TRANSIENT = (RETRIED, UNRECORDED_FAILURE)


#: How long a job's failed() once-key is kept done: longer than any redelivery of its message.
_FAILED_ONCE_TTL = 7 * 86400
#: Seconds a failed() lease lasts unless renewed (every third of it while failed() runs):
#: how long a delivery waits before it runs the failed() of a process that died in it.
FAILED_LEASE = 60.0
_LEASE = "lease:"
_DONE = "done"


class FailedClaim(NamedTuple):
    """What a final failure does about ``failed()`` (``Failures.claim_failed``)."""

    #: Run ``failed()`` now.
    run: bool
    #: The once-key, and the lease this delivery holds on it (None: no lease to mark).
    key: str
    token: str | None = None
    #: Another delivery holds a live lease: seconds until it ends (hand the message back).
    wait: float | None = None


def exceptions_key(message: Message) -> str:
    return f"haze:exceptions:{message.id}"


class Failures:
    """What a failure means, and how it is kept, for one app."""

    def __init__(self, app: EngineApp, stores: EngineStores) -> None:
        self.app = app
        self.stores = stores

    async def final_reason(self, run: Run, error: BaseException) -> BaseException | None:
        """None to retry; otherwise the error to fail with."""
        job, message = run.job, run.message
        if job.dont_retry and isinstance(error, job.dont_retry):
            return error
        if isinstance(error, JobTimeoutError) and job.fail_on_timeout:
            return error
        if job.max_exceptions is not None:
            key = exceptions_key(message)
            n = await self.stores.state().increment(key, 1, 7 * 86400)
            if n >= job.max_exceptions:
                return MaxExceptionsError(
                    f'Job "{job.name}" raised {n} exceptions '
                    f"(max_exceptions={job.max_exceptions}); "
                    f"last: {error_line(error)}"
                )
        if job.retry_until is not None:
            first = float((message.meta or {}).get("first_ts") or message.ts)
            if _time() >= first + job.retry_until:
                return RetryUntilExpiredError(
                    f'Job "{job.name}" passed retry_until ({job.retry_until:g}s after its first '
                    f"dispatch); last: {error_line(error)}"
                )
            return None
        if run.reserved.attempt >= job.tries:
            return error
        return None

    async def claim_failed(self, message: Message) -> FailedClaim:
        """Whether this final failure of ``message`` runs its job's ``failed()``: a lease
        on its once-key, per message id and dispatch time (a retry from failed jobs is
        a new dispatch time). A store that cannot be reached runs ``failed()``, with a
        warning: at least once, never lost."""
        key = f"haze:failed-once:{message.id}:{message.ts!r}"
        token = f"{_LEASE}{new_id()}"
        store = self.stores.state()
        try:
            for _ in range(3):  # a lease that lapses between add and get: add again
                if await store.add(key, token, FAILED_LEASE):
                    return FailedClaim(True, key, token)
                held = await store.get(key)
                if held is None:
                    continue
                if not (isinstance(held, str) and held.startswith(_LEASE)):
                    return FailedClaim(False, key)  # done (1: marked by an earlier haze)
                left = await store.ttl(key)
                return FailedClaim(False, key, wait=_lease_left(left))
            return FailedClaim(False, key, wait=FAILED_LEASE)
        except Exception as e:
            log.warning(
                "haze: could not claim the failed() of job %s in the state store (%s): it "
                "runs, and runs again if its message is delivered again",
                message.id,
                error_line(e),
            )
            return FailedClaim(True, key)

    async def run_failed(
        self,
        claim: FailedClaim | None,
        job: JobDefinition[Any],
        payload: Any,
        error: BaseException,
        ctx: JobContext,
    ) -> None:
        """``failed()`` under the claim's lease (renewed while it runs), then marked done:
        a delivery after that never runs it again."""
        token = claim.token if claim is not None else None
        if claim is None or token is None:
            await self.call_failed(job, payload, error, ctx)
            return
        renewal = asyncio.ensure_future(self._renew(claim.key, token))
        try:
            await self.call_failed(job, payload, error, ctx)
        finally:
            renewal.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewal
        try:
            await self.stores.state().put(claim.key, _DONE, _FAILED_ONCE_TTL)
        except Exception as e:
            log.warning(
                "haze: the failed() of job %s ran, but the state store could not mark it done "
                "(%s): it runs again if its message is delivered again",
                ctx.id,
                error_line(e),
            )

    async def _renew(self, key: str, token: str) -> None:
        """Keep the lease while ``failed()`` runs; a lost one is said once."""
        store = self.stores.state()
        while True:
            await asyncio.sleep(FAILED_LEASE / 3)
            try:
                if await store.touch(key, token, FAILED_LEASE):
                    continue
                log.warning(
                    "haze: the lease of a failed() handler (%s) lapsed while it ran "
                    "(its event loop was blocked, or the store lost it): another delivery "
                    "of the job may run failed() too",
                    key,
                )
                return
            except Exception as e:  # an outage: the lease may still hold; try again
                log.warning("haze: could not renew the lease of %s (%s)", key, error_line(e))

    async def call_failed(
        self, job: JobDefinition[Any], payload: Any, error: BaseException, ctx: JobContext
    ) -> None:
        """The job's ``failed(payload, error, job)`` handler (any prefix of those)."""
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

    def record(
        self,
        message: Message,
        connection: str,
        error: BaseException,
        attempt: int | None = None,
        *,
        exception: str | None = None,
        delivered: str | None = None,
    ) -> FailedJob:
        """The failed-job record of ``message`` (``exception``: its text, when it was
        described earlier; else ``error``'s traceback). ``delivered``: the body it came
        in, whose payload the record keeps: the job may have changed its own."""
        # A retried job must not release a lock it no longer holds: the stored body drops
        # ``unique``, but ``message`` keeps it so that the failure can still release it.
        body_message = copy.copy(message)
        body_message.unique = None
        _as_delivered(body_message, delivered)
        meta = message.meta
        if meta is not None and (RETRIED in meta or UNRECORDED_FAILURE in meta):
            # the claim of the retry that queued it; a failure sent back to be recorded
            meta = {k: v for k, v in meta.items() if k not in _TRANSIENT} or None
        if attempt is not None:
            # The attempt it failed on rides in the stored body's meta: every driver's
            # failed record keeps that body, so no failed-table column is needed.
            meta = {**(meta or {}), "failed_attempt": attempt}
        body_message.meta = meta
        job = find_job(message.job)
        exception = format_error(error) if exception is None else cap_text(exception)
        if message.enc is None and job is not None and job.encrypted:
            if body_message.enc is None:
                encrypt_payload(self.app, body_message)
            # The job saw its plaintext, and its error text is often made of it ("card
            # 4242 declined"): kept encrypted in the body, the record's own column names
            # the type only. (A payload that could not be decrypted keeps its plain
            # error: no plaintext was read, and the operator must see why.)
            sealed = seal_failure(self.app, message.id, exception)
            body_message.meta = {**(body_message.meta or {}), "failed_exception": sealed}
            exception = sealed_error(error)
        offloaded = meta is not None and OFFLOADED in meta
        if offloaded:
            # the object keeps the payload (a retry reads it again): the record, a reference
            body_message.payload, body_message.enc = None, None
        return FailedJob(
            id=message.id,
            name=message.job,
            connection=connection,
            queue=message.queue,
            payload=None if body_message.enc is not None or offloaded else body_message.payload,
            exception=exception,
            failed_at=_time(),
            chain_id=message.chain_id,
            batch_id=message.batch_id,
            body=encode(body_message),
        )

    @staticmethod
    def also_raised(exception: str, errors: list[BaseException]) -> str:
        """A failed record's text, with the errors its failure path raised after it."""
        parts = [exception]
        for e in errors:
            parts.append(f"While this failure was recorded, haze raised:\n{format_error(e)}")
        return cap_text("\n\n".join(parts))

    @staticmethod
    def undecodable(reserved: Reserved, connection: str, error: BaseException) -> FailedJob:
        """The failed-job record of a message that cannot run (bad body, unknown job)."""
        m = reserved.message
        return FailedJob(
            id=m.id if m else new_id(),
            name=m.job if m else "<undecodable>",
            connection=connection,
            queue=reserved.queue,
            payload=m.payload if m else reserved.body,
            exception=format_error(error),
            failed_at=_time(),
            chain_id=m.chain_id if m else None,
            batch_id=m.batch_id if m else None,
            body=reserved.body,
        )


def _lease_left(left: float | None) -> float:
    """Seconds until a lease ends: its TTL, at most one lease (never 0: a store without
    TTLs says None, and the message must not come back at once, again and again)."""
    if left is None or not 0 < left <= FAILED_LEASE:
        return FAILED_LEASE
    return left


class ExceptionCount:
    """Outcome hook: a job's ``max_exceptions`` counter goes when the job ends."""

    def __init__(self, stores: EngineStores) -> None:
        self.stores = stores

    def wants(self, run: Run) -> bool:
        return run.job.max_exceptions is not None

    def quiet_for(self, job: JobDefinition[Any]) -> bool:
        return job.max_exceptions is None

    async def settling(self, run: Run) -> None:
        if run.outcome in (Outcome.SUCCESS, Outcome.CANCELLED):
            await self._forget(run)

    async def settled(self, run: Run) -> None:
        if run.outcome == Outcome.FAILED:
            await self._forget(run)

    async def _forget(self, run: Run) -> None:
        if run.job.max_exceptions is not None:
            await self.stores.state().delete(exceptions_key(run.message))


def _as_delivered(message: Message, delivered: str | None) -> None:
    """Give ``message`` the payload (plain or sealed) of the body it was delivered in.

    The job received a copy it may change (a dict it appended to); a record of the
    changed payload would make ``Queue.retry`` run something nobody dispatched. Read on
    the failure path only: every other path keeps no payload."""
    if delivered is None:
        return
    try:
        original = decode(delivered)
    except Exception:  # a body that cannot be read again keeps what the run had
        return
    if original.id == message.id and original.job == message.job:
        message.payload, message.enc = original.payload, original.enc
