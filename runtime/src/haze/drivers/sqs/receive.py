"""How the sqs driver receives: polls in priority order, the long poll of an idle worker,
and a received message turned into a ``Reserved`` (or forwarded when not yet due)."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Sequence
from typing import Any

from haze._base.message import Message
from haze.contracts.driver import Reserved
from haze.drivers._hops import due_of
from haze.drivers.sqs.messages import (
    _BATCH,
    _DUE_TOLERANCE,
    _SYSTEM_ATTRIBUTES,
    SqsReceipt,
)
from haze.drivers.sqs.settle import _Settling

log = logging.getLogger("haze.sqs")


class _Receiving(_Settling):
    """Receiving messages, and ending an idle wait when the worker stops."""

    def _stop_event(self) -> asyncio.Event:
        loop = asyncio.get_running_loop()
        if self._stop is None or self._stop_loop is not loop:
            self._stop = asyncio.Event()
            self._stop_loop = loop
        return self._stop

    def interrupt(self) -> None:
        """End an idle wait now (the worker is stopping). A long poll still running in its
        thread is abandoned; a message it returns later is handed back without using a try."""
        if self._stop is not None:
            self._stop.set()

    def _receive_params(self, url: str, wait: int) -> dict[str, Any]:
        return {
            "QueueUrl": url,
            "MaxNumberOfMessages": 1,
            "WaitTimeSeconds": wait,
            "VisibilityTimeout": math.ceil(self.retry_after),
            "MessageSystemAttributeNames": _SYSTEM_ATTRIBUTES,
        }

    async def reserve(self, queues: Sequence[str], wait: float) -> Reserved | None:
        queues = list(queues) or list(self.settings.get("queues") or ["default"])
        stop = self._stop_event()
        if stop.is_set():
            stop.clear()
        for queue in queues:
            job = await self._poll(queue, 0)
            if job is not None:
                return job
        if wait <= 0:
            return None
        seconds = int(min(wait, self.wait_time))
        started = time.monotonic()
        if seconds >= 1:
            job = await self._poll(queues[0], seconds, stop)
            if job is not None:
                return job
        left = wait - (time.monotonic() - started)
        if left > 0 and not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), left)
            except TimeoutError:
                pass
        return None

    async def _poll(
        self, queue: str, wait: int, stop: asyncio.Event | None = None
    ) -> Reserved | None:
        url = self.queue_url_for(queue)
        for _ in range(_BATCH):  # skip past messages forwarded because they are not due
            params = self._receive_params(url, wait)
            if stop is None:
                response = await self._call("receive_message", **params)
            else:
                future = self._submit("receive_message", **params)
                stopper = asyncio.ensure_future(stop.wait())
                try:
                    await asyncio.wait({future, stopper}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    stopper.cancel()
                if not future.done():
                    self._abandon(future, url)
                    return None
                try:
                    response = future.result()
                except Exception as e:
                    self._translate(e, params)
                    raise
            raw = (response.get("Messages") or [None])[0]
            if raw is None:
                return None
            job, _ = await self.admit(url, self.receipt_from_api(url, raw), raw.get("Body") or "")
            if job is not None:
                return job
            wait = 0
        return None

    def _abandon(self, future: asyncio.Future[Any], url: str) -> None:
        """A long poll outlived the worker's stop: hand back what it receives."""
        self._abandoned.add(future)

        def done(f: asyncio.Future[Any]) -> None:
            self._abandoned.discard(f)
            if f.cancelled() or f.exception() is not None:
                return
            for raw in f.result().get("Messages") or []:
                task = asyncio.ensure_future(self._hand_back(url, raw))
                self._abandoned.add(task)
                task.add_done_callback(self._abandoned.discard)

        future.add_done_callback(done)

    async def _hand_back(self, url: str, raw: dict[str, Any]) -> None:
        try:
            job, _ = await self.admit(url, self.receipt_from_api(url, raw), raw.get("Body") or "")
            if job is None:
                return
            if job.message is None:
                await self._change_visibility(job.token, 0)
            else:
                await self.release(job, 0.0, consume_attempt=False)
        except Exception as e:
            log.warning("haze sqs: could not hand back a message received after stop: %s", e)

    @staticmethod
    def receipt_from_api(url: str, raw: dict[str, Any]) -> SqsReceipt:
        """The token of a ``ReceiveMessage`` result."""
        attrs = raw.get("Attributes") or {}
        return SqsReceipt(
            url=url,
            handle=raw["ReceiptHandle"],
            message_id=raw.get("MessageId", ""),
            receive_count=int(attrs.get("ApproximateReceiveCount") or 1),
            sent_at=int(attrs.get("SentTimestamp") or 0) / 1000.0,
            first_received_at=int(attrs.get("ApproximateFirstReceiveTimestamp") or 0) / 1000.0,
            group=attrs.get("MessageGroupId"),
        )

    @staticmethod
    def receipt_from_record(url: str, record: dict[str, Any]) -> SqsReceipt:
        """The token of one record of a Lambda SQS event (``event["Records"][i]``)."""
        attrs = record.get("attributes") or {}
        return SqsReceipt(
            url=url,
            handle=record["receiptHandle"],
            message_id=record.get("messageId", ""),
            receive_count=int(attrs.get("ApproximateReceiveCount") or 1),
            sent_at=int(attrs.get("SentTimestamp") or 0) / 1000.0,
            first_received_at=int(attrs.get("ApproximateFirstReceiveTimestamp") or 0) / 1000.0,
            group=attrs.get("MessageGroupId"),
        )

    async def admit(self, url: str, receipt: SqsReceipt, body: str) -> tuple[Reserved | None, bool]:
        """Turn a received message into a ``Reserved``, or forward it when it is not due.

        Returns ``(job, kept)``: ``job`` is None when the message was not due; ``kept``
        then says whether it stays in its queue (a FIFO hold: the Lambda handler must
        report it as a batch item failure) or was replaced by a new message.
        """
        deliveries = receipt.receive_count - receipt.unused
        job = Reserved.delivered(body, deliveries, receipt, queue=self._queue_of_url(url))
        message = job.message
        due = due_of(message)
        now = self.now()
        if message is not None and due is not None and due - now > _DUE_TOLERANCE:
            return None, await self._not_due(url, receipt, message, body, due - now)
        if (
            self.fifo
            and due is not None
            and receipt.receive_count > 1
            and receipt.first_received_at < due - _DUE_TOLERANCE
        ):
            job.attempt = max(1, job.attempt - 1)  # the first receive only held it until due
        return job, False

    async def _not_due(
        self, url: str, receipt: SqsReceipt, message: Message, body: str, left: float
    ) -> bool:
        if self.fifo and receipt.receive_count <= 1:
            budget = self._visibility_budget(receipt)
            seconds = min(math.ceil(left) + 1, budget)
            if seconds > 0:
                await self._change_visibility(receipt, seconds)
                return True
        # Forward: the same envelope (same attempts, same due) as a new message.
        # (Standard queues: the last hop, within max_delay, drops "due" and its
        # DelaySeconds ends exactly when due.)
        entry = self._entry(
            body, message, left, resend=True, attempts=message.attempts, group=receipt.group
        )
        await self._call("send_message", QueueUrl=url, **entry)
        await self._delete(receipt)
        return False
