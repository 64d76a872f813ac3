"""HazeLambdaConsumer: the Lambda (handler.sqs) with one event source mapping per
queue, and the checks of its timeout and batching against the queue."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pulumi

with warnings.catch_warnings():  # some modules warn about their deprecated resources
    warnings.simplefilter("ignore", DeprecationWarning)
    import pulumi_aws as aws
    import pulumi_aws.cloudwatch
    import pulumi_aws.ecs
    import pulumi_aws.iam
    import pulumi_aws.lambda_
    import pulumi_aws.sqs

from haze_infra.aws.function import _Function
from haze_infra.aws.resources import (
    CONSUMER_SQS_ACTIONS,
    DEFAULT_RUNTIME,
    SEND_SQS_ACTIONS,
    _allow,
    _check,
    _child,
    lambda_archive,
)
from haze_infra.aws.sqs_queue import HazeSqsQueue
from haze_infra.rules import (
    LAMBDA_MAX_BATCH,
    LAMBDA_MAX_TIMEOUT,
    min_lambda_timeout,
    min_visibility_timeout,
)
from haze_infra.rules import max_receive_count as receive_count_for

__all__ = ["HazeLambdaConsumer"]


class HazeLambdaConsumer(_Function):
    """The Lambda that consumes an ``sqs`` connection's queues (``handler.sqs``).

    Relations checked: ``timeout`` <= 900 s and >= the longest job × the waves of a
    batch + 5 s (``job_timeout``, ``batch_size``, ``concurrency``); every queue's
    visibility >= 6 × ``timeout`` + the batching window; every queue's
    ``maxReceiveCount`` >= ``max_tries`` + 2 (FIFO: 10 × ``max_tries`` + 2).

    The role may receive, delete, change the visibility of and read the attributes of
    those queues only, send to them (``allow_send``; needed by ``job.release()``, delays
    over 15 minutes and chains), send to ``send_queue_arns`` (other queues the jobs
    dispatch to), and write to its own log group. Nothing else: no ``sqs:*``, no
    ``Resource: "*"`` (except the network-interface actions of a VPC function).
    """

    mappings: list[aws.lambda_.EventSourceMapping]

    def __init__(
        self,
        name: str,
        *,
        queues: Sequence[HazeSqsQueue],
        connection: str,
        archive: str | Path | pulumi.Archive | None = None,
        dist_dir: str | Path | None = None,
        app_root: str | Path | None = None,
        timeout: int = 60,
        job_timeout: float | None = None,
        max_tries: int | None = None,
        concurrency: int = 1,
        batch_size: int = 1,
        maximum_batching_window_in_seconds: int = 0,
        max_concurrency: int | None = None,
        handler: str = "handler.sqs",
        runtime: str = DEFAULT_RUNTIME,
        memory_size: int = 512,
        architectures: Sequence[str] | None = None,
        environment: Mapping[str, pulumi.Input[str]] | None = None,
        queue_url_env: str | None = None,
        queue_url_value: pulumi.Input[str] | None = None,
        allow_send: bool = True,
        send_queue_arns: Sequence[pulumi.Input[str]] = (),
        vpc_config: Mapping[str, Any] | None = None,
        log_retention_days: int = 14,
        reserved_concurrency: int | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("haze:aws:HazeLambdaConsumer", name, None, opts)
        window = maximum_batching_window_in_seconds
        self.connection = connection
        self.timeout = timeout
        self.batch_size = batch_size
        self.queues = list(queues)
        self._check_settings(name, job_timeout, concurrency, window, max_concurrency, max_tries)
        env: dict[str, Any] = {"HAZE_SQS_CONNECTION": connection, **dict(environment or {})}
        if queue_url_env and queue_url_value is not None:
            env[queue_url_env] = queue_url_value
        self._build(
            name,
            archive=lambda_archive(archive, dist_dir, app_root),
            handler=handler,
            timeout=timeout,
            statements=_consumer_statements(self.queues, allow_send, send_queue_arns),
            environment=env,
            runtime=runtime,
            memory_size=memory_size,
            architectures=architectures,
            vpc_config=vpc_config,
            log_retention_days=log_retention_days,
            reserved_concurrency=reserved_concurrency,
            description=f"SQS consumer of connection {connection}",
        )
        self.mappings = self._mappings(name, window, max_concurrency)
        self.register_outputs({"function_arn": self.function.arn, "role_arn": self.role.arn})

    def _check_settings(
        self,
        name: str,
        job_timeout: float | None,
        concurrency: int,
        window: int,
        max_concurrency: int | None,
        max_tries: int | None,
    ) -> None:
        _check(bool(self.queues), "a consumer needs at least one queue", f"{name}.queues")
        _check_lambda_timeout(name, self.timeout, job_timeout, self.batch_size, concurrency)
        _check_batching(name, self.queues, self.batch_size, window, max_concurrency)
        visibility = min_visibility_timeout(self.timeout, window)
        for q in self.queues:
            _check_consumed_queue(name, q, self.timeout, window, visibility, max_tries)

    def _mappings(
        self, name: str, window: int, max_concurrency: int | None
    ) -> list[aws.lambda_.EventSourceMapping]:
        """One event source mapping per queue, reporting partial batch failures."""
        scaling: Any = {"maximum_concurrency": max_concurrency} if max_concurrency else None
        return [
            aws.lambda_.EventSourceMapping(
                f"{name}-source-{i}",
                event_source_arn=q.arn,
                function_name=self.function.arn,
                batch_size=self.batch_size,
                maximum_batching_window_in_seconds=window,
                function_response_types=["ReportBatchItemFailures"],
                scaling_config=scaling,
                opts=_child(self, [self.policy]),
            )
            for i, q in enumerate(self.queues)
        ]


def _check_lambda_timeout(
    name: str, timeout: int, job_timeout: float | None, batch_size: int, concurrency: int
) -> None:
    _check(
        1 <= timeout <= LAMBDA_MAX_TIMEOUT,
        f"the Lambda timeout {timeout}s is outside 1-{LAMBDA_MAX_TIMEOUT}s"
        + (
            f"; the longest job ({job_timeout:g}s) needs a container worker"
            if job_timeout and job_timeout > LAMBDA_MAX_TIMEOUT - 5
            else ""
        ),
        f"{name}.timeout",
    )
    need = min_lambda_timeout(job_timeout, batch_size, concurrency)
    _check(
        timeout >= need,
        f"the Lambda timeout {timeout}s is too short for jobs of up to "
        f"{job_timeout or 0:g}s in batches of {batch_size} at concurrency "
        f"{concurrency} (needs >= {need}s)",
        f"{name}.timeout",
    )


def _check_batching(
    name: str,
    queues: Sequence[HazeSqsQueue],
    batch_size: int,
    window: int,
    max_concurrency: int | None,
) -> None:
    _check(
        0 <= window <= 300,
        f"the batching window {window}s is outside 0-300s",
        f"{name}.maximum_batching_window_in_seconds",
    )
    fifo = any(q.fifo for q in queues)
    limit = 10 if fifo else LAMBDA_MAX_BATCH
    _check(
        1 <= batch_size <= limit,
        f"batch size {batch_size} is outside 1-{limit}" + (" (FIFO queue)" if fifo else ""),
        f"{name}.batch_size",
    )
    _check(
        batch_size <= 10 or window >= 1,
        "a batch size over 10 needs a batching window of at least 1 s",
        f"{name}.maximum_batching_window_in_seconds",
    )
    if max_concurrency is not None:
        _check(
            2 <= max_concurrency <= 1000,
            f"max_concurrency {max_concurrency} is outside 2-1000",
            f"{name}.max_concurrency",
        )


def _check_consumed_queue(
    name: str, q: HazeSqsQueue, timeout: int, window: int, visibility: int, max_tries: int | None
) -> None:
    _check(
        q.visibility_timeout_seconds >= visibility,
        f"queue {q.queue_name or q.logical_name!r}: visibility timeout "
        f"{q.visibility_timeout_seconds}s is below 6 × the Lambda timeout "
        f"({timeout}s) + the batching window ({window}s) = {visibility}s",
        f"{name}.queues",
    )
    if max_tries is not None:
        need_count = receive_count_for(max_tries, q.fifo)
        _check(
            q.max_receive_count >= need_count,
            f"queue {q.queue_name or q.logical_name!r}: maxReceiveCount "
            f"{q.max_receive_count} is below {need_count} for jobs of {max_tries} tries",
            f"{name}.queues",
        )


def _consumer_statements(
    queues: Sequence[HazeSqsQueue], allow_send: bool, send_queue_arns: Sequence[Any]
) -> list[dict[str, Any]]:
    """Consume the queues; send to them (``allow_send``) and to ``send_queue_arns``."""
    arns = [q.arn for q in queues]
    statements = [_allow("ConsumeHazeQueues", CONSUMER_SQS_ACTIONS, arns)]
    send = [*(arns if allow_send else []), *send_queue_arns]
    if send:
        statements.append(_allow("SendToHazeQueues", SEND_SQS_ACTIONS, send))
    return statements
