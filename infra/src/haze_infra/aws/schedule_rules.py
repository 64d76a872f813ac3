"""HazeScheduleRules: EventBridge rules for config/schedule.py invoking
handler.schedule, which dispatches the schedules due."""

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

from haze_infra.aws.drain_schedule import _invoke_permission
from haze_infra.aws.function import _Function
from haze_infra.aws.resources import (
    DEFAULT_RUNTIME,
    SEND_SQS_ACTIONS,
    _allow,
    _check,
    _child,
    lambda_archive,
)

__all__ = ["HazeScheduleRules"]


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
