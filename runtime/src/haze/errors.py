"""Every error haze raises on purpose.

The tree::

    HazeError
    ├── ConfigError                 bad value in config/*.py or App(...) (names file and key)
    ├── DuplicateJobError           two different jobs share a name (names both places)
    ├── UnknownJobError             a message or a call names a job nobody registered
    ├── MissingDependencyError      an optional extra is not installed (names haze[extra])
    ├── PayloadTooLargeError        the JSON payload exceeds the connection's message limit
    ├── DelayTooLongError           the driver cannot hold a delay that long (cloudflare)
    ├── BatchFinishedError          Batch.add() after the batch finished
    ├── JobTimeoutError             an attempt ran past its ``timeout``
    ├── MaxExceptionsError          ``max_exceptions`` reached before ``tries`` ran out
    ├── MaxAttemptsExceededError    reclaimed after a crash with no try left
    ├── RetryUntilExpiredError      ``retry_until`` passed
    ├── MessageDecodeError          a queued message is not valid haze JSON / cannot be decrypted
    └── JobFailedError              ``job.fail(reason)`` was called with a string

``TypeError`` and ``ValueError`` are used where Python users expect them: a payload
that is not JSON (``TypeError``), a bad duration or option (``ValueError``).
"""

from __future__ import annotations

__all__ = [
    "BatchFinishedError",
    "ConfigError",
    "DelayTooLongError",
    "DuplicateJobError",
    "HazeError",
    "JobFailedError",
    "JobTimeoutError",
    "MaxAttemptsExceededError",
    "MaxExceptionsError",
    "MessageDecodeError",
    "MissingDependencyError",
    "PayloadTooLargeError",
    "RetryUntilExpiredError",
    "UnknownJobError",
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
        where = ""
        if source and key:
            where = f"{source}: {key}: "
        elif source:
            where = f"{source}: "
        elif key:
            where = f"{key}: "
        super().__init__(f"{where}{message}")


class DuplicateJobError(HazeError):
    """Two different job definitions registered the same name."""


class UnknownJobError(HazeError, LookupError):
    """A job name that no imported module registered."""

    def __init__(self, name: str):
        self.job_name = name
        super().__init__(
            f'No job named "{name}" is registered. Define it with @define_job in a module under '
            "app/job/ (discovered at app start) or import its module before dispatching."
        )


class MissingDependencyError(HazeError, ImportError):
    """An optional dependency of a driver, store or integration is missing."""

    def __init__(self, what: str, extra: str, module: str):
        self.extra = extra
        super().__init__(
            f"{what} needs the '{module}' package, which is not installed. "
            f"Install it with: pip install 'haze[{extra}]'"
        )


class PayloadTooLargeError(HazeError, ValueError):
    """A message is larger than the connection accepts; nothing was enqueued."""


class DelayTooLongError(HazeError, ValueError):
    """A delay beyond what the driver can hold; nothing was enqueued."""


class BatchFinishedError(HazeError):
    """``Batch.add()`` was called after every job of the batch had finished."""


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


class JobFailedError(HazeError):
    """Raised inside the pipeline when a handler calls ``job.fail("reason")``."""
