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

import importlib as _importlib
import typing as _typing

from haze._base.errors import (
    AmbiguousIdError,
    BackendUnavailableError,
    BatchFinishedError,
    ChainTailLostError,
    ConfigError,
    DatabaseConnectionError,
    DelayTooLongError,
    DispatchIncompleteError,
    DispatchOutcomeUnknownError,
    DuplicateJobError,
    HazeError,
    JobCancelledError,
    JobDefinitionError,
    JobFailedError,
    JobOptionError,
    JobProgressError,
    JobTimeoutError,
    KeyFunctionError,
    MaxAttemptsExceededError,
    MaxExceptionsError,
    MessageDecodeError,
    MissingDependencyError,
    OffloadError,
    OffloadStoreError,
    PayloadError,
    PayloadTooLargeError,
    QueueCountUnavailableError,
    QueueTablesMissingError,
    RetryUntilExpiredError,
    ScheduleError,
    UnknownJobError,
    UnknownQueueError,
    UntrackedJobError,
    WorkflowError,
    WorkflowLimitError,
    WorkflowNondeterminismError,
    WorkflowResultError,
    WorkflowRunError,
)

# Errors are cheap and are what a failing import reports with: loaded up front.
from haze._base.version import __version__

#: The composition root: the module that registers how the implicit default app is
#: built (``haze._base.current`` imports it by this name, so it never names it).
_APP_MODULE = "haze._app.app"

if _typing.TYPE_CHECKING:
    from haze._app.app import App, run_in_app, use_app
    from haze._app.config import (
        define_cache_config,
        define_database_config,
        define_haze_config,
        define_queue_config,
        define_redis_config,
        env,
    )
    from haze._base.ids import short_id
    from haze._jobs.context import AbortSignal, JobContext, current_tenant, tenant
    from haze._jobs.definition import DispatchResult, JobDefinition, PendingDispatch, define_job
    from haze._jobs.status import JobStatus
    from haze._orchestration.batches import Batch, PendingBatch
    from haze._orchestration.chains import PendingChain
    from haze._orchestration.middleware import (
        JobMiddleware,
        fail_on_exception,
        limit_concurrency,
        rate_limited,
        skip_if,
        skip_if_batch_cancelled,
        throttles_exceptions,
        without_overlapping,
    )
    from haze._orchestration.scheduling import schedule
    from haze._workflows.api import Workflow, workflow
    from haze.api.db import Db
    from haze.api.facade import Queue
    from haze.api.health import QueueHealth, queue_check
    from haze.contracts.workflow import StepStatus, WorkflowStatus
    from haze.drivers import FailedJob
    from haze.transactions import after_commit

# Everything else loads on first use (PEP 562), so `import haze` costs next to nothing
# and an entry point pays only for what it touches (a Lambda or Worker cold start).
#: Public name -> the submodule that defines it.
_LAZY: dict[str, str] = {
    "AbortSignal": "_jobs.context",
    "App": "_app.app",
    "Batch": "_orchestration.batches",
    "Db": "api.db",
    "DispatchResult": "_jobs.definition",
    "FailedJob": "drivers",
    "JobContext": "_jobs.context",
    "JobDefinition": "_jobs.definition",
    "JobMiddleware": "_orchestration.middleware",
    "JobStatus": "_jobs.status",
    "PendingBatch": "_orchestration.batches",
    "PendingChain": "_orchestration.chains",
    "PendingDispatch": "_jobs.definition",
    "Queue": "api.facade",
    "QueueHealth": "api.health",
    "after_commit": "transactions",
    "current_tenant": "_jobs.context",
    "define_cache_config": "_app.config",
    "define_database_config": "_app.config",
    "define_haze_config": "_app.config",
    "define_job": "_jobs.definition",
    "define_queue_config": "_app.config",
    "define_redis_config": "_app.config",
    "env": "_app.config",
    "fail_on_exception": "_orchestration.middleware",
    "limit_concurrency": "_orchestration.middleware",
    "queue_check": "api.health",
    "rate_limited": "_orchestration.middleware",
    "run_in_app": "_app.app",
    "schedule": "_orchestration.scheduling",
    "short_id": "_base.ids",
    "skip_if": "_orchestration.middleware",
    "skip_if_batch_cancelled": "_orchestration.middleware",
    "tenant": "_jobs.context",
    "throttles_exceptions": "_orchestration.middleware",
    "use_app": "_app.app",
    "without_overlapping": "_orchestration.middleware",
    "StepStatus": "contracts.workflow",
    "Workflow": "_workflows.api",
    "WorkflowStatus": "contracts.workflow",
    "workflow": "_workflows.api",
}

__all__ = [
    "AbortSignal",
    "AmbiguousIdError",
    "App",
    "BackendUnavailableError",
    "Batch",
    "BatchFinishedError",
    "ChainTailLostError",
    "ConfigError",
    "DatabaseConnectionError",
    "Db",
    "DelayTooLongError",
    "DispatchIncompleteError",
    "DispatchOutcomeUnknownError",
    "DispatchResult",
    "DuplicateJobError",
    "FailedJob",
    "HazeError",
    "JobCancelledError",
    "JobContext",
    "JobDefinition",
    "JobDefinitionError",
    "JobFailedError",
    "JobMiddleware",
    "JobOptionError",
    "JobProgressError",
    "JobStatus",
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
    "PendingBatch",
    "PendingChain",
    "PendingDispatch",
    "Queue",
    "QueueCountUnavailableError",
    "QueueHealth",
    "QueueTablesMissingError",
    "RetryUntilExpiredError",
    "ScheduleError",
    "StepStatus",
    "UnknownJobError",
    "UnknownQueueError",
    "UntrackedJobError",
    "Workflow",
    "WorkflowError",
    "WorkflowLimitError",
    "WorkflowNondeterminismError",
    "WorkflowResultError",
    "WorkflowRunError",
    "WorkflowStatus",
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
    "limit_concurrency",
    "queue_check",
    "rate_limited",
    "run_in_app",
    "schedule",
    "short_id",
    "skip_if",
    "skip_if_batch_cancelled",
    "tenant",
    "throttles_exceptions",
    "use_app",
    "without_overlapping",
    "workflow",
]


def __getattr__(name: str) -> _typing.Any:
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(_importlib.import_module(f"{__name__}.{module}"), name)
        globals()[name] = value  # later lookups skip this function
        return value
    if not name.startswith("__"):
        try:  # a submodule used as an attribute (haze.testing), as after an eager import
            return _importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
