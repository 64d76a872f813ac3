"""HazeContainerWorker: an ECS Fargate service running haze queue:work, and its
ContainerSettings."""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
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
    CONSUMER_SQS_ACTIONS,
    ECR_PULL_ACTIONS,
    SEND_SQS_ACTIONS,
    _allow,
    _check,
    _child,
    _logs,
    _role,
    _role_policy,
    _write_logs,
)
from haze_infra.rules import (
    FARGATE_MAX_STOP_TIMEOUT,
    container_stop_timeout,
)

__all__ = ["ContainerSettings", "HazeContainerWorker"]


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
