"""What every AWS component builds on: the IAM actions it grants, roles and policies, log
groups, the Lambda code archive and the checks that raise InfraConfigError."""

from __future__ import annotations

import json
import re
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

from haze_infra.rules import (
    InfraConfigError,
)

__all__ = ["CONSUMER_SQS_ACTIONS", "LOG_ACTIONS", "SEND_SQS_ACTIONS", "lambda_archive"]


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
