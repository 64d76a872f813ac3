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

from haze_infra.aws.app import HazeAwsApp
from haze_infra.aws.container_worker import ContainerSettings, HazeContainerWorker
from haze_infra.aws.drain_schedule import HazeDrainSchedule
from haze_infra.aws.lambda_consumer import HazeLambdaConsumer
from haze_infra.aws.resources import (
    CONSUMER_SQS_ACTIONS,
    LOG_ACTIONS,
    SEND_SQS_ACTIONS,
    lambda_archive,
)
from haze_infra.aws.schedule_rules import HazeScheduleRules
from haze_infra.aws.sqs_queue import HazeSqsQueue

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
