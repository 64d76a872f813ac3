"""``SqsDriver``: the sqs driver's parts put together, with its queue sizes, purge and
close."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import ClassVar

from haze.contracts.driver import (
    Concurrent,
    DelayStep,
    Interruptible,
    LeaseBudget,
    Leased,
    MaxDelay,
    QueueCounts,
    RunningJob,
)
from haze.drivers._leases import lease_warning
from haze.drivers.sqs.messages import SQS_MAX_WAIT, _error_code
from haze.drivers.sqs.receive import _Receiving
from haze.drivers.sqs.settle import RENEWALS_PER_SECOND


class SqsDriver(_Receiving, Interruptible, Leased, LeaseBudget, DelayStep, MaxDelay, Concurrent):
    """Queue connection on Amazon SQS; see the package docstring for the rules."""

    #: the config options it takes besides the common ones (``DeclaresOptions``)
    options: ClassVar[Mapping[str, str]] = {
        "queue_url": "str",
        "region": "str",
        "endpoint_url": "str",
        "failed_store": "str",
        "retry_after": "duration",
        "wait_time": "duration",
        "fifo": "bool",
        "credentials": "dict",
    }
    remote = True
    #: delays are whole seconds (a retry backoff is rounded up): what logs report
    delay_step = 1.0
    local_callbacks = False
    inline = False

    def lease_warning(self, concurrency: int) -> str | None:
        return lease_warning(
            self.name,
            "SQS",
            concurrency,
            rate=RENEWALS_PER_SECOND,
            interval=self.heartbeat_interval,
            retry_after=self.retry_after,
        )

    # -- inspection ---------------------------------------------------------------

    _SIZE_ATTRIBUTES = (
        "ApproximateNumberOfMessages",
        "ApproximateNumberOfMessagesDelayed",
        "ApproximateNumberOfMessagesNotVisible",
    )

    async def size(self, queue: str) -> int:
        """Waiting + delayed + in flight (see "Sizes" in the package docstring)."""
        response = await self._call(
            "get_queue_attributes",
            QueueUrl=self.queue_url_for(queue),
            AttributeNames=list(self._SIZE_ATTRIBUTES),
        )
        attrs = response.get("Attributes") or {}
        return sum(int(attrs.get(a) or 0) for a in self._SIZE_ATTRIBUTES)

    async def counts(self, queue: str) -> QueueCounts:
        """SQS's approximate counts: visible (ready), delayed, and in flight (running; a
        message received by a worker that died stays in flight until its visibility
        timeout ends). ``oldest_ready_at`` stays None: the age of the oldest message is
        the CloudWatch metric ApproximateAgeOfOldestMessage, not a queue attribute."""
        response = await self._call(
            "get_queue_attributes",
            QueueUrl=self.queue_url_for(queue),
            AttributeNames=list(self._SIZE_ATTRIBUTES),
        )
        ready, delayed, running = (
            int((response.get("Attributes") or {}).get(a) or 0) for a in self._SIZE_ATTRIBUTES
        )
        return QueueCounts(ready, delayed, running)

    async def running(self, queue: str, limit: int = 50) -> list[RunningJob] | None:
        """None: SQS cannot list the messages in flight."""
        return None

    async def purge(self, queue: str) -> int:
        """``PurgeQueue`` (every message, in flight too); returns the approximate count.
        Within 60 s of a previous purge SQS refuses, and the visible messages are received
        and deleted instead."""
        url = self.queue_url_for(queue)
        n = await self.size(queue)
        try:
            await self._call("purge_queue", QueueUrl=url)
            return n
        except Exception as e:
            if "PurgeQueueInProgress" not in _error_code(e):
                raise
        deleted = 0
        while True:
            response = await self._call(
                "receive_message",
                QueueUrl=url,
                MaxNumberOfMessages=10,
                WaitTimeSeconds=0,
                VisibilityTimeout=30,
            )
            messages = response.get("Messages") or []
            if not messages:
                return deleted
            entries = [
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)
            ]
            await self._call("delete_message_batch", QueueUrl=url, Entries=entries)
            deleted += len(messages)

    async def close(self) -> None:
        pending = [f for f in self._abandoned if not f.done()]
        if pending:
            await asyncio.wait(pending, timeout=SQS_MAX_WAIT + 5)
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None
