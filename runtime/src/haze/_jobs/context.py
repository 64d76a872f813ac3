"""The job context (``JobContext``), its abort signal, and tenancy.

>>> @define_job(timeout="30s")
... async def fetch(payload: dict, job: JobContext) -> None:
...     job.logger.info("attempt %s", job.attempt)
...     if job.signal.aborted:
...         return
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import Iterator, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

from haze._base.durations import Duration, parse_delay
from haze._base.errors import JobFailedError
from haze._jobs.lines import job_lines
from haze._jobs.pending import PendingDispatch
from haze._jobs.status import cancelled_reason, check_progress

if TYPE_CHECKING:
    from haze._base.message import Message
    from haze._jobs.views import BatchView, JobsApp

__all__ = ["AbortSignal", "JobContext", "current_tenant", "tenant"]

job_logger = logging.getLogger("haze.job")

_tenant: contextvars.ContextVar[str | None] = contextvars.ContextVar("haze_tenant", default=None)


def current_tenant() -> str | None:
    """The tenant set by the innermost ``with haze.tenant(...)``, or None (central)."""
    return _tenant.get()


@contextlib.contextmanager
def tenant(name: str | None) -> Iterator[None]:
    """Run a block as ``name``: dispatches inside capture it, and the job runs as it again.

    >>> with tenant("acme"):
    ...     ...  # await send_invoice.dispatch({...}) carries tenant "acme"
    """
    if name is not None and (not isinstance(name, str) or not name):
        raise ValueError(f"tenant: expected a non-empty string or None, got {name!r}")
    token = _tenant.set(name)
    try:
        yield
    finally:
        _tenant.reset(token)


class AbortSignal:
    """Set when the attempt times out (or the worker must stop it). Like JS ``AbortSignal``."""

    __slots__ = ("_event", "reason")

    def __init__(self) -> None:
        self.reason: BaseException | None = None
        self._event: asyncio.Event | None = None

    @property
    def aborted(self) -> bool:
        return self.reason is not None

    def abort(self, reason: BaseException) -> None:
        if self.reason is None:
            self.reason = reason
            if self._event is not None:
                self._event.set()

    def throw_if_aborted(self) -> None:
        """Raise the reason (``JobTimeoutError``, ``JobCancelledError``) if the signal is set.

        >>> # for row in rows: job.signal.throw_if_aborted(); await handle(row)
        """
        if self.reason is not None:
            raise self.reason

    async def wait(self) -> None:
        """Return once the signal is set."""
        if self.reason is not None:
            return
        if self._event is None:
            self._event = asyncio.Event()
        await self._event.wait()

    def __repr__(self) -> str:
        return f"<AbortSignal aborted={self.aborted}>"


class _JobLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, Any]:
        job_lines.flush()  # the job's RUNNING line first
        extra = dict(self.extra or {})
        if "extra" in kwargs:
            extra.update(kwargs["extra"])
        kwargs["extra"] = extra
        return msg, kwargs


class JobContext:
    """What a running job knows about itself; the second argument of a handler.

    ``release()``, ``fail()`` and ``batch()`` are plain methods; the ``Batch`` that
    ``batch()`` returns has the async methods (``await job.batch().fresh()``).
    """

    __slots__ = (
        "_batch",
        "_chain_appended",
        "_chain_prepended",
        "_error",
        "_fail_error",
        "_logger",
        "_loop",
        "_progress",
        "_progress_tasks",
        "_release_delay",
        "_retry_delay",
        "_signal",
        "app",
        "attempt",
        "connection",
        "id",
        "message",
        "name",
        "queue",
        "tries",
    )

    def __init__(
        self,
        *,
        id: str,
        name: str,
        attempt: int,
        tries: int,
        queue: str,
        connection: str,
        app: JobsApp,
        message: Message | None = None,
        batch: BatchView | None = None,
    ) -> None:
        self.id = id
        self.name = name
        self.attempt = attempt
        self.tries = tries
        self.queue = queue
        self.connection = connection
        self.app = app
        self.message = message
        self._signal: AbortSignal | None = None
        self._batch = batch
        self._logger: logging.LoggerAdapter[Any] | None = None
        self._release_delay: float | None = None
        self._retry_delay: float | None = None
        self._fail_error: BaseException | None = None
        self._error: BaseException | None = None
        self._chain_prepended: list[PendingDispatch[Any]] | None = None
        self._chain_appended: list[PendingDispatch[Any]] | None = None
        self._progress: Any = None
        self._progress_tasks: set[asyncio.Future[None]] | None = None
        #: The job's event loop, set when a plain ``def`` handler runs in a thread.
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def signal(self) -> AbortSignal:
        """Set when the attempt times out: ``.aborted`` and ``await signal.wait()``."""
        if self._signal is None:
            self._signal = AbortSignal()
        return self._signal

    @property
    def logger(self) -> logging.LoggerAdapter[Any]:
        """A logger (``haze.job``) whose records carry ``job``, ``job_id`` and ``attempt``."""
        if self._logger is None:
            extra: Mapping[str, object] = {
                "job": self.name,
                "job_id": self.id,
                "attempt": self.attempt,
                "queue": self.queue,
            }
            self._logger = _JobLogger(job_logger, extra)
        return self._logger

    @property
    def released(self) -> bool:
        return self._release_delay is not None

    def release(self, delay: Duration = 0) -> None:
        """Put this job back on its queue, to run again after ``delay``.

        Not a failure and it consumes no try. Call it, then return (middleware: do not
        call ``call_next``).
        """
        self._release_delay = parse_delay(delay, "job.release(delay)")

    @property
    def error(self) -> BaseException | None:
        """The exception the run raised, while a predicate that judges it runs.

        ``throttles_exceptions(when=lambda payload, job: isinstance(job.error, Timeout))``
        """
        return self._error

    def fail(self, error: BaseException | str | None = None) -> None:
        """Fail this job now, without the remaining tries (Laravel's ``$this->fail()``).

        Return after calling it; the pipeline treats the attempt as the final failure.
        """
        if error is None:
            error = JobFailedError(f'Job "{self.name}" was marked as failed')
        elif isinstance(error, str):
            error = JobFailedError(error)
        self._fail_error = error

    def progress(self, value: int | dict[str, Any]) -> None:
        """Report progress: an int from 0 to 100, or a small JSON object (1 KB at most).

        Emits the ``progress`` queue event and, for a tracked job, updates its status
        record (written in the background; the final record is written after it).

        >>> # job.progress(40); job.progress({"rows": 1200, "of": 3000})
        """
        value = check_progress(value)
        self._progress = value
        self.app.manager.report_progress(self, value)

    def cancelled(self) -> bool:
        """True once ``Queue.cancel(id)`` reached this attempt (``job.signal`` is then
        aborted with a ``JobCancelledError``)."""
        return cancelled_reason(self)

    def batch(self) -> BatchView | None:
        """The batch this job belongs to (a snapshot read before the attempt), or None."""
        return self._batch

    def prepend_to_chain(self, job: PendingDispatch[Any]) -> None:
        """Run ``job`` right after this one, before the rest of the chain."""
        # A bad group fails this job now, not the queueing of the link after it succeeded.
        if isinstance(job, PendingDispatch):  # (a batch given anyway is checked when queued)
            job._resolved_group()
        if self._chain_prepended is None:
            self._chain_prepended = []
        self._chain_prepended.append(job)

    def append_to_chain(self, job: PendingDispatch[Any]) -> None:
        """Run ``job`` at the end of this job's chain (starting one if there is none)."""
        if isinstance(job, PendingDispatch):  # as in prepend_to_chain
            job._resolved_group()
        if self._chain_appended is None:
            self._chain_appended = []
        self._chain_appended.append(job)

    def __repr__(self) -> str:
        return (
            f"<JobContext {self.name} id={self.id} attempt={self.attempt}/{self.tries} "
            f"queue={self.queue!r} connection={self.connection!r}>"
        )
