"""The limits of AWS that a deploy must respect, and the values haze derives from them
(see :mod:`haze_infra.config` for the rules in words)."""

from __future__ import annotations

import math

from haze.driver_api import ConfigError

__all__ = [
    "DRAIN_SLACK",
    "DRAIN_WINDOW",
    "FARGATE_MAX_STOP_TIMEOUT",
    "FIFO_BATCH",
    "LAMBDA_DEFAULT_TIMEOUT",
    "LAMBDA_MAX_BATCH",
    "LAMBDA_MAX_TIMEOUT",
    "LAMBDA_SLACK",
    "SQS_HANDLER_MARGIN",
    "SQS_MAX_RECEIVE_COUNT",
    "SQS_MAX_VISIBILITY",
    "SQS_RECEIVE_SLACK",
    "UNKNOWN_JOB_TIME",
    "VISIBILITY_FACTOR",
    "InfraConfigError",
    "container_stop_timeout",
    "drain_margin",
    "lambda_timeout",
    "max_receive_count",
    "min_lambda_timeout",
    "min_visibility_timeout",
]

#: Receives of slack above ``tries`` before SQS dead-letters a message (crash + FIFO hold).
SQS_RECEIVE_SLACK = 2
#: Lambda's largest batch from a FIFO queue.
FIFO_BATCH = 10
#: SQS's largest ``maxReceiveCount``.
SQS_MAX_RECEIVE_COUNT = 1000
#: SQS's longest visibility timeout (12 hours).
SQS_MAX_VISIBILITY = 43_200
#: AWS: visibility timeout >= 6 × the function timeout (+ the batching window).
VISIBILITY_FACTOR = 6
#: Lambda's longest timeout (15 minutes).
LAMBDA_MAX_TIMEOUT = 900
#: ``haze_lambda.sqs_handler`` starts no record in the last ``HAZE_SQS_MARGIN`` (5 s).
SQS_HANDLER_MARGIN = 5
#: Seconds a derived Lambda timeout adds to the longest job (handler margin + boot).
LAMBDA_SLACK = 10
#: The Lambda timeout when no job on the connection has a ``timeout``.
LAMBDA_DEFAULT_TIMEOUT = 60
#: Lambda's SQS event source: the largest batch (standard queues; FIFO: 10).
LAMBDA_MAX_BATCH = 10_000
# The Cloudflare constants, ``cloudflare_max_retries``, ``CloudflarePlan``, ``D1Plan`` and
# ``KvPlan`` live in haze.build.cloudflare_plan: `haze build --preset cloudflare` derives
# dist/wrangler.json with the same rules.
#: Fargate's longest container ``stopTimeout``.
FARGATE_MAX_STOP_TIMEOUT = 120
#: Seconds kept between a job's timeout and a stop/drain deadline.
DRAIN_SLACK = 5
#: The job time assumed when no job on a connection has a ``timeout``.
UNKNOWN_JOB_TIME = 30
#: A scheduled drain's time for claiming jobs, on top of its margin.
DRAIN_WINDOW = 50


class InfraConfigError(ConfigError):
    """The infrastructure settings contradict the app (or AWS/Cloudflare limits)."""


# --------------------------------------------------------------------------- the rules


def max_receive_count(max_tries: int | None, fifo: bool = False) -> int:
    """SQS redrive ``maxReceiveCount`` for jobs of at most ``max_tries`` tries (None:
    unbounded, ``retry_until``).

    On FIFO a record is also received, and reported unprocessed, once for each try of
    every record ahead of it in its batch (up to ``FIFO_BATCH - 1`` of them): those
    receives use none of its tries, but SQS counts them, so its DLQ must wait for them
    or it takes a record that never ran."""
    if max_tries is None:
        return SQS_MAX_RECEIVE_COUNT
    receives = max_tries * FIFO_BATCH if fifo else max_tries
    return min(SQS_MAX_RECEIVE_COUNT, receives + SQS_RECEIVE_SLACK)


def min_lambda_timeout(job_timeout: float | None, batch_size: int = 1, concurrency: int = 1) -> int:
    """The shortest Lambda timeout that lets every record of a batch finish: records run
    ``concurrency`` at a time, so a batch takes ``ceil(batch_size / concurrency)`` waves."""
    if job_timeout is None:
        return 1 + SQS_HANDLER_MARGIN
    waves = math.ceil(max(1, batch_size) / max(1, concurrency))
    return math.ceil(waves * job_timeout) + SQS_HANDLER_MARGIN


def lambda_timeout(job_timeout: float | None, batch_size: int = 1, concurrency: int = 1) -> int:
    """The derived Lambda timeout (not capped at 900 s: the component refuses more)."""
    if job_timeout is None:
        return LAMBDA_DEFAULT_TIMEOUT
    return (
        min_lambda_timeout(job_timeout, batch_size, concurrency)
        - SQS_HANDLER_MARGIN
        + (LAMBDA_SLACK)
    )


def min_visibility_timeout(function_timeout: int, batching_window: int = 0) -> int:
    """AWS: at least six times the function timeout plus the batching window."""
    return VISIBILITY_FACTOR * function_timeout + batching_window


def container_stop_timeout(job_timeout: float | None) -> int:
    """ECS ``stopTimeout``: the longest job + slack (not capped; Fargate allows 120 s)."""
    return math.ceil(job_timeout if job_timeout is not None else UNKNOWN_JOB_TIME) + DRAIN_SLACK


def drain_margin(job_timeout: float | None) -> int:
    """``HAZE_SCHEDULE_MARGIN`` for a scheduled drain: at least 10 s (the handler's
    default), and enough for the longest job to finish after the last claim."""
    job = job_timeout if job_timeout is not None else UNKNOWN_JOB_TIME
    return max(10, math.ceil(job) + DRAIN_SLACK)
