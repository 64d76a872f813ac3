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
from collections.abc import Mapping, Sequence
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


# --------------------------------------------------------------------------- SQS


class HazeSqsQueue(pulumi.ComponentResource):
    """An SQS queue for one haze queue, and its dead-letter queue.

    ``max_tries``: the most ``tries`` of a job that can land here (None: a job with
    ``retry_until``). The redrive ``maxReceiveCount`` is ``max_tries + 2`` unless
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
        need = receive_count_for(max_tries)
        count = need if max_receive_count is None else max_receive_count
        _check(
            need <= count <= SQS_MAX_RECEIVE_COUNT,
            f"maxReceiveCount {count} is below tries + {SQS_RECEIVE_SLACK} = {need} for jobs "
            f"of {max_tries} tries: SQS would dead-letter messages haze still retries"
            if count < need
            else f"maxReceiveCount {count} is over SQS's limit ({SQS_MAX_RECEIVE_COUNT})",
            f"{name}.max_receive_count",
        )
        _check(
            0 <= visibility_timeout_seconds <= SQS_MAX_VISIBILITY,
            f"visibility timeout {visibility_timeout_seconds}s is outside SQS's 0-"
            f"{SQS_MAX_VISIBILITY}s",
            f"{name}.visibility_timeout_seconds",
        )
        if queue_name is not None:
            _check(
                bool(_SQS_NAME.match(queue_name.removesuffix(".fifo")))
                and len(queue_name) <= 80 - 4,
                f"{queue_name!r} is not a valid SQS queue name (letters, digits, - and _; at "
                "most 76 characters, so that its DLQ's name fits in 80)",
                f"{name}.queue_name",
            )
            _check(
                fifo == queue_name.endswith(".fifo"),
                f"the queue name {queue_name!r} must end in .fifo exactly when fifo=True",
                f"{name}.queue_name",
            )
        self.logical_name = name
        self.fifo = fifo
        self.max_tries = max_tries
        self.max_receive_count = count
        self.visibility_timeout_seconds = visibility_timeout_seconds
        self.queue_name = queue_name
        dlq_name = None
        if queue_name is not None:
            base = queue_name[: -len(".fifo")] if fifo else queue_name
            dlq_name = f"{base}-dlq" + (".fifo" if fifo else "")
        self.dlq_name = dlq_name
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
    ) -> None:
        self.log_group = aws.cloudwatch.LogGroup(
            f"{name}-logs",
            name_prefix=f"/aws/lambda/haze-{name}-",
            retention_in_days=log_retention_days,
            opts=_child(self),
        )
        self.role = aws.iam.Role(
            f"{name}-role",
            assume_role_policy=_assume_role("lambda.amazonaws.com"),
            description=f"haze: {description}",
            opts=_child(self),
        )
        allowed = [*statements, _write_logs(self.log_group)]
        if vpc_config:
            allowed.append(_allow("VpcNetworkInterfaces", VPC_ACTIONS, ["*"]))
        self.policy = aws.iam.RolePolicy(
            f"{name}-policy", role=self.role.id, policy=_policy(allowed), opts=_child(self)
        )
        variables: Any = {"variables": dict(environment)} if environment else None
        logging: Any = {"log_format": "Text", "log_group": self.log_group.name}
        vpc: Any = dict(vpc_config) if vpc_config else None
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
            opts=_child(self, [self.policy, self.log_group]),
        )


class HazeLambdaConsumer(_Function):
    """The Lambda that consumes an ``sqs`` connection's queues (``handler.sqs``).

    Relations checked: ``timeout`` <= 900 s and >= the longest job × the waves of a
    batch + 5 s (``job_timeout``, ``batch_size``, ``concurrency``); every queue's
    visibility >= 6 × ``timeout`` + the batching window; every queue's
    ``maxReceiveCount`` >= ``max_tries`` + 2.

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
        _check(bool(queues), "a consumer needs at least one queue", f"{name}.queues")
        window = maximum_batching_window_in_seconds
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
        visibility = min_visibility_timeout(timeout, window)
        for q in queues:
            _check(
                q.visibility_timeout_seconds >= visibility,
                f"queue {q.queue_name or q.logical_name!r}: visibility timeout "
                f"{q.visibility_timeout_seconds}s is below 6 × the Lambda timeout "
                f"({timeout}s) + the batching window ({window}s) = {visibility}s",
                f"{name}.queues",
            )
            if max_tries is not None:
                need_count = receive_count_for(max_tries)
                _check(
                    q.max_receive_count >= need_count,
                    f"queue {q.queue_name or q.logical_name!r}: maxReceiveCount "
                    f"{q.max_receive_count} is below {need_count} for jobs of {max_tries} "
                    "tries",
                    f"{name}.queues",
                )
        self.connection = connection
        self.timeout = timeout
        self.batch_size = batch_size
        self.queues = list(queues)
        arns = [q.arn for q in queues]
        statements = [_allow("ConsumeHazeQueues", CONSUMER_SQS_ACTIONS, arns)]
        send = [*(arns if allow_send else []), *send_queue_arns]
        if send:
            statements.append(_allow("SendToHazeQueues", SEND_SQS_ACTIONS, send))
        env: dict[str, Any] = {"HAZE_SQS_CONNECTION": connection, **dict(environment or {})}
        if queue_url_env and queue_url_value is not None:
            env[queue_url_env] = queue_url_value
        self._build(
            name,
            archive=lambda_archive(archive, dist_dir, app_root),
            handler=handler,
            timeout=timeout,
            statements=statements,
            environment=env,
            runtime=runtime,
            memory_size=memory_size,
            architectures=architectures,
            vpc_config=vpc_config,
            log_retention_days=log_retention_days,
            reserved_concurrency=reserved_concurrency,
            description=f"SQS consumer of connection {connection}",
        )
        self.mappings = []
        for i, q in enumerate(queues):
            self.mappings.append(
                aws.lambda_.EventSourceMapping(
                    f"{name}-source-{i}",
                    event_source_arn=q.arn,
                    function_name=self.function.arn,
                    batch_size=batch_size,
                    maximum_batching_window_in_seconds=window,
                    function_response_types=["ReportBatchItemFailures"],
                    scaling_config={"maximum_concurrency": max_concurrency}
                    if max_concurrency is not None
                    else None,
                    opts=_child(self, [self.policy]),
                )
            )
        self.register_outputs({"function_arn": self.function.arn, "role_arn": self.role.arn})


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
        self.rule = aws.cloudwatch.EventRule(
            f"{name}-rule",
            schedule_expression=schedule_expression,
            description=f"haze: drain connection {connection}",
            opts=_child(self),
        )
        detail: dict[str, Any] = {"connection": connection}
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
        self.permission = aws.lambda_.Permission(
            f"{name}-invoke",
            action="lambda:InvokeFunction",
            function=self.function.name,
            principal="events.amazonaws.com",
            source_arn=self.rule.arn,
            opts=_child(self),
        )
        self.register_outputs({"function_arn": self.function.arn, "rule_arn": self.rule.arn})


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
        statements = (
            [_allow("SendToHazeQueues", SEND_SQS_ACTIONS, list(send_queue_arns))]
            if send_queue_arns
            else []
        )
        self._build(
            name,
            archive=lambda_archive(archive, dist_dir, app_root),
            handler=handler,
            timeout=timeout,
            statements=statements,
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
            key = f"{name}-rule-{n}"
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
                input_transformer={
                    "input_paths": {"time": "$.time"},
                    "input_template": template,
                },
                opts=_child(self),
            )
            self.permissions[expression] = aws.lambda_.Permission(
                f"{key}-invoke",
                action="lambda:InvokeFunction",
                function=self.function.name,
                principal="events.amazonaws.com",
                source_arn=rule.arn,
                opts=_child(self),
            )
        self.register_outputs(
            {
                "function_arn": self.function.arn,
                "rule_arns": {e: r.arn for e, r in self.rules.items()},
            }
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
        self.stop_timeout = stop
        self.connection = connection
        if cluster_arn is None:
            cluster = aws.ecs.Cluster(f"{name}-cluster", opts=_child(self))
            self.cluster_arn = cluster.arn
        else:
            self.cluster_arn = pulumi.Output.from_input(cluster_arn)
        self.log_group = aws.cloudwatch.LogGroup(
            f"{name}-logs",
            name_prefix=f"/ecs/haze-{name}-",
            retention_in_days=log_retention_days,
            opts=_child(self),
        )
        self.execution_role = aws.iam.Role(
            f"{name}-execution",
            assume_role_policy=_assume_role("ecs-tasks.amazonaws.com"),
            opts=_child(self),
        )
        image_out = pulumi.Output.from_input(image)
        execution = [_write_logs(self.log_group)]
        if ecr_pull is None:
            ecr_pull = not isinstance(image, str) or ".dkr.ecr." in image
        if ecr_pull:  # an ECR token is account-wide; the repository may be any
            execution.append(_allow("PullImage", ECR_PULL_ACTIONS, ["*"]))
        aws.iam.RolePolicy(
            f"{name}-execution-policy",
            role=self.execution_role.id,
            policy=_policy(execution),
            opts=_child(self),
        )
        self.task_role = aws.iam.Role(
            f"{name}-task",
            assume_role_policy=_assume_role("ecs-tasks.amazonaws.com"),
            opts=_child(self),
        )
        if sqs_queue_arns:
            aws.iam.RolePolicy(
                f"{name}-task-policy",
                role=self.task_role.id,
                policy=_policy(
                    [
                        _allow(
                            "ConsumeHazeQueues",
                            [*CONSUMER_SQS_ACTIONS, *SEND_SQS_ACTIONS],
                            sqs_queue_arns,
                        )
                    ]
                ),
                opts=_child(self),
            )
        command = ["haze", "queue:work", "--connection", connection]
        if queues:
            command += ["--queue", ",".join(queues)]
        if concurrency:
            command += ["--concurrency", str(concurrency)]
        self.command = command
        region_out = (
            pulumi.Output.from_input(region)
            if region is not None
            else (aws.get_region_output().region)
        )
        env_out = pulumi.Output.from_input(dict(environment or {}))
        containers = pulumi.Output.all(image_out, self.log_group.name, region_out, env_out).apply(
            lambda a: json.dumps(
                [
                    {
                        "name": "worker",
                        "image": a[0],
                        "essential": True,
                        "command": command,
                        "stopTimeout": stop,
                        "environment": [
                            {"name": k, "value": str(v)} for k, v in sorted(a[3].items())
                        ],
                        "logConfiguration": {
                            "logDriver": "awslogs",
                            "options": {
                                "awslogs-group": a[1],
                                "awslogs-region": a[2],
                                "awslogs-stream-prefix": "haze",
                            },
                        },
                    }
                ]
            )
        )
        self.task_definition = aws.ecs.TaskDefinition(
            f"{name}-task",
            family=f"haze-{name}",
            cpu=cpu,
            memory=memory,
            network_mode="awsvpc",
            requires_compatibilities=["FARGATE"],
            execution_role_arn=self.execution_role.arn,
            task_role_arn=self.task_role.arn,
            container_definitions=containers,
            opts=_child(self),
        )
        self.service = aws.ecs.Service(
            f"{name}-service",
            cluster=self.cluster_arn,
            task_definition=self.task_definition.arn,
            desired_count=desired_count,
            launch_type="FARGATE",
            deployment_minimum_healthy_percent=100,
            deployment_maximum_percent=200,
            network_configuration={
                "subnets": list(subnet_ids),
                "security_groups": list(security_group_ids),
                "assign_public_ip": assign_public_ip,
            },
            opts=_child(self),
        )
        self.register_outputs({"service": self.service.name, "cluster_arn": self.cluster_arn})


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
        prefix = name_prefix or name
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
        code: pulumi.Archive | None = None

        def bundle() -> pulumi.Archive:
            nonlocal code
            if code is None:
                code = lambda_archive(archive, dist_dir, stack.app_root)
            return code

        for plan in selected:
            if plan.driver == "sqs":
                self._sqs(
                    plan,
                    prefix,
                    name,
                    bundle(),
                    runtime,
                    memory_size,
                    environment,
                    (function_timeout or {}).get(plan.name),
                    (batch_size or {}).get(plan.name),
                    (batching_window or {}).get(plan.name),
                    (visibility_timeout or {}).get(plan.name),
                    (max_concurrency or {}).get(plan.name),
                    vpc_config,
                    container,
                )
            elif plan.driver in ("database", "redis"):
                self._worker(
                    plan,
                    name,
                    bundle if drain_schedule else None,
                    drain_schedule,
                    runtime,
                    memory_size,
                    environment,
                    vpc_config,
                    container,
                )
            else:
                raise InfraConfigError(
                    f"connection {plan.name!r} uses the {plan.driver} driver, which has "
                    "nothing to deploy on AWS",
                    source=stack.source,
                    key="connections",
                )
        self.schedules: HazeScheduleRules | None = None
        if stack.schedules:
            # The dispatcher sends to every queue the stack made and sees the variables
            # the consumers read their queue URLs from.
            self.schedules = HazeScheduleRules(
                f"{name}-schedules",
                rules=stack.schedules,
                archive=bundle(),
                send_queue_arns=[q.arn for qs in self.queues.values() for q in qs.values()],
                runtime=runtime,
                memory_size=memory_size,
                environment={**self._queue_url_env, **dict(environment or {})},
                vpc_config=vpc_config,
                opts=_child(self),
            )
        self.register_outputs(
            {
                "queue_urls": {
                    c: {q: v.url for q, v in qs.items()} for c, qs in self.queues.items()
                },
                "functions": {c: v.function.arn for c, v in self.consumers.items()},
            }
        )

    def _sqs(
        self,
        plan: ConnectionPlan,
        prefix: str,
        name: str,
        code: pulumi.Archive,
        runtime: str,
        memory_size: int,
        environment: Mapping[str, Any] | None,
        timeout: int | None,
        batch: int | None,
        window: int | None,
        visibility: int | None,
        max_concurrency: int | None,
        vpc_config: Mapping[str, Any] | None,
        container: ContainerSettings | None,
    ) -> None:
        sqs = plan.aws
        assert sqs is not None
        batch = sqs.batch_size if batch is None else batch
        window = sqs.batching_window if window is None else window
        if timeout is None:
            timeout = lambda_timeout(plan.max_job_timeout, batch, sqs.concurrency)
        # Jobs longer than Lambda allows go to a container worker, whose receives ask for
        # retry_after and whose heartbeat extends it: the queue default only has to match.
        use_container = timeout > LAMBDA_MAX_TIMEOUT and container is not None
        if visibility is None:
            visibility = (
                math.ceil(sqs.retry_after)
                if use_container
                else min_visibility_timeout(timeout, window)
            )
        suffix = ".fifo" if sqs.fifo else ""
        chosen = f"{prefix}-{plan.name}"
        queues: dict[str, HazeSqsQueue] = {}
        for q, sqs_name in sqs.queue_names.items():
            queue_name = sqs_name or f"{chosen}-{q.removesuffix('.fifo')}{suffix}"
            queues[q] = HazeSqsQueue(
                f"{name}-{plan.name}-{q.replace('.', '-')}",
                queue_name=queue_name,
                fifo=sqs.fifo,
                max_tries=plan.max_tries,
                visibility_timeout_seconds=visibility,
                opts=_child(self),
            )
        self.queues[plan.name] = queues
        default = queues["default"]
        if sqs.queue_url is None:
            template: str | None = f"{chosen}-{{queue}}{suffix}"
        elif "{queue}" in sqs.queue_url:
            template = sqs.queue_url.rstrip("/").rsplit("/", 1)[-1]
        else:
            template = None
        if sqs.queue_url_env:
            self._queue_url_env[sqs.queue_url_env] = _sqs_url_value(default, template)
        if use_container:
            assert container is not None
            pulumi.log.warn(
                f"haze: connection {plan.name}: jobs outlive Lambda; consumed by a "
                "container worker instead"
            )
            self.workers[plan.name] = HazeContainerWorker(
                f"{name}-{plan.name}-worker",
                connection=plan.name,
                image=container.image,
                subnet_ids=container.subnet_ids,
                security_group_ids=container.security_group_ids,
                assign_public_ip=container.assign_public_ip,
                queues=plan.queues,
                job_timeout=plan.max_job_timeout,
                cluster_arn=container.cluster_arn,
                cpu=container.cpu,
                memory=container.memory,
                desired_count=container.desired_count,
                environment={
                    **container.environment,
                    **(
                        {sqs.queue_url_env: _sqs_url_value(default, template)}
                        if sqs.queue_url_env
                        else {}
                    ),
                },
                sqs_queue_arns=[v.arn for v in queues.values()],
                opts=_child(self),
            )
            return
        self.consumers[plan.name] = HazeLambdaConsumer(
            f"{name}-{plan.name}-consumer",
            queues=list(queues.values()),
            connection=plan.name,
            archive=code,
            timeout=timeout,
            job_timeout=plan.max_job_timeout,
            max_tries=plan.max_tries,
            concurrency=sqs.concurrency,
            batch_size=batch,
            maximum_batching_window_in_seconds=window,
            max_concurrency=max_concurrency,
            runtime=runtime,
            memory_size=memory_size,
            environment=environment,
            queue_url_env=sqs.queue_url_env,
            queue_url_value=_sqs_url_value(default, template) if sqs.queue_url_env else None,
            vpc_config=vpc_config,
            opts=_child(self),
        )

    def _worker(
        self,
        plan: ConnectionPlan,
        name: str,
        bundle: Any,
        schedule: str | None,
        runtime: str,
        memory_size: int,
        environment: Mapping[str, Any] | None,
        vpc_config: Mapping[str, Any] | None,
        container: ContainerSettings | None,
    ) -> None:
        worker = plan.worker
        assert worker is not None
        _check(
            bool(schedule) or container is not None,
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
                runtime=runtime,
                memory_size=memory_size,
                environment=environment,
                vpc_config=vpc_config,
                opts=_child(self),
            )
        if container is not None:
            self.workers[plan.name] = HazeContainerWorker(
                f"{name}-{plan.name}-worker",
                connection=plan.name,
                image=container.image,
                subnet_ids=container.subnet_ids,
                security_group_ids=container.security_group_ids,
                assign_public_ip=container.assign_public_ip,
                queues=list(worker.queues),
                job_timeout=plan.max_job_timeout,
                cluster_arn=container.cluster_arn,
                cpu=container.cpu,
                memory=container.memory,
                desired_count=container.desired_count,
                environment={**dict(environment or {}), **container.environment},
                opts=_child(self),
            )
