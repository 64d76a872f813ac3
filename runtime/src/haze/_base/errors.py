"""Every error haze raises on purpose.

The tree::

    HazeError
    ├── ConfigError                 bad value in config/*.py or App(...) (names file and key)
    │   └── UnknownQueueError       a dispatch names a queue its connection does not have
    ├── DuplicateJobError           two different jobs share a name (names both places)
    ├── UnknownJobError             a message or a call names a job nobody registered
    ├── MissingDependencyError      an optional extra is not installed (names haze-jobs[extra])
    ├── PayloadTooLargeError        the JSON payload exceeds the connection's message limit
    ├── PayloadError                a payload JSON cannot carry, or nested too deeply
    ├── KeyFunctionError            a unique, debounce or group key function raised
    ├── DispatchIncompleteError     a bulk send queued some messages and not others
    ├── DelayTooLongError           a delay over 365 days (or the driver's lower cap: cloudflare)
    ├── BatchFinishedError          Batch.add() after the batch finished
    ├── JobTimeoutError             an attempt ran past its ``timeout``
    ├── MaxExceptionsError          ``max_exceptions`` reached before ``tries`` ran out
    ├── MaxAttemptsExceededError    reclaimed after a crash with no try left
    ├── RetryUntilExpiredError      ``retry_until`` passed
    ├── MessageDecodeError          a queued message is not valid haze JSON / cannot be decrypted
    ├── OffloadError                an offloaded payload is missing or fails its checksum
    ├── JobFailedError              ``job.fail(reason)`` was called with a string
    ├── JobDefinitionError          define_job: unknown option, or a handler it cannot call
    │   └── JobOptionError          define_job: an option of the wrong type or value
    ├── BackendUnavailableError     Redis, a database, SQS, libSQL or D1 cannot be reached
    │   ├── DatabaseConnectionError a config/database.py database is unreachable or locked
    │   ├── DispatchOutcomeUnknownError  a dispatch lost its reply and cannot tell: may be queued
    │   └── OffloadStoreError       a connection's offload store could not be written or read
    ├── QueueTablesMissingError     the database queue tables do not exist (run db:migrate)
    ├── AmbiguousIdError            a short job id given to a command matches several jobs
    ├── ScheduleError               a bad schedule(): cron, every, tz or a duplicate name
    └── WorkflowError               a durable workflow broke one of its rules
        ├── WorkflowNondeterminismError  a replay reached another step than the run recorded
        ├── WorkflowLimitError      a step name or count, sleep, result, input or event past a limit
        ├── WorkflowResultError     a step's result is not JSON
        └── WorkflowRunError        an event or call for an unknown or finished run

``TypeError`` and ``ValueError`` are used where Python users expect them: a payload
that is not JSON is a ``PayloadError`` and a ``TypeError``, a bad option a ``ValueError``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from haze._base.hints import did_you_mean, install_hint

__all__ = [
    "AmbiguousIdError",
    "BackendUnavailableError",
    "BatchFinishedError",
    "ChainTailLostError",
    "ConfigError",
    "DatabaseConnectionError",
    "DelayTooLongError",
    "DispatchIncompleteError",
    "DispatchOutcomeUnknownError",
    "DuplicateJobError",
    "HazeError",
    "JobDefinitionError",
    "JobFailedError",
    "JobOptionError",
    "JobTimeoutError",
    "KeyFunctionError",
    "MaxAttemptsExceededError",
    "MaxExceptionsError",
    "MessageDecodeError",
    "MissingDependencyError",
    "OffloadError",
    "OffloadStoreError",
    "PayloadError",
    "PayloadTooLargeError",
    "QueueCountUnavailableError",
    "QueueTablesMissingError",
    "RetryUntilExpiredError",
    "ScheduleError",
    "UnknownJobError",
    "UnknownQueueError",
    "WorkflowError",
    "WorkflowLimitError",
    "WorkflowNondeterminismError",
    "WorkflowResultError",
    "WorkflowRunError",
]


class HazeError(Exception):
    """The root of every error haze raises on purpose."""


class ConfigError(HazeError, ValueError):
    """A configuration value is missing, unknown or of the wrong type.

    The message names the file (or ``App(...)`` argument) and the key path.
    """

    def __init__(self, message: str, *, source: str | None = None, key: str | None = None):
        self.source = source
        self.key = key
        if key is not None and not key.isprintable():
            key = repr(key)  # a name with a line break in it: the error stays one line
        where = ""
        if source and key:
            where = f"{source}: {key}: "
        elif source:
            where = f"{source}: "
        elif key:
            where = f"{key}: "
        super().__init__(f"{where}{message}")


class UnknownQueueError(ConfigError):
    """A queue that does not exist on its connection (an SQS queue haze would not
    create). ``queue`` and ``connection`` name it without the backend's address."""

    def __init__(self, message: str, *, queue: str, connection: str, key: str | None = None):
        self.queue = queue
        self.connection = connection
        super().__init__(message, key=key)


class DuplicateJobError(HazeError):
    """Two different job definitions registered the same name."""


class UnknownJobError(HazeError, LookupError):
    """A job name that no imported module registered.

    ``known`` (the registered names) adds a "did you mean" hint for a near miss.
    """

    def __init__(self, name: str, known: Iterable[str] = ()):
        self.job_name = name
        super().__init__(
            f"no job named {name!r}{did_you_mean(name, known)}; define it with @define_job in "
            "a module under app/job/ (imported at app start) or import its module before "
            "dispatching"
        )


class MissingDependencyError(HazeError, ImportError):
    """An optional dependency of a driver, store or integration is missing."""

    def __init__(self, what: str, extra: str, module: str):
        self.extra = extra
        super().__init__(
            f"{what} needs the '{module}' package, which is not installed. "
            f"Install it with: {install_hint(extra)}"
        )


class PayloadTooLargeError(HazeError, ValueError):
    """A message is larger than the connection accepts; nothing was enqueued."""


class PayloadError(HazeError, TypeError):
    """A payload JSON cannot carry (a value that is not JSON, a reference to itself) or
    nested deeper than haze carries; raised by ``dispatch()``, nothing was enqueued."""


class KeyFunctionError(HazeError, ValueError):
    """A job's unique, debounce or group key function raised on the payload it was
    given; the function's own error is the ``__cause__``. Nothing was queued."""


class DispatchIncompleteError(HazeError):
    """A bulk send (``Queue.bulk``, a batch's jobs) queued some messages and not others.

    ``failed`` maps the id of every message that was surely not queued to the reason.
    ``unknown`` lists the ids whose send lost its reply and whose outcome could not be
    looked up: they may be queued, so look them up (``Queue.status`` for a tracked job)
    before dispatching them again. The others were queued. ``unsent`` is how many were
    surely not queued (more than ``failed`` lists when some had no id yet: a batch
    stops at a send that fails and never builds the rest). A batch counts the ones not
    queued as failed jobs, so it still ends, and names itself in ``batch_id``.
    """

    def __init__(
        self,
        message: str,
        *,
        failed: dict[str, str],
        unsent: int | None = None,
        batch_id: str | None = None,
        unknown: list[str] | None = None,
    ):
        self.failed = failed
        self.unknown: list[str] = list(unknown or ())
        self.unsent = len(failed) if unsent is None else unsent
        self.batch_id = batch_id
        super().__init__(message)


class DelayTooLongError(HazeError, ValueError):
    """A delay beyond what the driver can hold; nothing was enqueued."""


class BatchFinishedError(HazeError):
    """``Batch.add()`` was called after every job of the batch had finished."""


class ChainTailLostError(HazeError):
    """The stored links of a long chain expired (``batches.ttl``) before it reached them."""


class JobTimeoutError(HazeError, TimeoutError):
    """An attempt ran past the job's ``timeout``."""


class MaxExceptionsError(HazeError):
    """The job raised ``max_exceptions`` times; it fails without using its remaining tries."""


class MaxAttemptsExceededError(HazeError):
    """A job was claimed again (its worker crashed) after it had used all its tries."""


class RetryUntilExpiredError(HazeError):
    """The job's ``retry_until`` deadline passed; it is not retried again."""


class MessageDecodeError(HazeError):
    """A queued message could not be read: bad JSON, not a haze envelope, or undecryptable."""


class OffloadError(HazeError):
    """An offloaded payload cannot be used: its object is missing, or its bytes do not
    match the size and sha256 its message carries (``checksum mismatch``). The job
    fails with this reason, and its failed record keeps the reference."""


class JobFailedError(HazeError):
    """Raised inside the pipeline when a handler calls ``job.fail("reason")``."""


class JobDefinitionError(HazeError, TypeError):
    """``define_job`` got an option it does not know, or a handler haze cannot call as
    ``(payload)`` or ``(payload, job)``. Raised when the module is imported, not when a
    job runs."""


class JobOptionError(JobDefinitionError, ValueError):
    """A ``define_job`` option of the wrong type or value (``unique=10``, ``tries="3"``):
    the message names the job, where it is defined, and the option."""


class BackendUnavailableError(HazeError, ConnectionError):
    """A queue or store backend (Redis, a database, SQS, libSQL, D1) could not be reached.

    The message names the connection and where it points. Nothing was changed on that
    backend by the call that raised it; a worker waits for the backend to come back.
    """


class OffloadStoreError(BackendUnavailableError):
    """A connection's offload store (``"offload": {"to": ...}``) could not be written
    (at dispatch: nothing was queued) or read (by a worker: the job goes back to its
    queue as the same attempt); the message names the store and the cause. Unlike
    ``OffloadError`` (an object missing or not matching, which fails its job at once)
    it says the store is down, not that a payload is lost."""


class QueueCountUnavailableError(HazeError):
    """The backend tells no queue depth (Vercel Queues): ``size()`` cannot answer, and
    the message says where to look instead."""


class DatabaseConnectionError(BackendUnavailableError):
    """A database from ``config/database.py`` could not be reached, or stayed locked."""

    #: What a write that raised this did, when its connector knows: ``"unsent"`` (no
    #: connection was had: nothing was written), ``"unsettled"`` (the connection died
    #: and the server process was still running the statement when the wait for it
    #: ended, or may have been: what it writes is not known yet); None otherwise.
    write: Literal["unsent", "unsettled"] | None = None

    def __init__(self, message: str, *, write: Literal["unsent", "unsettled"] | None = None):
        super().__init__(message)
        if write is not None:
            self.write = write


class DispatchOutcomeUnknownError(BackendUnavailableError):
    """A dispatch's INSERT (or Redis add) lost its connection before the server's reply,
    and the server could not tell in time whether the job was written, or a Vercel
    Queues send failed on every try after one that may have reached the service: it may
    be queued.

    Unlike its parent (nothing was queued), dispatching again may queue the job twice.
    ``job_ids`` holds the ids of the jobs in question; a unique job's lock and a tracked
    job's status record stay in place::

        try:
            await send_invoice.dispatch({"id": 7})
        except DispatchOutcomeUnknownError as e:
            log.warning("invoice job %s may be queued; not sending it again", e.job_ids)
    """

    def __init__(self, message: str, job_ids: Iterable[str] = ()):
        super().__init__(message)
        self.job_ids: tuple[str, ...] = tuple(job_ids)


class QueueTablesMissingError(HazeError):
    """The ``jobs``/``failed_jobs`` tables of a database queue connection do not exist.

    Raised by dispatch, ``queue:work`` and every ``queue:*`` command instead of the
    database's own "no such table" error, so a fresh app is told what to run::

        the queue tables are missing on database "main": run haze db:migrate
    """

    def __init__(self, database: str, run: str = "haze db:migrate", message: str | None = None):
        self.database = database
        super().__init__(
            message or f'the queue tables are missing on database "{database}": run {run}'
        )


class AmbiguousIdError(HazeError, LookupError):
    """A short id matches more than one job; ``matches`` lists their full ids."""

    def __init__(self, token: str, matches: list[str]):
        self.matches = matches
        shown = ", ".join(matches[:10]) + (", …" if len(matches) > 10 else "")
        super().__init__(
            f"the id {token!r} matches {len(matches)} jobs: {shown}; give more of the id"
        )


class ScheduleError(HazeError, ValueError):
    """A ``schedule()`` declaration haze cannot run: a bad cron expression, interval or
    time zone, a name used twice, or a schedule a platform's triggers cannot express.
    Raised when the schedule is declared (or built), naming the schedule and the value."""


class JobCancelledError(HazeError):
    """The job was cancelled with ``Queue.cancel(id)``: the reason of ``job.signal``.

    A running job that stops after the cancel (raises, for example through
    ``job.signal.throw_if_aborted()``) ends ``cancelled``: no retry, no ``failed()``.
    """


class UntrackedJobError(HazeError, LookupError):
    """``Queue.wait(id)`` found no status record: the job is not tracked
    (``define_job(track=True)`` or ``keep_result=...``), its record expired, or the id
    is not a job's full id."""


class JobProgressError(HazeError, ValueError):
    """``job.progress(value)`` got something other than an int from 0 to 100 or a small
    JSON object."""


class WorkflowError(HazeError):
    """A durable workflow broke one of its rules. Raised inside a run, it fails the run
    with this message as the reason (never retried: a replay would break it again)."""


class WorkflowNondeterminismError(WorkflowError):
    """A replay reached a different step at a position than the run recorded there (the
    workflow's code changed, or branches on something that is not a step's result). The
    message names both steps."""


class WorkflowLimitError(WorkflowError, ValueError):
    """A step name that is empty, too long or used twice in a run, a run past its step
    limit, a sleep past 365 days, a step result past the connection's message size, or a
    run's input or an event's payload past what the platform's engine takes (1 MiB on
    Cloudflare Workflows; nothing was sent)."""


class WorkflowResultError(WorkflowError, TypeError):
    """A step returned something that is not JSON (results are kept as JSON)."""


class WorkflowRunError(WorkflowError, LookupError):
    """An event or a call names a run that does not exist or has already finished."""


# Tracebacks and reprs name the public module users import from, not this private one.
for _name in __all__:
    globals()[_name].__module__ = "haze.errors"
del _name
