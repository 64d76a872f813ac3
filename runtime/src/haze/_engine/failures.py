"""Failures: whether a failed attempt retries, the failed-job record, ``failed()``.

An attempt that raised retries unless the error is final: listed in ``dont_retry``, a
timeout with ``fail_on_timeout``, the ``max_exceptions``-th exception of the job, past
``retry_until``, or on its last try. The ``max_exceptions`` counter lives in the
state store under ``haze:exceptions:<id>`` until the job ends (``ExceptionCount``).
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import logging
import time
from typing import TYPE_CHECKING, Any

from haze._engine.hooks import Outcome, Run
from haze._jobs.definition import find_job
from haze._kernel.crypto import encrypt_payload, seal_failure, sealed_error
from haze._kernel.describe import cap_text, error_line, format_error
from haze._kernel.errors import JobTimeoutError, MaxExceptionsError, RetryUntilExpiredError
from haze._kernel.message import RETRIED, UNRECORDED_FAILURE, Message, encode, new_id
from haze.contracts.driver import FailedJob

if TYPE_CHECKING:
    from haze._app.app import App
    from haze._engine.stores import EngineStores
    from haze._jobs.context import JobContext
    from haze._jobs.definition import JobDefinition
    from haze.contracts.driver import Reserved

__all__ = ["ExceptionCount", "Failures", "format_error"]

log = logging.getLogger("haze")
_time = time.time
#: Meta fields of a delivery, never of the stored failed record.
_TRANSIENT = (RETRIED, UNRECORDED_FAILURE)


#: How long a job's failed() once-key is kept: longer than any redelivery of its message.
_FAILED_ONCE_TTL = 7 * 86400


def exceptions_key(message: Message) -> str:
    return f"haze:exceptions:{message.id}"


class Failures:
    """What a failure means, and how it is kept, for one app."""

    def __init__(self, app: App, stores: EngineStores) -> None:
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

    async def first_failure(self, message: Message) -> bool:
        """Whether this final failure of ``message`` is the first to run its job's
        ``failed()``: a once-key in the state store, per message id and dispatch time
        (a retry from failed jobs is a new dispatch time). A message delivered again
        after its failure was handed on (its worker died before it deleted the original)
        finds the key taken. A store that cannot be reached runs ``failed()``, with a
        warning: at least once, never lost."""
        key = f"haze:failed-once:{message.id}:{message.ts!r}"
        try:
            return await self.stores.state().add(key, 1, _FAILED_ONCE_TTL)
        except Exception as e:
            log.warning(
                "haze: could not mark job %s as failed in the state store (%s): its failed() "
                "runs, and runs again if its message is delivered again",
                message.id,
                error_line(e),
            )
            return True

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
    ) -> FailedJob:
        """The failed-job record of ``message`` (``exception``: its text, when it was
        described earlier; else ``error``'s traceback)."""
        # A retried job must not release a lock it no longer holds: the stored body drops
        # ``unique``, but ``message`` keeps it so that the failure can still release it.
        body_message = copy.copy(message)
        body_message.unique = None
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
        if exception is None:
            exception = format_error(error)
        if message.enc is None and job is not None and job.encrypted:
            encrypt_payload(self.app, body_message)
            # The job saw its plaintext, and its error text is often made of it ("card
            # 4242 declined"): kept encrypted in the body, the record's own column names
            # the type only. (A payload that could not be decrypted keeps its plain
            # error: no plaintext was read, and the operator must see why.)
            sealed = seal_failure(self.app, message.id, exception)
            body_message.meta = {**(body_message.meta or {}), "failed_exception": sealed}
            exception = sealed_error(error)
        return FailedJob(
            id=message.id,
            name=message.job,
            connection=connection,
            queue=message.queue,
            payload=None if body_message.enc is not None else message.payload,
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


class ExceptionCount:
    """Outcome hook: a job's ``max_exceptions`` counter goes when the job ends."""

    def __init__(self, stores: EngineStores) -> None:
        self.stores = stores

    def wants(self, run: Run) -> bool:
        return run.job.max_exceptions is not None

    async def settling(self, run: Run) -> None:
        if run.outcome in (Outcome.SUCCESS, Outcome.CANCELLED):
            await self._forget(run)

    async def settled(self, run: Run) -> None:
        if run.outcome == Outcome.FAILED:
            await self._forget(run)

    async def _forget(self, run: Run) -> None:
        if run.job.max_exceptions is not None:
            await self.stores.state().delete(exceptions_key(run.message))
