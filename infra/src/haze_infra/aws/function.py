"""The Lambda function every Lambda component deploys: its role, policy and log group."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
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

from haze_infra.aws.resources import (
    VPC_ACTIONS,
    _allow,
    _child,
    _logs,
    _role,
    _role_policy,
    _write_logs,
)


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
        self.log_group = _logs(self, name, f"/aws/lambda/haze-{name}-", log_retention_days)
        self.role = _role(self, f"{name}-role", "lambda.amazonaws.com", f"haze: {description}")
        allowed = [*statements, _write_logs(self.log_group)]
        if vpc_config:
            allowed.append(_allow("VpcNetworkInterfaces", VPC_ACTIONS, ["*"]))
        self.policy = _role_policy(self, f"{name}-policy", self.role, allowed)
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
