"""HazeDrainSchedule: an EventBridge rule invoking handler.schedule to drain a
database or redis connection."""

from __future__ import annotations

import json
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
from haze_infra.aws.resources import DEFAULT_RUNTIME, _check, _child, lambda_archive
from haze_infra.rules import (
    LAMBDA_MAX_TIMEOUT,
    drain_margin,
)

__all__ = ["HazeDrainSchedule"]


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
