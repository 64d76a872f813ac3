"""How the sqs driver sends messages: one, a batch, and a re-send with rewritten fields."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any

from haze._base.describe import error_line
from haze._base.errors import DispatchIncompleteError, PayloadTooLargeError, UnknownQueueError
from haze._base.message import Message, new_id
from haze.drivers._hops import rewrite_hop
from haze.drivers.sqs.client import _SqsClient
from haze.drivers.sqs.messages import (
    _BATCH,
    _HEADROOM,
    SQS_MAX_DELAY,
    SQS_MAX_MESSAGE_SIZE,
    _group_id,
)


class _Sending(_SqsClient):
    """Sending: dispatch, batches, and the re-sends of releases and forwarded delays."""

    def _entry(
        self,
        body: str,
        message: Message,
        delay: float,
        *,
        resend: bool,
        attempts: int | None = None,
        group: str | None = None,
    ) -> dict[str, Any]:
        """SendMessage parameters (without QueueUrl) for ``body`` available after ``delay``."""
        due: float | None = None
        seconds = 0
        if delay > 0:
            if self.fifo:
                due = self.now() + delay
            elif delay > self.max_delay:
                due = self.now() + delay
                seconds = math.ceil(self.max_delay)
            else:
                seconds = math.ceil(delay)
        if resend or due is not None:
            body = rewrite_hop(body, attempts=attempts, due=due)
            self._check_size(body, message)
        entry: dict[str, Any] = {"MessageBody": body}
        if seconds:
            entry["DelaySeconds"] = min(seconds, SQS_MAX_DELAY)
        if self.fifo:
            entry["MessageGroupId"] = _group_id(group or self._group_of(message, message.queue))
            if resend:
                # a whole new id: its process prefix alone repeats on every re-send from
                # one process, its counter alone across processes, and SQS drops a repeat
                # within 5 minutes as a duplicate (the job lost)
                entry["MessageDeduplicationId"] = f"{message.id}-r{new_id()}"
            else:
                entry["MessageDeduplicationId"] = f"{message.id}-{int(message.ts * 1000)}"
        return entry

    def _check_size(self, body: str, message: Message) -> None:
        """A body the driver added fields to still fits: dispatch keeps ``_HEADROOM``
        bytes free for them, so only a body sent before that rule can fail this."""
        limit = self.max_message_size + _HEADROOM
        size = len(body) if body.isascii() else len(body.encode("utf-8"))
        if size > limit:
            raise PayloadTooLargeError(
                f'job "{message.job}": the message is {size} bytes with the fields the sqs '
                f'driver adds, over the {limit}-byte limit of connection "{self.name}"; pass '
                "ids instead of data (nothing was enqueued)"
            )

    def _send_url(self, queue: str) -> str:
        """The URL a dispatch to ``queue`` goes to, refused (before any call) when it is
        not one of this connection's queues of its own kind."""
        url = self.queue_url_for(queue)
        sqs_name = self._name_of(url)
        if sqs_name.endswith(".fifo") != self.fifo:
            kind = "a FIFO" if sqs_name.endswith(".fifo") else "a standard"
            raise UnknownQueueError(
                f'queue "{queue}" is {kind} SQS queue ({sqs_name}), which the '
                f'{"FIFO" if self.fifo else "standard"} connection "{self.name}" cannot '
                "send to; dispatch it on a connection whose queue_url is of that kind, or "
                'name the queue without ".fifo"',
                queue=queue,
                connection=self.name,
                key=f"connections.{self.name}.queue_url",
            )
        if queue.startswith(("https://", "http://")):
            own = self.queue_for_name(sqs_name)
            if own is None or self.queue_url_for(own) != url:
                # else a dispatch (an HTTP one too) could send to any queue of any account
                raise UnknownQueueError(
                    f'the queue URL {url} is not a queue of connection "{self.name}" (its '
                    "queue_url does not name it); dispatch by queue name",
                    queue=sqs_name,
                    connection=self.name,
                    key=f"connections.{self.name}.queue_url",
                )
        return url

    async def enqueue(self, body: str, message: Message, delay: float) -> None:
        entry = self._entry(body, message, delay, resend=False)
        await self._call("send_message", QueueUrl=self._send_url(message.queue), **entry)

    async def enqueue_many(self, items: Sequence[tuple[str, Message, float]]) -> None:
        """``SendMessageBatch`` per SQS queue: 10 entries and at most 1 MiB per call.

        Entries SQS refuses are raised together, each with its message id
        (``DispatchIncompleteError``); on FIFO the batches after a refused one are not
        sent (they would go ahead of it) and are listed too."""
        by_url: dict[str, list[tuple[dict[str, Any], Message]]] = {}
        for body, message, delay in items:
            by_url.setdefault(self._send_url(message.queue), []).append(
                (self._entry(body, message, delay, resend=False), message)
            )
        chunks = _batches(by_url)
        failed: dict[str, str] = {}
        # A call that fails (the service unreachable) refuses its whole chunk; raised as
        # it is only when no other chunk was queued.
        errors: list[Exception] = []
        if self.fifo:  # one batch after the other: the order within a group is the order sent
            for i, (url, chunk) in enumerate(chunks):
                try:
                    failed.update(await self._send_batch(url, chunk))
                except Exception as e:
                    errors.append(e)
                    failed.update((m.id, error_line(e)) for _, m in chunk)
                if failed:
                    for _, rest in chunks[i + 1 :]:
                        failed.update(
                            (m.id, "not sent: it would go ahead of one refused") for _, m in rest
                        )
                    break
        else:
            results = await asyncio.gather(
                *(self._send_batch(url, chunk) for url, chunk in chunks), return_exceptions=True
            )
            for result, (_, chunk) in zip(results, chunks, strict=True):
                if isinstance(result, Exception):
                    errors.append(result)
                    failed.update((m.id, error_line(result)) for _, m in chunk)
                elif isinstance(result, BaseException):
                    raise result  # cancelled, or the process is stopping
                else:
                    failed.update(result)
        if errors and len(failed) == len(items):
            raise errors[0]  # nothing was queued: the call's own error
        if failed:
            listed = ", ".join(f"{job_id} ({why})" for job_id, why in failed.items())
            raise DispatchIncompleteError(
                f"SQS refused {len(failed)} of {len(items)} messages sent by connection "
                f'"{self.name}"; the others were queued. Not queued: {listed}',
                failed=failed,
            )

    async def _send_batch(
        self, url: str, chunk: list[tuple[dict[str, Any], Message]]
    ) -> dict[str, str]:
        """Send one ``SendMessageBatch``; the ids of the messages SQS refused, with why."""
        numbered = [{"Id": str(i), **e} for i, (e, _) in enumerate(chunk)]
        response = await self._call("send_message_batch", QueueUrl=url, Entries=numbered)
        failed = response.get("Failed") or []
        if failed and not any(f.get("SenderFault") for f in failed):
            # SQS's own fault on every entry refused: retry those once
            retry = [numbered[int(f["Id"])] for f in failed]
            again = await self._call("send_message_batch", QueueUrl=url, Entries=retry)
            failed = [{**f, "Id": retry[int(f["Id"])]["Id"]} for f in again.get("Failed") or []]
        return {chunk[int(f["Id"])][1].id: f"{f.get('Code')}: {f.get('Message')}" for f in failed}


def _batches(
    by_url: dict[str, list[tuple[dict[str, Any], Message]]],
) -> list[tuple[str, list[tuple[dict[str, Any], Message]]]]:
    """Each queue's entries cut into ``SendMessageBatch`` calls (10 entries, 1 MiB)."""
    chunks: list[tuple[str, list[tuple[dict[str, Any], Message]]]] = []
    for url, entries in by_url.items():
        chunk: list[tuple[dict[str, Any], Message]] = []
        size = 0
        for entry, message in entries:
            n = len(entry["MessageBody"].encode("utf-8"))
            if chunk and (len(chunk) == _BATCH or size + n > SQS_MAX_MESSAGE_SIZE):
                chunks.append((url, chunk))
                chunk, size = [], 0
            chunk.append((entry, message))
            size += n
        if chunk:
            chunks.append((url, chunk))
    return chunks
