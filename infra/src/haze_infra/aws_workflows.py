"""The Lambda durable function that runs an app's workflows on Lambda's own engine.

:class:`HazeWorkflowFunction` is ``handler.workflows`` (``haze_lambda.workflow_handler``)
with a durable configuration: a run may last up to ``execution_timeout`` seconds
(default, and Lambda's most: 366 days) and its state is kept ``retention_days`` after it
ends. Its role may checkpoint and read its own executions, send to the connection's
queues (``run.dispatch``) and write its log group.

A function that starts runs, sends them events or reads them (the consumer and the
schedules of the same app: ``Workflow.start/send_event/status/cancel``) gets
:func:`workflow_client_statements` and the variable :data:`FUNCTION_ENV` naming it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pulumi

from haze_infra.aws.function import _Function
from haze_infra.aws.resources import SEND_SQS_ACTIONS, _allow, lambda_archive

__all__ = [
    "DURABLE_ACTIONS",
    "FUNCTION_ENV",
    "MAX_EXECUTION_TIMEOUT",
    "RUN_CLIENT_ACTIONS",
    "HazeWorkflowFunction",
    "durable_runtime",
    "workflow_client_statements",
]

#: The variable naming the workflow function, read by ``Workflow.*`` on a native
#: connection (``haze._workflows.lambda_runs``).
FUNCTION_ENV = "HAZE_WORKFLOW_FUNCTION"
#: Lambda's longest durable execution: 366 days.
MAX_EXECUTION_TIMEOUT = 31_622_400
#: What the durable function does with its own executions (AWS's
#: AWSLambdaBasicDurableExecutionRolePolicy, scoped to this function).
DURABLE_ACTIONS = ("lambda:CheckpointDurableExecution", "lambda:GetDurableExecutionState")
#: What a dispatcher does with the runs: start one (an asynchronous invoke named by the
#: run id), find it by name, read it and its history, complete its callback (an event),
#: and stop it (a cancel).
RUN_CLIENT_ACTIONS = (
    "lambda:InvokeFunction",
    "lambda:ListDurableExecutionsByFunction",
    "lambda:GetDurableExecution",
    "lambda:GetDurableExecutionHistory",
    "lambda:SendDurableExecutionCallbackSuccess",
    "lambda:StopDurableExecution",
)


def durable_runtime(runtime: str) -> str:
    """``runtime``, or python3.13 when older (durable functions start at Python 3.13)."""
    match = re.fullmatch(r"python3\.(\d+)", runtime)
    return "python3.13" if match and int(match.group(1)) < 13 else runtime


def _own(arn: pulumi.Input[str]) -> list[Any]:
    """The function and everything under it (its versions and executions)."""
    return [arn, pulumi.Output.concat(arn, ":*")]


def workflow_client_statements(function_arn: pulumi.Input[str]) -> list[dict[str, Any]]:
    """The policy statements of a function that starts, reads and cancels runs."""
    return [_allow("RunHazeWorkflows", RUN_CLIENT_ACTIONS, _own(function_arn))]


class HazeWorkflowFunction(_Function):
    """``handler.workflows`` as a Lambda durable function (see the module docstring).

    ``timeout`` is one invocation's limit (a run replays over many invocations; a
    step must finish within one); ``send_queue_arns``: the queues ``run.dispatch``
    sends to.
    """

    def __init__(
        self,
        name: str,
        *,
        connection: str,
        archive: str | Path | pulumi.Archive | None = None,
        dist_dir: str | Path | None = None,
        app_root: str | Path | None = None,
        send_queue_arns: Sequence[pulumi.Input[str]] = (),
        timeout: int = 900,
        execution_timeout: int = MAX_EXECUTION_TIMEOUT,
        retention_days: int = 14,
        runtime: str = "python3.13",
        memory_size: int = 512,
        architectures: Sequence[str] | None = None,
        environment: Mapping[str, pulumi.Input[str]] | None = None,
        vpc_config: Mapping[str, Any] | None = None,
        log_retention_days: int = 14,
        function_name: str | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("haze:aws:HazeWorkflowFunction", name, None, opts)
        from haze_infra.aws.resources import _check

        _check(
            1 <= execution_timeout <= MAX_EXECUTION_TIMEOUT,
            f"execution_timeout must be 1-{MAX_EXECUTION_TIMEOUT} s (Lambda's most: 366 days)",
            f"{name}.execution_timeout",
        )
        _check(1 <= retention_days <= 90, "retention_days must be 1-90", f"{name}.retention_days")
        self.connection = connection
        # The function may act on its own executions only: its ARN is known once it is
        # made, after its role, so the statement names it by its name.
        own = f"arn:aws:lambda:*:*:function:{function_name or name + '*'}"
        statements = [_allow("DurableExecution", DURABLE_ACTIONS, _own(own))]
        if send_queue_arns:
            statements.append(_allow("SendToHazeQueues", SEND_SQS_ACTIONS, list(send_queue_arns)))
        self._build(
            name,
            archive=lambda_archive(archive, dist_dir, app_root),
            handler="handler.workflows",
            timeout=timeout,
            statements=statements,
            environment=dict(environment or {}),
            runtime=runtime,
            memory_size=memory_size,
            architectures=architectures,
            vpc_config=vpc_config,
            log_retention_days=log_retention_days,
            reserved_concurrency=None,
            description=f"workflows of connection {connection} (Lambda durable functions)",
            durable_config={
                "execution_timeout": execution_timeout,
                "retention_period": retention_days,
            },
            function_name=function_name,
        )
        self.register_outputs({"function_arn": self.function.arn, "role_arn": self.role.arn})
