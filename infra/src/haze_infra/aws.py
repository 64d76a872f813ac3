"""Pulumi components for haze on AWS (pulumi-aws 7).

- :class:`HazeSqsQueue`: an SQS queue and its dead-letter queue, the redrive
  ``maxReceiveCount`` following the jobs' ``tries``.
- :class:`HazeLambdaConsumer`: the Lambda (``handler.sqs`` of ``dist/aws-lambda``) with
  one event source mapping per queue (``ReportBatchItemFailures``), its log group and a
  least-privilege role.
- :class:`HazeDrainSchedule`: an EventBridge rule invoking ``handler.schedule`` to drain a
  ``database`` or ``redis`` connection.
- :class:`HazeScheduleRules`: EventBridge rules for ``config/schedule.py`` invoking
  ``handler.schedule``, which dispatches the schedules due.
- :class:`HazeContainerWorker`: an ECS Fargate service running ``haze queue:work``.
- :class:`HazeAwsApp`: all of the above for a :class:`~haze_infra.config.StackConfig`.

Every relation of :mod:`haze_infra.config` is checked when a component is created; a
contradiction raises :class:`~haze_infra.config.InfraConfigError` before anything is
deployed.
"""

from __future__ import annotations

import json
import math
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
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

from haze_infra.config import (
    FARGATE_MAX_STOP_TIMEOUT,
    FIFO_BATCH,
    LAMBDA_MAX_BATCH,
    LAMBDA_MAX_TIMEOUT,
    SQS_MAX_RECEIVE_COUNT,
    SQS_MAX_VISIBILITY,
    SQS_RECEIVE_SLACK,
    ConnectionPlan,
    InfraConfigError,
    StackConfig,
    container_stop_timeout,
    drain_margin,
    lambda_timeout,
    min_lambda_timeout,
    min_visibility_timeout,
)
from haze_infra.config import max_receive_count as receive_count_for

__all__ = [
    "CONSUMER_SQS_ACTIONS",
    "LOG_ACTIONS",
    "SEND_SQS_ACTIONS",
    "ContainerSettings",
    "HazeAwsApp",
    "HazeContainerWorker",
    "HazeDrainSchedule",
    "HazeLambdaConsumer",
    "HazeScheduleRules",
    "HazeSqsQueue",
    "lambda_archive",
]

#: What a consumer does with its own queues: receive, delete (success, final failure),
#: change visibility (retry backoff, heartbeat, FIFO hold) and read attributes (the
#: event source mapping, ``size``). The batch APIs are authorised by the same actions.
CONSUMER_SQS_ACTIONS = (
    "sqs:ReceiveMessage",
    "sqs:DeleteMessage",
    "sqs:ChangeMessageVisibility",
    "sqs:GetQueueAttributes",
)
#: ``job.release()``, delays over 15 minutes (forwarding) and chain/batch dispatches send.
SEND_SQS_ACTIONS = ("sqs:SendMessage",)
#: Writing to the function's own log group (which the stack creates).
LOG_ACTIONS = ("logs:CreateLogStream", "logs:PutLogEvents")
#: A function in a VPC manages its network interfaces (AWS requires "*" for these).
VPC_ACTIONS = (
    "ec2:CreateNetworkInterface",
    "ec2:DescribeNetworkInterfaces",
    "ec2:DeleteNetworkInterface",
    "ec2:AssignPrivateIpAddresses",
    "ec2:UnassignPrivateIpAddresses",
)
#: Pulling the worker image from ECR (``ecr_pull``; the token action needs "*").
ECR_PULL_ACTIONS = (
    "ecr:GetAuthorizationToken",
    "ecr:BatchGetImage",
    "ecr:GetDownloadUrlForLayer",
    "ecr:BatchCheckLayerAvailability",
)
DEFAULT_RUNTIME = "python3.12"
_SQS_NAME = re.compile(r"^[A-Za-z0-9_-]+$")


def _assume_role(service: str) -> str:
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole"}
            ],
        }
    )


def _policy(statements: Sequence[Mapping[str, Any]]) -> pulumi.Output[str]:
    """A policy document whose resources may be Outputs."""
    return pulumi.Output.json_dumps({"Version": "2012-10-17", "Statement": list(statements)})


def _allow(sid: str, actions: Sequence[str], resources: Sequence[Any]) -> dict[str, Any]:
    """An ``Allow`` statement; resources may be Outputs."""
    return {"Sid": sid, "Effect": "Allow", "Action": list(actions), "Resource": list(resources)}


def _write_logs(log_group: aws.cloudwatch.LogGroup) -> dict[str, Any]:
    """Writing to the log group's streams (``arn:…:log-group:name:*``)."""
    return _allow("WriteOwnLogs", LOG_ACTIONS, [log_group.arn.apply(lambda arn: f"{arn}:*")])


def lambda_archive(
    archive: str | Path | pulumi.Archive | None = None,
    dist_dir: str | Path | None = None,
    app_root: str | Path | None = None,
) -> pulumi.Archive:
    """The function code: ``archive`` (a zip, a directory or a ``pulumi.Archive``), else
    ``dist/aws-lambda.zip``, else the ``dist/aws-lambda`` directory (``haze build --preset
    aws-lambda``) under ``dist_dir`` (default: ``<app root>/dist``)."""
    if isinstance(archive, pulumi.Archive):
        return archive
    if archive is not None:
        path = Path(archive)
        if not path.exists():
            raise InfraConfigError(
                f"the Lambda archive {path} does not exist; run "
                "`haze build --preset aws-lambda` first"
            )
        return pulumi.FileArchive(str(path))
    base = Path(dist_dir) if dist_dir is not None else Path(app_root or ".") / "dist"
    for candidate in (base / "aws-lambda.zip", base / "aws-lambda"):
        if candidate.exists():
            return pulumi.FileArchive(str(candidate))
    raise InfraConfigError(
        f"no Lambda bundle in {base} (aws-lambda.zip or aws-lambda/); run `haze build "
        "--preset aws-lambda` in the app first, or pass archive="
    )


def _child(
    parent: pulumi.Resource, depends_on: Sequence[pulumi.Resource] | None = None
) -> pulumi.ResourceOptions:
    return pulumi.ResourceOptions(parent=parent, depends_on=list(depends_on or []))


def _check(ok: bool, message: str, key: str) -> None:
    if not ok:
        raise InfraConfigError(message, source="haze_infra.aws", key=key)


def _logs(parent: pulumi.Resource, name: str, prefix: str, days: int) -> aws.cloudwatch.LogGroup:
    """The log group ``<name>-logs`` (a generated name under ``prefix``)."""
    return aws.cloudwatch.LogGroup(
        f"{name}-logs", name_prefix=prefix, retention_in_days=days, opts=_child(parent)
    )


def _role(
    parent: pulumi.Resource, resource: str, service: str, description: str | None = None
) -> aws.iam.Role:
    """A role that ``service`` (``lambda.amazonaws.com``…) assumes."""
    return aws.iam.Role(
        resource,
        assume_role_policy=_assume_role(service),
        description=description,
        opts=_child(parent),
    )


def _role_policy(
    parent: pulumi.Resource, resource: str, role: aws.iam.Role, statements: Sequence[Any]
) -> aws.iam.RolePolicy:
    """The inline policy of ``role``: exactly ``statements``."""
    return aws.iam.RolePolicy(
        resource, role=role.id, policy=_policy(statements), opts=_child(parent)
    )


# --------------------------------------------------------------------------- SQS


class HazeSqsQueue(pulumi.ComponentResource):
    """An SQS queue for one haze queue, and its dead-letter queue.

    ``max_tries``: the most ``tries`` of a job that can land here (None: a job with
    ``retry_until``). The redrive ``maxReceiveCount`` is ``max_tries + 2`` (FIFO:
    ``10 × max_tries + 2``, for the receives held behind a batch's retries) unless
    ``max_receive_count`` says otherwise, and it may not be less (see
    :func:`haze_infra.config.max_receive_count`). ``visibility_timeout_seconds`` must
    be at least 6 × the consumer's timeout; :class:`HazeLambdaConsumer` checks it.
    """

    queue: aws.sqs.Queue
    dlq: aws.sqs.Queue
    arn: pulumi.Output[str]
    url: pulumi.Output[str]
    dlq_arn: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        *,
        queue_name: str | None = None,
        fifo: bool = False,
        max_tries: int | None = 1,
        max_receive_count: int | None = None,
        visibility_timeout_seconds: int = 30,
        message_retention_seconds: int = 4 * 86400,
        dlq_retention_seconds: int = 14 * 86400,
        max_message_size: int | None = None,
        tags: Mapping[str, str] | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("haze:aws:HazeSqsQueue", name, None, opts)
        count = _checked_receive_count(name, max_tries, max_receive_count, fifo)
        _check_sqs_queue(name, queue_name, fifo, visibility_timeout_seconds)
        self.logical_name = name
        self.fifo = fifo
        self.max_tries = max_tries
        self.max_receive_count = count
        self.visibility_timeout_seconds = visibility_timeout_seconds
        self.queue_name = queue_name
        self.dlq_name = dlq_name = _dlq_name(queue_name, fifo)
        common: dict[str, Any] = {"sqs_managed_sse_enabled": True, "tags": dict(tags or {})}
        if fifo:
            common["fifo_queue"] = True
        self.dlq = aws.sqs.Queue(
            f"{name}-dlq",
            name=dlq_name,
            message_retention_seconds=dlq_retention_seconds,
            **common,
            opts=_child(self),
        )
        redrive = self.dlq.arn.apply(
            lambda arn: json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": count})
        )
        self.queue = aws.sqs.Queue(
            name,
            name=queue_name,
            visibility_timeout_seconds=visibility_timeout_seconds,
            message_retention_seconds=message_retention_seconds,
            redrive_policy=redrive,
            max_message_size=max_message_size,
            **common,
            opts=_child(self),
        )
        self.arn = self.queue.arn
        self.url = self.queue.url
        self.dlq_arn = self.dlq.arn
        self.register_outputs(
            {"arn": self.arn, "url": self.url, "dlq_arn": self.dlq_arn, "max_receive_count": count}
        )


def _checked_receive_count(name: str, max_tries: int | None, chosen: int | None, fifo: bool) -> int:
    """The redrive ``maxReceiveCount``: ``chosen``, else the least ``max_tries`` needs."""
    need = receive_count_for(max_tries, fifo)
    count = need if chosen is None else chosen
    rule = f"{FIFO_BATCH} x tries" if fifo else "tries"
    _check(
        need <= count <= SQS_MAX_RECEIVE_COUNT,
        f"maxReceiveCount {count} is below {rule} + {SQS_RECEIVE_SLACK} = {need} for jobs "
        f"of {max_tries} tries: SQS would dead-letter messages haze still retries"
        if count < need
        else f"maxReceiveCount {count} is over SQS's limit ({SQS_MAX_RECEIVE_COUNT})",
        f"{name}.max_receive_count",
    )
    return count


def _check_sqs_queue(name: str, queue_name: str | None, fifo: bool, visibility: int) -> None:
    _check(
        0 <= visibility <= SQS_MAX_VISIBILITY,
        f"visibility timeout {visibility}s is outside SQS's 0-{SQS_MAX_VISIBILITY}s",
        f"{name}.visibility_timeout_seconds",
    )
    if queue_name is None:
        return
    _check(
        bool(_SQS_NAME.match(queue_name.removesuffix(".fifo"))) and len(queue_name) <= 80 - 4,
        f"{queue_name!r} is not a valid SQS queue name (letters, digits, - and _; at "
        "most 76 characters, so that its DLQ's name fits in 80)",
        f"{name}.queue_name",
    )
    _check(
        fifo == queue_name.endswith(".fifo"),
        f"the queue name {queue_name!r} must end in .fifo exactly when fifo=True",
        f"{name}.queue_name",
    )


def _dlq_name(queue_name: str | None, fifo: bool) -> str | None:
    if queue_name is None:
        return None
    base = queue_name[: -len(".fifo")] if fifo else queue_name
    return f"{base}-dlq" + (".fifo" if fifo else "")


# --------------------------------------------------------------------------- Lambda


class _Function(pulumi.ComponentResource):
    """Shared by the consumer and the drain: log group, role, policy, function."""

    log_group: aws.cloudwatch.LogGroup
    role: aws.iam.Role
    policy: aws.iam.RolePolicy
    function: aws.lambda_.Function

    def _build(
        self,
        name: str,
        *,
        archive: pulumi.Archive,
        handler: str,
        timeout: int,
        statements: Sequence[Mapping[str, Any]],
        environment: Mapping[str, Any],
        runtime: str,
        memory_size: int,
        architectures: Sequence[str] | None,
        vpc_config: Mapping[str, Any] | None,
        log_retention_days: int,
        reserved_concurrency: int | None,
        description: str,
        durable_config: Mapping[str, int] | None = None,
        function_name: str | None = None,
    ) -> None:
        self.log_group = _logs(self, name, f"/aws/lambda/haze-{name}-", log_retention_days)
        self.role = _role(self, f"{name}-role", "lambda.amazonaws.com", f"haze: {description}")
        allowed = [*statements, _write_logs(self.log_group)]
        if vpc_config:
            allowed.append(_allow("VpcNetworkInterfaces", VPC_ACTIONS, ["*"]))
        self.policy = _role_policy(self, f"{name}-policy", self.role, allowed)
        variables: Any = {"variables": dict(environment)} if environment else None
        logging: Any = {"log_format": "Text", "log_group": self.log_group.name}
        vpc: Any = dict(vpc_config) if vpc_config else None
        durable: Any = dict(durable_config) if durable_config else None
        self.function = aws.lambda_.Function(
            name,
            code=archive,
            handler=handler,
            runtime=runtime,
            role=self.role.arn,
            timeout=timeout,
            memory_size=memory_size,
            architectures=architectures,
            description=f"haze: {description}",
            environment=variables,
            logging_config=logging,
            vpc_config=vpc,
            reserved_concurrent_executions=reserved_concurrency,
            durable_config=durable,
            name=function_name,
            opts=_child(self, [self.policy, self.log_group]),
        )


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
        statements: Sequence[Mapping[str, Any]] = (),
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
            statements=[
                *_consumer_statements(self.queues, allow_send, send_queue_arns),
                *statements,
            ],
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


class HazeDrainSchedule(_Function):
    """An EventBridge schedule invoking ``handler.schedule`` (``haze_lambda.
    schedule_handler``) to drain a ``database`` or ``redis`` connection.

    ``HAZE_SCHEDULE_MARGIN`` (``margin``) is at least the longest job + 5 s, so a job
    claimed at the end of the budget finishes before Lambda's deadline, and ``timeout``
    leaves time to claim jobs before the margin. The role writes logs only (plus network
    interfaces with ``vpc_config``: a database or Redis usually sits in a VPC).
    """

    rule: aws.cloudwatch.EventRule
    target: aws.cloudwatch.EventTarget
    permission: aws.lambda_.Permission

    def __init__(
        self,
        name: str,
        *,
        connection: str,
        queues: Sequence[str] | None = None,
        archive: str | Path | pulumi.Archive | None = None,
        dist_dir: str | Path | None = None,
        app_root: str | Path | None = None,
        schedule_expression: str = "rate(1 minute)",
        job_timeout: float | None = None,
        margin: int | None = None,
        timeout: int | None = None,
        concurrency: int | None = None,
        handler: str = "handler.schedule",
        runtime: str = DEFAULT_RUNTIME,
        memory_size: int = 512,
        architectures: Sequence[str] | None = None,
        environment: Mapping[str, pulumi.Input[str]] | None = None,
        vpc_config: Mapping[str, Any] | None = None,
        log_retention_days: int = 14,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("haze:aws:HazeDrainSchedule", name, None, opts)
        margin, timeout = _drain_timing(name, job_timeout, margin, timeout)
        self.connection = connection
        self.timeout = timeout
        self.margin = margin
        env: dict[str, Any] = {
            "HAZE_SCHEDULE_CONNECTION": connection,
            "HAZE_SCHEDULE_MARGIN": f"{margin}s",
            **dict(environment or {}),
        }
        self._build(
            name,
            archive=lambda_archive(archive, dist_dir, app_root),
            handler=handler,
            timeout=timeout,
            statements=[],
            environment=env,
            runtime=runtime,
            memory_size=memory_size,
            architectures=architectures,
            vpc_config=vpc_config,
            log_retention_days=log_retention_days,
            reserved_concurrency=None,
            description=f"scheduled drain of connection {connection}",
        )
        self._trigger(name, schedule_expression, queues, concurrency)
        self.register_outputs({"function_arn": self.function.arn, "rule_arn": self.rule.arn})

    def _trigger(
        self, name: str, expression: str, queues: Sequence[str] | None, concurrency: int | None
    ) -> None:
        """The rule, its target (the function, with the drain's detail) and the permission."""
        self.rule = aws.cloudwatch.EventRule(
            f"{name}-rule",
            schedule_expression=expression,
            description=f"haze: drain connection {self.connection}",
            opts=_child(self),
        )
        detail: dict[str, Any] = {"connection": self.connection}
        if queues:
            detail["queues"] = list(queues)
        if concurrency:
            detail["concurrency"] = concurrency
        self.target = aws.cloudwatch.EventTarget(
            f"{name}-target",
            rule=self.rule.name,
            arn=self.function.arn,
            input=json.dumps(detail),
            opts=_child(self),
        )
        self.permission = _invoke_permission(self, f"{name}-invoke", self.function, self.rule)


def _drain_timing(
    name: str, job_timeout: float | None, margin: int | None, timeout: int | None
) -> tuple[int, int]:
    """(margin, Lambda timeout) of a drain: derived from the longest job unless given."""
    need = drain_margin(job_timeout)
    margin = need if margin is None else margin
    _check(
        margin >= need,
        f"HAZE_SCHEDULE_MARGIN {margin}s is shorter than the longest "
        f"job ({job_timeout}s) + 5 s = {need}s: a job claimed late would be cut off",
        f"{name}.margin",
    )
    timeout = min(LAMBDA_MAX_TIMEOUT, margin + 50) if timeout is None else timeout
    _check(
        margin + 10 <= timeout <= LAMBDA_MAX_TIMEOUT,
        f"the drain's Lambda timeout {timeout}s must be at most {LAMBDA_MAX_TIMEOUT}s "
        f"and leave at least 10 s beyond the margin ({margin}s)",
        f"{name}.timeout",
    )
    return margin, timeout


def _invoke_permission(
    parent: pulumi.Resource,
    resource: str,
    function: aws.lambda_.Function,
    rule: aws.cloudwatch.EventRule,
) -> aws.lambda_.Permission:
    """EventBridge may invoke ``function`` for ``rule``."""
    return aws.lambda_.Permission(
        resource,
        action="lambda:InvokeFunction",
        function=function.name,
        principal="events.amazonaws.com",
        source_arn=rule.arn,
        opts=_child(parent),
    )


class HazeScheduleRules(_Function):
    """The schedules of ``config/schedule.py`` on AWS: a Lambda running
    ``handler.schedule`` (``haze_lambda.schedule_handler``) and one EventBridge rule per
    distinct ``cron(...)`` expression (``rules``: expression -> schedule names, from
    :attr:`StackConfig.schedules <haze_infra.config.StackConfig>`).

    Each rule's target sends ``{"haze_schedule": "<expression>", "time": <time>}`` (an
    input transformer over the scheduled event), so the handler dispatches the schedules
    of that rule due at that minute. EventBridge rules run in UTC: a schedule with a
    time zone gets an hourly rule at its minutes and is dispatched only when due in its
    zone. ``send_queue_arns``: the SQS queues its jobs go to (``sqs:SendMessage``).
    """

    rules: dict[str, aws.cloudwatch.EventRule]
    targets: dict[str, aws.cloudwatch.EventTarget]
    permissions: dict[str, aws.lambda_.Permission]

    def __init__(
        self,
        name: str,
        *,
        rules: Mapping[str, Sequence[str]],
        archive: str | Path | pulumi.Archive | None = None,
        dist_dir: str | Path | None = None,
        app_root: str | Path | None = None,
        send_queue_arns: Sequence[pulumi.Input[str]] = (),
        timeout: int = 60,
        handler: str = "handler.schedule",
        runtime: str = DEFAULT_RUNTIME,
        memory_size: int = 512,
        architectures: Sequence[str] | None = None,
        environment: Mapping[str, pulumi.Input[str]] | None = None,
        vpc_config: Mapping[str, Any] | None = None,
        log_retention_days: int = 14,
        statements: Sequence[Mapping[str, Any]] = (),
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("haze:aws:HazeScheduleRules", name, None, opts)
        _check(bool(rules), "no schedules: config/schedule.py declares none", f"{name}.rules")
        for expression in rules:
            _check(
                expression.startswith("cron(") and expression.endswith(")"),
                f"{expression!r} is not an EventBridge cron(...) expression",
                f"{name}.rules",
            )
        sends = (
            [_allow("SendToHazeQueues", SEND_SQS_ACTIONS, list(send_queue_arns))]
            if send_queue_arns
            else []
        )
        self._build(
            name,
            archive=lambda_archive(archive, dist_dir, app_root),
            handler=handler,
            timeout=timeout,
            statements=[*sends, *statements],
            environment=dict(environment or {}),
            runtime=runtime,
            memory_size=memory_size,
            architectures=architectures,
            vpc_config=vpc_config,
            log_retention_days=log_retention_days,
            reserved_concurrency=None,
            description="config/schedule.py dispatcher",
        )
        self.rules, self.targets, self.permissions = {}, {}, {}
        for n, (expression, names) in enumerate(rules.items()):
            self._rule(f"{name}-rule-{n}", expression, names)
        rule_arns = {e: r.arn for e, r in self.rules.items()}
        self.register_outputs({"function_arn": self.function.arn, "rule_arns": rule_arns})

    def _rule(self, key: str, expression: str, names: Sequence[str]) -> None:
        """The rule of one cron expression; its target sends the expression and the time."""
        self.rules[expression] = rule = aws.cloudwatch.EventRule(
            key,
            schedule_expression=expression,
            description=f"haze schedules: {', '.join(names)}"[:512],
            opts=_child(self),
        )
        template = '{"haze_schedule": ' + json.dumps(expression) + ', "time": <time>}'
        self.targets[expression] = aws.cloudwatch.EventTarget(
            f"{key}-target",
            rule=rule.name,
            arn=self.function.arn,
            input_transformer={"input_paths": {"time": "$.time"}, "input_template": template},
            opts=_child(self),
        )
        self.permissions[expression] = _invoke_permission(
            self, f"{key}-invoke", self.function, rule
        )


# --------------------------------------------------------------------------- ECS


class HazeContainerWorker(pulumi.ComponentResource):
    """An ECS Fargate service running ``haze queue:work`` for one connection (the
    image of ``dist/docker/Dockerfile``), for ``redis`` or ``database`` queues (or an
    ``sqs`` connection whose jobs outlive Lambda's 15 minutes: pass ``sqs_queue_arns``).

    The container's ``stopTimeout`` is the longest job + 5 s, so a deploy or scale-in
    lets running jobs finish (``queue:work`` stops claiming on SIGTERM); Fargate allows
    at most 120 s, and a longer job is cut off and picked up again after the
    connection's ``retry_after`` (a warning says so). The task role has no permissions
    unless the connection is ``sqs``; the execution role pulls the image (ECR) and
    writes the service's log group.
    """

    cluster_arn: pulumi.Output[str]
    log_group: aws.cloudwatch.LogGroup
    execution_role: aws.iam.Role
    task_role: aws.iam.Role
    task_definition: aws.ecs.TaskDefinition
    service: aws.ecs.Service

    def __init__(
        self,
        name: str,
        *,
        connection: str,
        image: pulumi.Input[str],
        subnet_ids: Sequence[pulumi.Input[str]],
        security_group_ids: Sequence[pulumi.Input[str]] = (),
        assign_public_ip: bool = False,
        queues: Sequence[str] | None = None,
        concurrency: int | None = None,
        job_timeout: float | None = None,
        stop_timeout: int | None = None,
        cluster_arn: pulumi.Input[str] | None = None,
        cpu: str = "256",
        memory: str = "512",
        desired_count: int = 1,
        environment: Mapping[str, pulumi.Input[str]] | None = None,
        sqs_queue_arns: Sequence[pulumi.Input[str]] = (),
        region: pulumi.Input[str] | None = None,
        ecr_pull: bool | None = None,
        log_retention_days: int = 14,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("haze:aws:HazeContainerWorker", name, None, opts)
        self.stop_timeout = stop = _stop_timeout(name, job_timeout, stop_timeout)
        self.connection = connection
        if cluster_arn is None:
            self.cluster_arn = aws.ecs.Cluster(f"{name}-cluster", opts=_child(self)).arn
        else:
            self.cluster_arn = pulumi.Output.from_input(cluster_arn)
        self.log_group = _logs(self, name, f"/ecs/haze-{name}-", log_retention_days)
        self.execution_role = self._execution_role(name, image, ecr_pull)
        self.task_role = self._task_role(name, sqs_queue_arns)
        self.command = _worker_command(connection, queues, concurrency)
        self.task_definition = aws.ecs.TaskDefinition(
            f"{name}-task",
            family=f"haze-{name}",
            cpu=cpu,
            memory=memory,
            network_mode="awsvpc",
            requires_compatibilities=["FARGATE"],
            execution_role_arn=self.execution_role.arn,
            task_role_arn=self.task_role.arn,
            container_definitions=self._containers(image, region, environment, stop),
            opts=_child(self),
        )
        network: Any = {
            "subnets": list(subnet_ids),
            "security_groups": list(security_group_ids),
            "assign_public_ip": assign_public_ip,
        }
        self.service = self._service(name, desired_count, network)
        self.register_outputs({"service": self.service.name, "cluster_arn": self.cluster_arn})

    def _execution_role(
        self, name: str, image: pulumi.Input[str], ecr_pull: bool | None
    ) -> aws.iam.Role:
        """Writes the service's log group; pulls the image from ECR (``ecr_pull``, by
        default when the image is an ECR one or not known yet)."""
        role = _role(self, f"{name}-execution", "ecs-tasks.amazonaws.com")
        execution = [_write_logs(self.log_group)]
        if ecr_pull is None:
            ecr_pull = not isinstance(image, str) or ".dkr.ecr." in image
        if ecr_pull:  # an ECR token is account-wide; the repository may be any
            execution.append(_allow("PullImage", ECR_PULL_ACTIONS, ["*"]))
        _role_policy(self, f"{name}-execution-policy", role, execution)
        return role

    def _task_role(self, name: str, sqs_queue_arns: Sequence[pulumi.Input[str]]) -> aws.iam.Role:
        """No permissions, unless the worker consumes SQS queues."""
        role = _role(self, f"{name}-task", "ecs-tasks.amazonaws.com")
        if sqs_queue_arns:
            actions = [*CONSUMER_SQS_ACTIONS, *SEND_SQS_ACTIONS]
            statements = [_allow("ConsumeHazeQueues", actions, sqs_queue_arns)]
            _role_policy(self, f"{name}-task-policy", role, statements)
        return role

    def _containers(
        self,
        image: pulumi.Input[str],
        region: pulumi.Input[str] | None,
        environment: Mapping[str, pulumi.Input[str]] | None,
        stop: int,
    ) -> pulumi.Output[str]:
        """The task's container definitions (JSON): the worker, logging to the group."""
        region_out = (
            pulumi.Output.from_input(region)
            if region is not None
            else (aws.get_region_output().region)
        )
        env_out = pulumi.Output.from_input(dict(environment or {}))
        command = self.command
        return pulumi.Output.all(
            pulumi.Output.from_input(image), self.log_group.name, region_out, env_out
        ).apply(lambda a: json.dumps([_container(a[0], command, stop, a[3], a[1], a[2])]))

    def _service(self, name: str, desired_count: int, network: Any) -> aws.ecs.Service:
        return aws.ecs.Service(
            f"{name}-service",
            cluster=self.cluster_arn,
            task_definition=self.task_definition.arn,
            desired_count=desired_count,
            launch_type="FARGATE",
            deployment_minimum_healthy_percent=100,
            deployment_maximum_percent=200,
            network_configuration=network,
            opts=_child(self),
        )


def _stop_timeout(name: str, job_timeout: float | None, stop_timeout: int | None) -> int:
    """The container's stop timeout: the longest job + 5 s (at most Fargate's), or the
    one given, which may not cut a job off that Fargate could have waited for."""
    need = container_stop_timeout(job_timeout)
    stop = min(need, FARGATE_MAX_STOP_TIMEOUT) if stop_timeout is None else stop_timeout
    _check(
        2 <= stop <= FARGATE_MAX_STOP_TIMEOUT,
        f"stop timeout {stop}s is outside Fargate's 2-{FARGATE_MAX_STOP_TIMEOUT}s",
        f"{name}.stop_timeout",
    )
    if stop < need:
        if stop_timeout is not None and need <= FARGATE_MAX_STOP_TIMEOUT:
            _check(
                False,
                f"stop timeout {stop}s is shorter than the longest job "
                f"({job_timeout}s) + 5 s: a deploy would cut running jobs off",
                f"{name}.stop_timeout",
            )
        pulumi.log.warn(
            f"haze: {name}: jobs of up to {job_timeout}s outlive Fargate's "
            f"{FARGATE_MAX_STOP_TIMEOUT}s stop timeout; a deploy cuts them "
            "off and they run again after the connection's retry_after"
        )
    return stop


def _worker_command(
    connection: str, queues: Sequence[str] | None, concurrency: int | None
) -> list[str]:
    command = ["haze", "queue:work", "--connection", connection]
    if queues:
        command += ["--queue", ",".join(queues)]
    if concurrency:
        command += ["--concurrency", str(concurrency)]
    return command


def _container(
    image: str,
    command: list[str],
    stop: int,
    environment: Mapping[str, Any],
    log_group: str,
    region: str,
) -> dict[str, Any]:
    """One container definition: ``queue:work``, stopped after ``stop`` seconds."""
    return {
        "name": "worker",
        "image": image,
        "essential": True,
        "command": command,
        "stopTimeout": stop,
        "environment": [{"name": k, "value": str(v)} for k, v in sorted(environment.items())],
        "logConfiguration": {
            "logDriver": "awslogs",
            "options": {
                "awslogs-group": log_group,
                "awslogs-region": region,
                "awslogs-stream-prefix": "haze",
            },
        },
    }


# --------------------------------------------------------------------------- the app


@dataclass
class ContainerSettings:
    """Where :class:`HazeAwsApp` runs container workers (``image``: ``dist/docker``'s)."""

    image: pulumi.Input[str]
    subnet_ids: Sequence[pulumi.Input[str]]
    security_group_ids: Sequence[pulumi.Input[str]] = ()
    assign_public_ip: bool = False
    cluster_arn: pulumi.Input[str] | None = None
    cpu: str = "256"
    memory: str = "512"
    desired_count: int = 1
    environment: Mapping[str, pulumi.Input[str]] = field(default_factory=dict)


def _sqs_url_value(queue: HazeSqsQueue, template_name: str | None) -> pulumi.Output[str]:
    """The ``queue_url`` for the app: the default queue's URL, or a ``{queue}`` template
    with the same scheme, host and account."""
    if template_name is None:
        return queue.url
    return queue.url.apply(lambda u: u.rstrip("/").rsplit("/", 1)[0] + "/" + template_name)


class HazeAwsApp(pulumi.ComponentResource):
    """Everything a haze app needs on AWS, from its :class:`StackConfig`:

    - each ``sqs`` connection: a :class:`HazeSqsQueue` per haze queue and a
      :class:`HazeLambdaConsumer`;
    - each ``database``/``redis`` connection: a :class:`HazeDrainSchedule` when
      ``drain_schedule`` is given (a schedule expression), and a
      :class:`HazeContainerWorker` when ``container`` is given.

    ``connections`` restricts which connections are deployed; ``function_timeout``,
    ``batch_size``, ``batching_window`` and ``visibility_timeout`` override the derived
    values per connection name (and are checked like everything else). An SQS queue the
    app's ``queue_url`` does not name is called ``<name_prefix>-<connection>-<queue>``
    and the Lambda gets the variable ``queue_url`` is read from.
    """

    queues: dict[str, dict[str, HazeSqsQueue]]
    consumers: dict[str, HazeLambdaConsumer]
    drains: dict[str, HazeDrainSchedule]
    workers: dict[str, HazeContainerWorker]

    def __init__(
        self,
        name: str,
        *,
        stack: StackConfig,
        archive: str | Path | pulumi.Archive | None = None,
        dist_dir: str | Path | None = None,
        connections: Sequence[str] | None = None,
        name_prefix: str | None = None,
        runtime: str = DEFAULT_RUNTIME,
        memory_size: int = 512,
        environment: Mapping[str, pulumi.Input[str]] | None = None,
        function_timeout: Mapping[str, int] | None = None,
        batch_size: Mapping[str, int] | None = None,
        batching_window: Mapping[str, int] | None = None,
        visibility_timeout: Mapping[str, int] | None = None,
        max_concurrency: Mapping[str, int] | None = None,
        drain_schedule: str | None = None,
        container: ContainerSettings | None = None,
        vpc_config: Mapping[str, Any] | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("haze:aws:HazeAwsApp", name, None, opts)
        self.queues, self.consumers, self.drains, self.workers = {}, {}, {}, {}
        self._queue_url_env: dict[str, Any] = {}
        selected = _selected(stack, connections, drain_schedule, container)
        code: list[pulumi.Archive] = []

        def bundle() -> pulumi.Archive:  # found once, and only when a function needs it
            if not code:
                code.append(lambda_archive(archive, dist_dir, stack.app_root))
            return code[0]

        shared = _Shared(
            name, name_prefix or name, runtime, memory_size, environment, vpc_config, container
        )
        self._native_workflows(stack, selected, shared)
        for plan in selected:
            if plan.driver == "sqs":
                overrides = (
                    function_timeout,
                    batch_size,
                    batching_window,
                    visibility_timeout,
                    max_concurrency,
                )
                tuning = _Tuning(*((m or {}).get(plan.name) for m in overrides))
                self._sqs(plan, shared, bundle(), tuning)
            elif plan.driver in ("database", "redis"):
                self._worker(plan, shared, bundle if drain_schedule else None, drain_schedule)
            else:
                raise InfraConfigError(
                    f"connection {plan.name!r} uses the {plan.driver} driver, which has "
                    "nothing to deploy on AWS",
                    source=stack.source,
                    key="connections",
                )
        self.schedules = self._schedules(stack, shared, bundle) if stack.schedules else None
        self.workflow_functions = self._workflow_functions(selected, shared, bundle)
        queue_urls = {c: {q: v.url for q, v in qs.items()} for c, qs in self.queues.items()}
        functions = {c: v.function.arn for c, v in self.consumers.items()}
        workflows = {c: v.function.arn for c, v in self.workflow_functions.items()}
        self.register_outputs(
            {"queue_urls": queue_urls, "functions": functions, "workflow_functions": workflows}
        )

    def _schedules(
        self, stack: StackConfig, shared: _Shared, bundle: Callable[[], pulumi.Archive]
    ) -> HazeScheduleRules:
        # The dispatcher sends to every queue the stack made and sees the variables the
        # consumers read their queue URLs from.
        return HazeScheduleRules(
            f"{shared.name}-schedules",
            rules=stack.schedules,
            archive=bundle(),
            send_queue_arns=[q.arn for qs in self.queues.values() for q in qs.values()],
            runtime=shared.runtime,
            memory_size=shared.memory_size,
            environment={
                **self._queue_url_env,
                **dict(shared.environment or {}),
                **self._workflow_env,
            },
            statements=self._workflow_statements,
            vpc_config=shared.vpc_config,
            opts=_child(self),
        )

    def _native_workflows(
        self, stack: StackConfig, selected: Sequence[ConnectionPlan], shared: _Shared
    ) -> None:
        """The name of the function running the native workflows (at most one sqs
        connection has them), and what its dispatchers are given to reach it."""
        from haze_infra.aws_workflows import FUNCTION_ENV, workflow_client_statements

        native = [p.name for p in selected if p.aws is not None and p.aws.workflows == "native"]
        if len(native) > 1:
            raise InfraConfigError(
                f'connections {", ".join(native)} all have "workflows": "native"; an app '
                "runs its native workflows in one durable function: keep it on one",
                source=stack.source,
                key="connections",
            )
        self._workflow_env: dict[str, Any] = {}
        self._workflow_statements: list[dict[str, Any]] = []
        self._workflow_function_name = None
        if native:
            fname = f"{shared.prefix}-{native[0]}-workflows"[:64]
            arn = f"arn:aws:lambda:*:*:function:{fname}"
            self._workflow_function_name = (native[0], fname)
            self._workflow_env = {FUNCTION_ENV: fname}
            self._workflow_statements = workflow_client_statements(arn)

    def _workflow_functions(
        self,
        selected: Sequence[ConnectionPlan],
        shared: _Shared,
        bundle: Callable[[], pulumi.Archive],
    ) -> dict[str, Any]:
        from haze_infra.aws_workflows import HazeWorkflowFunction, durable_runtime

        if self._workflow_function_name is None:
            return {}
        connection, fname = self._workflow_function_name
        return {
            connection: HazeWorkflowFunction(
                f"{shared.name}-{connection}-workflows",
                function_name=fname,
                connection=connection,
                archive=bundle(),
                send_queue_arns=[q.arn for qs in self.queues.values() for q in qs.values()],
                runtime=durable_runtime(shared.runtime),
                memory_size=shared.memory_size,
                environment={**self._queue_url_env, **dict(shared.environment or {})},
                vpc_config=shared.vpc_config,
                opts=_child(self),
            )
        }

    def _sqs(
        self, plan: ConnectionPlan, shared: _Shared, code: pulumi.Archive, tuning: _Tuning
    ) -> None:
        sqs = plan.aws
        assert sqs is not None
        batch = sqs.batch_size if tuning.batch is None else tuning.batch
        window = sqs.batching_window if tuning.window is None else tuning.window
        timeout = tuning.timeout
        if timeout is None:
            timeout = lambda_timeout(plan.max_job_timeout, batch, sqs.concurrency)
        # Jobs longer than Lambda allows go to a container worker, whose receives ask for
        # retry_after and whose heartbeat extends it: the queue default only has to match.
        use_container = timeout > LAMBDA_MAX_TIMEOUT and shared.container is not None
        visibility = tuning.visibility
        if visibility is None:
            visibility = (
                math.ceil(sqs.retry_after)
                if use_container
                else min_visibility_timeout(timeout, window)
            )
        queues = self._sqs_queues(plan, shared, visibility)
        url_env = self._queue_url(plan, shared, queues["default"])
        if use_container:
            self._sqs_container(plan, shared, queues, url_env)
            return
        self.consumers[plan.name] = HazeLambdaConsumer(
            f"{shared.name}-{plan.name}-consumer",
            queues=list(queues.values()),
            connection=plan.name,
            archive=code,
            timeout=timeout,
            job_timeout=plan.max_job_timeout,
            max_tries=plan.max_tries,
            concurrency=sqs.concurrency,
            batch_size=batch,
            maximum_batching_window_in_seconds=window,
            max_concurrency=tuning.max_concurrency,
            runtime=shared.runtime,
            memory_size=shared.memory_size,
            environment={**dict(shared.environment or {}), **self._workflow_env},
            statements=self._workflow_statements,
            queue_url_env=sqs.queue_url_env,
            queue_url_value=url_env.get(sqs.queue_url_env or ""),
            vpc_config=shared.vpc_config,
            opts=_child(self),
        )

    def _sqs_queues(
        self, plan: ConnectionPlan, shared: _Shared, visibility: int
    ) -> dict[str, HazeSqsQueue]:
        """A queue per haze queue: the name ``queue_url`` gives, else
        ``<prefix>-<connection>-<queue>``."""
        sqs = plan.aws
        assert sqs is not None
        suffix = ".fifo" if sqs.fifo else ""
        queues: dict[str, HazeSqsQueue] = {}
        for q, sqs_name in sqs.queue_names.items():
            queue_name = (
                sqs_name or f"{shared.prefix}-{plan.name}-{q.removesuffix('.fifo')}{suffix}"
            )
            queues[q] = HazeSqsQueue(
                f"{shared.name}-{plan.name}-{q.replace('.', '-')}",
                queue_name=queue_name,
                fifo=sqs.fifo,
                max_tries=plan.max_tries,
                visibility_timeout_seconds=visibility,
                opts=_child(self),
            )
        self.queues[plan.name] = queues
        return queues

    def _queue_url(
        self, plan: ConnectionPlan, shared: _Shared, default: HazeSqsQueue
    ) -> dict[str, pulumi.Output[str]]:
        """``{variable: queue_url}`` for the variable the app reads its ``queue_url`` from
        (empty when it names none); the schedules' function sees it too."""
        sqs = plan.aws
        assert sqs is not None
        if not sqs.queue_url_env:
            return {}
        if sqs.queue_url is None:
            suffix = ".fifo" if sqs.fifo else ""
            template: str | None = f"{shared.prefix}-{plan.name}-{{queue}}{suffix}"
        elif "{queue}" in sqs.queue_url:
            template = sqs.queue_url.rstrip("/").rsplit("/", 1)[-1]
        else:
            template = None
        value = _sqs_url_value(default, template)
        self._queue_url_env[sqs.queue_url_env] = value
        return {sqs.queue_url_env: value}

    def _sqs_container(
        self,
        plan: ConnectionPlan,
        shared: _Shared,
        queues: dict[str, HazeSqsQueue],
        url_env: dict[str, pulumi.Output[str]],
    ) -> None:
        container = shared.container
        assert container is not None
        pulumi.log.warn(
            f"haze: connection {plan.name}: jobs outlive Lambda; consumed by a "
            "container worker instead"
        )
        self.workers[plan.name] = self._container(
            plan,
            shared.name,
            container,
            queues=plan.queues,
            environment={**container.environment, **url_env},
            sqs_queue_arns=[v.arn for v in queues.values()],
        )

    def _container(
        self,
        plan: ConnectionPlan,
        name: str,
        container: ContainerSettings,
        *,
        queues: Sequence[str],
        environment: Mapping[str, pulumi.Input[str]],
        sqs_queue_arns: Sequence[pulumi.Input[str]] = (),
    ) -> HazeContainerWorker:
        return HazeContainerWorker(
            f"{name}-{plan.name}-worker",
            connection=plan.name,
            image=container.image,
            subnet_ids=container.subnet_ids,
            security_group_ids=container.security_group_ids,
            assign_public_ip=container.assign_public_ip,
            queues=queues,
            job_timeout=plan.max_job_timeout,
            cluster_arn=container.cluster_arn,
            cpu=container.cpu,
            memory=container.memory,
            desired_count=container.desired_count,
            environment=environment,
            sqs_queue_arns=sqs_queue_arns,
            opts=_child(self),
        )

    def _worker(
        self,
        plan: ConnectionPlan,
        shared: _Shared,
        bundle: Callable[[], pulumi.Archive] | None,
        schedule: str | None,
    ) -> None:
        worker, name = plan.worker, shared.name
        assert worker is not None
        _check(
            bool(schedule) or shared.container is not None,
            f"connection {plan.name!r} ({plan.driver}) has no trigger on AWS: pass "
            "drain_schedule= (a scheduled Lambda drain) or container= (an ECS worker)",
            f"{name}.connections",
        )
        if schedule and bundle is not None:
            _check(
                plan.max_job_timeout is None
                or drain_margin(plan.max_job_timeout) + 10 <= LAMBDA_MAX_TIMEOUT,
                f"connection {plan.name!r}: jobs of up to {plan.max_job_timeout}s cannot be "
                "drained from Lambda; use container=",
                f"{name}.drain_schedule",
            )
            self.drains[plan.name] = HazeDrainSchedule(
                f"{name}-{plan.name}-drain",
                connection=plan.name,
                queues=list(worker.queues),
                archive=bundle(),
                schedule_expression=schedule,
                job_timeout=plan.max_job_timeout,
                runtime=shared.runtime,
                memory_size=shared.memory_size,
                environment=shared.environment,
                vpc_config=shared.vpc_config,
                opts=_child(self),
            )
        if shared.container is not None:
            environment = {**dict(shared.environment or {}), **shared.container.environment}
            self.workers[plan.name] = self._container(
                plan, name, shared.container, queues=list(worker.queues), environment=environment
            )


@dataclass(frozen=True)
class _Shared:
    """What every function and worker of one :class:`HazeAwsApp` is given."""

    name: str
    prefix: str
    runtime: str
    memory_size: int
    environment: Mapping[str, Any] | None
    vpc_config: Mapping[str, Any] | None
    container: ContainerSettings | None


@dataclass(frozen=True)
class _Tuning:
    """One ``sqs`` connection's overrides of the derived values (None: derive)."""

    timeout: int | None
    batch: int | None
    window: int | None
    visibility: int | None
    max_concurrency: int | None


def _selected(
    stack: StackConfig,
    connections: Sequence[str] | None,
    drain_schedule: str | None,
    container: ContainerSettings | None,
) -> list[ConnectionPlan]:
    """The connections to deploy: those named, else every ``sqs`` one (and the
    ``database``/``redis`` ones when they get a drain or a container)."""
    selected = (
        [stack.connection(c) for c in connections]
        if connections is not None
        else [
            c
            for c in stack.connections.values()
            if c.driver == "sqs"
            or (c.driver in ("database", "redis") and (drain_schedule or container))
        ]
    )
    if not selected and not stack.schedules:
        raise InfraConfigError(
            "nothing to deploy on AWS: config/queue.py has no sqs connection (and no "
            "database/redis connection with drain_schedule= or container=)",
            source=stack.source,
            key="connections",
        )
    return selected
