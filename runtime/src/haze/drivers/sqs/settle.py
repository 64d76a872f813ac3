"""How the sqs driver settles a received message (delete, retry, release, fail) and keeps
running ones invisible."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence

from haze._base.describe import cap_text, error_line
from haze._base.message import UNRECORDED_FAILURE, with_meta
from haze.contracts.driver import FailedJob, Reserved
from haze.drivers.sqs.messages import (
    _BAD_RECEIPT,
    _BATCH,
    _HAND_BACK_DELAY,
    _MAX_HANDED_BACK,
    _UNRECORDED_TEXT,
    _VISIBILITY_MARGIN,
    SQS_MAX_DELAY,
    SQS_MAX_VISIBILITY,
    SqsReceipt,
    _error_code,
)
from haze.drivers.sqs.send import _Sending

#: how many visibility calls of one heartbeat round are in flight at once
_HEARTBEAT_CALLS = 8
#: about how many leases a round renews a second: _HEARTBEAT_CALLS calls of 10 at about
#: 40 ms each, in the queue's region
RENEWALS_PER_SECOND = 2_000

log = logging.getLogger("haze.sqs")


class _Settling(_Sending):
    """Settling received messages and renewing their visibility."""

    def _visibility_budget(self, receipt: SqsReceipt) -> int:
        """Seconds of visibility SQS still allows (12 h counted from the send, which is
        what moto enforces and never more than SQS allows)."""
        if not receipt.sent_at:
            return SQS_MAX_VISIBILITY - _VISIBILITY_MARGIN
        used = max(0.0, self.now() - receipt.sent_at)
        return int(SQS_MAX_VISIBILITY - _VISIBILITY_MARGIN - used)

    async def _change_visibility(self, receipt: SqsReceipt, seconds: int) -> None:
        await self._call(
            "change_message_visibility",
            QueueUrl=receipt.url,
            ReceiptHandle=receipt.handle,
            VisibilityTimeout=max(0, int(seconds)),
        )

    async def visibility_timeout(self, url: str) -> int:
        """The queue's own ``VisibilityTimeout`` (what Lambda's trigger receives with)."""
        response = await self._call(
            "get_queue_attributes", QueueUrl=url, AttributeNames=["VisibilityTimeout"]
        )
        return int((response.get("Attributes") or {}).get("VisibilityTimeout") or 30)

    async def hand_back(self, receipts: Sequence[SqsReceipt]) -> None:
        """Make received messages visible again now (records a FIFO trigger reports
        unprocessed: their group resumes when its head's own delay ends, not after the
        queue's visibility timeout)."""
        by_url: dict[str, list[SqsReceipt]] = {}
        for r in receipts:
            by_url.setdefault(r.url, []).append(r)
        for url, same in by_url.items():
            for i in range(0, len(same), _BATCH):
                chunk = same[i : i + _BATCH]
                entries = [
                    {"Id": str(n), "ReceiptHandle": r.handle, "VisibilityTimeout": 0}
                    for n, r in enumerate(chunk)
                ]
                response = await self._call(
                    "change_message_visibility_batch", QueueUrl=url, Entries=entries
                )
                for f in response.get("Failed") or []:
                    # it comes back after its visibility timeout instead: later, not lost
                    log.warning(
                        "haze sqs: could not hand back message %s at once (%s: %s)",
                        chunk[int(f["Id"])].message_id,
                        f.get("Code"),
                        f.get("Message"),
                    )

    async def _delete(self, receipt: SqsReceipt) -> bool:
        """Delete a received message; False when its receipt had expired (the message was
        visible again, maybe received by another worker: a lost lease)."""
        try:
            await self._call("delete_message", QueueUrl=receipt.url, ReceiptHandle=receipt.handle)
        except Exception as e:
            if _error_code(e) not in _BAD_RECEIPT:
                raise
            log.debug(
                "haze sqs: could not delete message %s (%s): its receipt expired, so it "
                "may run again",
                receipt.message_id,
                _error_code(e),
            )
            return False
        return True

    async def ack(self, job: Reserved) -> bool:
        return await self._delete(job.token)

    async def release(self, job: Reserved, delay: float, *, consume_attempt: bool) -> bool:
        await self.settle_release(job, delay, consume_attempt=consume_attempt)
        return True

    async def settle_release(self, job: Reserved, delay: float, *, consume_attempt: bool) -> bool:
        """``release`` that says how: True when the message stays in its queue with a new
        visibility timeout (a retry), False when a new message replaced it."""
        receipt: SqsReceipt = job.token
        seconds = math.ceil(delay) if delay > 0 else 0
        if consume_attempt and seconds <= self._visibility_budget(receipt):
            await self._change_visibility(receipt, seconds)
            return True
        if job.message is None:  # undecodable bodies are failed, never released
            await self._change_visibility(receipt, min(seconds, self._visibility_budget(receipt)))
            return True
        used = job.attempt if consume_attempt else job.attempt - 1
        entry = self._entry(
            job.body, job.message, delay, resend=True, attempts=max(0, used), group=receipt.group
        )
        await self._call("send_message", QueueUrl=receipt.url, **entry)
        await self._delete(receipt)
        return False

    async def fail(self, job: Reserved, failed: FailedJob) -> bool:
        try:
            await self.failed.record(failed)
        except Exception as e:
            if not await self._hand_back_failure(job, failed, e):
                raise
        return await self._delete(job.token)

    async def _hand_back_failure(self, job: Reserved, failed: FailedJob, error: Exception) -> bool:
        """The failed store could not keep ``failed`` (it is down, most often): send the
        message back carrying the failure, for a later delivery to record it with the
        job's own error, without running the job or its ``failed()`` again (reporting
        the record instead would run both again, as a job with no try left). False when
        it cannot: an undecodable body, or one sent back too often already."""
        if job.message is None:
            return False
        earlier = (job.message.meta or {}).get(UNRECORDED_FAILURE)
        n = 1 + (earlier.get("handed_back", 0) if isinstance(earlier, dict) else 0)
        pending = {
            "exception": cap_text(failed.exception, _UNRECORDED_TEXT),
            "attempt": failed.attempt or job.attempt,
            "handed_back": n,
        }
        body = with_meta(job.body, UNRECORDED_FAILURE, pending)
        if body is None or n > _MAX_HANDED_BACK:
            return False
        delay = min(_HAND_BACK_DELAY * 2 ** (n - 1), SQS_MAX_DELAY)
        log.warning(
            "haze sqs: the failed-job store could not record the failure of job %s (%s); "
            "its message is sent back to record it in %ds",
            failed.id,
            error_line(error),
            delay,
        )
        receipt: SqsReceipt = job.token
        entry = self._entry(
            body, job.message, delay, resend=True, attempts=job.attempt, group=receipt.group
        )
        await self._call("send_message", QueueUrl=receipt.url, **entry)
        return True

    async def heartbeat(self, jobs: Sequence[Reserved]) -> None:
        """Extend the visibility of running jobs to ``retry_after`` again, 10 a call and
        ``_HEARTBEAT_CALLS`` calls at once: one after the other, 40,000 running jobs took
        4,000 round trips a round, longer than the round's interval."""
        by_url: dict[str, list[SqsReceipt]] = {}
        for job in jobs:
            if isinstance(job.token, SqsReceipt):
                by_url.setdefault(job.token.url, []).append(job.token)
        visibility = math.ceil(self.retry_after)
        calls = [
            (url, receipts[i : i + _BATCH])
            for url, receipts in by_url.items()
            for i in range(0, len(receipts), _BATCH)
        ]
        for i in range(0, len(calls), _HEARTBEAT_CALLS):
            wave = calls[i : i + _HEARTBEAT_CALLS]
            await asyncio.gather(*(self._renew(url, chunk, visibility) for url, chunk in wave))

    async def _renew(self, url: str, chunk: Sequence[SqsReceipt], visibility: int) -> None:
        entries = [
            {
                "Id": str(n),
                "ReceiptHandle": r.handle,
                "VisibilityTimeout": max(0, min(visibility, self._visibility_budget(r))),
            }
            for n, r in enumerate(chunk)
        ]
        response = await self._call(
            "change_message_visibility_batch", QueueUrl=url, Entries=entries
        )
        for f in response.get("Failed") or []:
            r = chunk[int(f["Id"])]
            log.warning(
                "haze sqs: heartbeat of message %s failed (%s: %s)",
                r.message_id,
                f.get("Code"),
                f.get("Message"),
            )
