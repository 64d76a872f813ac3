"""haze: one job definition that runs the same in-process, on a Redis or SQL worker,
in a Cloudflare Worker's ``queue()`` handler, and behind AWS Lambda triggers.

>>> from haze import App, Queue, define_job, define_queue_config
>>> @define_job(tries=3, backoff="exponential")
... async def send_invoice(payload: dict) -> None: ...
>>> # async with App(root="."):
>>> #     await send_invoice.dispatch({"invoice_id": 1})
>>> #     await Queue.idle()
"""

from __future__ import annotations

from .app import App, run_in_app, use_app
from .batches import Batch, PendingBatch
from .chains import PendingChain
from .config import (
    define_cache_config,
    define_database_config,
    define_haze_config,
    define_queue_config,
    define_redis_config,
    env,
)
from .context import AbortSignal, JobContext, current_tenant, tenant
from .db import Db
from .drivers import FailedJob
from .errors import (
    BatchFinishedError,
    ConfigError,
    DelayTooLongError,
    DuplicateJobError,
    HazeError,
    JobFailedError,
    JobTimeoutError,
    MaxAttemptsExceededError,
    MaxExceptionsError,
    MessageDecodeError,
    MissingDependencyError,
    PayloadTooLargeError,
    RetryUntilExpiredError,
    UnknownJobError,
)
from .facade import Queue
from .health import QueueHealth, queue_check
from .jobs import DispatchResult, JobDefinition, PendingDispatch, define_job
from .middleware import (
    JobMiddleware,
    fail_on_exception,
    rate_limited,
    skip_if,
    skip_if_batch_cancelled,
    throttles_exceptions,
    without_overlapping,
)
from .transactions import after_commit

__version__ = "0.1.0"

__all__ = [
    "AbortSignal",
    "App",
    "Batch",
    "BatchFinishedError",
    "ConfigError",
    "Db",
    "DelayTooLongError",
    "DispatchResult",
    "DuplicateJobError",
    "FailedJob",
    "HazeError",
    "JobContext",
    "JobDefinition",
    "JobFailedError",
    "JobMiddleware",
    "JobTimeoutError",
    "MaxAttemptsExceededError",
    "MaxExceptionsError",
    "MessageDecodeError",
    "MissingDependencyError",
    "PayloadTooLargeError",
    "PendingBatch",
    "PendingChain",
    "PendingDispatch",
    "Queue",
    "QueueHealth",
    "RetryUntilExpiredError",
    "UnknownJobError",
    "__version__",
    "after_commit",
    "current_tenant",
    "define_cache_config",
    "define_database_config",
    "define_haze_config",
    "define_job",
    "define_queue_config",
    "define_redis_config",
    "env",
    "fail_on_exception",
    "queue_check",
    "rate_limited",
    "run_in_app",
    "skip_if",
    "skip_if_batch_cancelled",
    "tenant",
    "throttles_exceptions",
    "use_app",
    "without_overlapping",
]
