"""HazeSqsQueue: an SQS queue and its dead-letter queue, the redrive
maxReceiveCount following the jobs' tries."""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
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

from haze_infra.aws.resources import _SQS_NAME, _check, _child
from haze_infra.rules import (
    FIFO_BATCH,
    SQS_MAX_RECEIVE_COUNT,
    SQS_MAX_VISIBILITY,
    SQS_RECEIVE_SLACK,
)
from haze_infra.rules import max_receive_count as receive_count_for

__all__ = ["HazeSqsQueue"]


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
