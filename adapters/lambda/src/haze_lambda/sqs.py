"""``haze_lambda.sqs_handler``: the handler of an SQS trigger (event source mapping).

Enable ``ReportBatchItemFailures`` on the event source mapping. Each record runs
through the same pipeline as a worker's job (``manager.process``), with the
connection's ``SqsDriver`` settling it on the record's own receipt handle:

==========================  ==========================================  ============
outcome                     what happens to the message                  reported?
==========================  ==========================================  ============
success (or skipped)        deleted                                      no
retry (a try is used)       visibility set to haze's backoff; it         yes
                            comes back when the backoff ends
``job.release(delay)``      re-sent as a new message carrying the        no
                            attempts used so far, the old one deleted
                            (a release uses no try)
final failure               recorded in the failed store, deleted        no
not yet due (long delay)    forwarded (standard) or held (FIFO hold:     FIFO only
                            visibility until due)
==========================  ==========================================  ============

"Reported" means listed in ``{"batchItemFailures": [{"itemIdentifier": messageId}]}``:
Lambda then leaves that message in the queue (with the visibility haze set) and
deletes the others. Successes and final failures are deleted by haze too, so a
later timeout of the same invocation cannot run them again.

The attempt number is the envelope's ``attempts`` plus the record's
``ApproximateReceiveCount``, exactly as on a worker. Records of a standard queue run
concurrently (up to the connection's ``concurrency``); records of a FIFO queue run in
order, and after the first reported record the rest of the batch is reported
unprocessed, as AWS requires for FIFO triggers. Records not started before the
function's deadline (less ``HAZE_SQS_MARGIN``, default 5 s) are handed back without
using a try. Running jobs get the worker's visibility heartbeat.

The connection is ``HAZE_SQS_CONNECTION``, else the ``sqs`` connection of
``config/queue.py`` whose queues include the record's ``eventSourceARN``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # loaded on the first invocation, not at import (cold start)
    from haze import App
    from haze._kernel.message import Message
    from haze._runners.delivery import Delivery
    from haze.contracts.driver import (
        Concurrent,
        Driver,
        FailedJob,
        FailedJobStore,
        Leased,
        Reserved,
    )
    from haze.drivers.sqs import SqsReceipt

    class SqsRecords(Driver, Leased, Concurrent, Protocol):
        """What the handler needs from the connection's driver (``SqsDriver``): it
        admits a record delivered by Lambda as a job, and says how a release settled it.
        """

        fifo: bool
        #: Delays are whole seconds: the manager rounds a retry's backoff up to it.
        delay_step: float

        def url_for_arn(self, arn: str) -> str | None: ...
        def receipt_from_record(self, url: str, record: dict[str, Any]) -> SqsReceipt: ...
        async def admit(
            self, url: str, receipt: SqsReceipt, body: str
        ) -> tuple[Reserved | None, bool]: ...
        async def settle_release(
            self, job: Reserved, delay: float, *, consume_attempt: bool
        ) -> bool: ...


from haze_lambda._boot import run

__all__ = ["sqs_handler"]

log = logging.getLogger("haze.lambda")


class _RecordDriver:
    """The connection's driver for one received record: it settles the job as the
    driver does, and notes whether a release left the message in its queue (a retry
    whose visibility haze set: Lambda must be told, as a batch item failure)."""

    def __init__(self, driver: SqsRecords) -> None:
        self._d = driver
        self.name = driver.name
        self.remote = driver.remote
        self.local_callbacks = driver.local_callbacks
        self.inline = driver.inline
        self.max_message_size = driver.max_message_size
        self.outage_errors = driver.outage_errors
        self.delay_step = driver.delay_step
        self.kept = False

    @property
    def failed(self) -> FailedJobStore:
        return self._d.failed

    async def enqueue(self, body: str, message: Message, delay: float) -> None:
        await self._d.enqueue(body, message, delay)

    async def enqueue_many(self, items: Sequence[tuple[str, Message, float]]) -> None:
        await self._d.enqueue_many(items)

    async def reserve(self, queues: Sequence[str], wait: float) -> Reserved | None:
        return await self._d.reserve(queues, wait)

    async def ack(self, job: Reserved) -> bool:
        return await self._d.ack(job)

    async def release(self, job: Reserved, delay: float, *, consume_attempt: bool) -> bool:
        self.kept = await self._d.settle_release(job, delay, consume_attempt=consume_attempt)
        return True

    async def fail(self, job: Reserved, failed: FailedJob) -> bool:
        return await self._d.fail(job, failed)

    async def size(self, queue: str) -> int:
        return await self._d.size(queue)

    async def purge(self, queue: str) -> int:
        return await self._d.purge(queue)

    async def close(self) -> None:
        await self._d.close()


def _connection_for(app: App, arn: str) -> tuple[SqsRecords, str]:
    named = os.environ.get("HAZE_SQS_CONNECTION")
    candidates = (
        [named]
        if named
        else [n for n, c in app.queue_config.connections.items() if c.get("driver") == "sqs"]
    )
    from haze.drivers.sqs import SqsDriver

    for name in candidates:
        driver = app.driver(name)
        if not isinstance(driver, SqsDriver):
            raise RuntimeError(f'haze_lambda: connection "{name}" does not use the sqs driver')
        url = driver.url_for_arn(arn)
        if url is not None:
            return driver, url
    where = f'connection "{named}"' if named else "no sqs connection of config/queue.py"
    raise RuntimeError(
        f"haze_lambda: {where} serves the queue {arn}; check queue_url (a queue of that "
        "connection) or set HAZE_SQS_CONNECTION"
    )


def _remaining(context: Any) -> float | None:
    get = getattr(context, "get_remaining_time_in_millis", None)
    if get is None:
        return None
    try:
        return float(get()) / 1000.0
    except Exception:
        return None


async def _run_record(
    delivery: Delivery,
    record: dict[str, Any],
    driver: SqsRecords,
    url: str,
    deadline: float | None,
) -> bool:
    """Run one record; True when it must be reported as a batch item failure."""
    receipt = driver.receipt_from_record(url, record)
    job, kept = await driver.admit(url, receipt, record.get("body") or "")
    if job is None:
        delivery.outcomes["forwarded"] += 1
        return kept
    if deadline is not None and asyncio.get_running_loop().time() >= deadline:
        await driver.settle_release(job, 0.0, consume_attempt=False)
        delivery.outcomes["handed_back"] += 1
        return False
    adapter = _RecordDriver(driver)
    await delivery.run(job, adapter, leased=driver)
    return adapter.kept


def _listed(
    app: App, delivery: Delivery, resolved: list[tuple[SqsRecords, str]], concurrency: int
) -> AbstractAsyncContextManager[None]:
    """This execution environment on the dashboard's Workers page while the records run
    (haze._runners.presence.Invocations: a short lease, written at most every few
    seconds, never removed: an idle environment drops off by itself)."""
    from haze._runners.presence import invocations

    if not resolved:
        return contextlib.nullcontext()
    queues = sorted({url.rsplit("/", 1)[-1] for _, url in resolved})
    listed = invocations(app, resolved[0][0].name, "lambda")
    return listed.invocation(delivery, queues, concurrency)


async def _handle(app: App, event: dict[str, Any], context: Any) -> dict[str, Any]:
    from haze._app.env import env_duration
    from haze._runners.delivery import Delivery

    records: list[dict[str, Any]] = list(event.get("Records") or [])
    margin = env_duration("HAZE_SQS_MARGIN", 5.0)
    remaining = _remaining(context)
    deadline = None if remaining is None else asyncio.get_running_loop().time() + remaining - margin
    resolved = [_connection_for(app, r.get("eventSourceARN", "")) for r in records]
    drivers = list({id(d): d for d, _ in resolved}.values())
    fifo = any(d.fifo for d in drivers)
    delivery = Delivery(app.manager)

    async def one(item: tuple[dict[str, Any], tuple[SqsRecords, str]]) -> bool:
        record, (driver, url) = item
        try:
            return await _run_record(delivery, record, driver, url, deadline)
        except Exception:
            log.exception(
                "haze_lambda: record %s could not be settled; %s",
                record.get("messageId"),
                "reporting it and the rest of the batch" if fifo else "reporting it as failed",
            )
            return True

    beat = None
    if drivers:
        beat = asyncio.ensure_future(
            delivery.keep_leases(
                min(d.heartbeat_interval for d in drivers),
                lambda e: log.warning("haze_lambda: heartbeat failed: %s", e),
            )
        )
    concurrency = max((d.concurrency for d in drivers), default=1)
    try:
        # FIFO: in order, and after the first reported record the rest of the batch is
        # reported unprocessed, as AWS requires for FIFO triggers.
        async with _listed(app, delivery, resolved, concurrency):
            reports = await delivery.run_batch(
                list(zip(records, resolved, strict=True)),
                one,
                concurrency=concurrency,
                stop=(lambda report: report) if fifo else None,
            )
    finally:
        if beat is not None:
            beat.cancel()
    if fifo:
        first = len(reports) - 1 if reports and reports[-1] else len(records)
        reported = [r["messageId"] for r in records[first:]]
    else:
        reported = [r["messageId"] for r, report in zip(records, reports, strict=True) if report]
    log.info("haze_lambda: %d record(s): %s", len(records), dict(delivery.outcomes))
    return {"batchItemFailures": [{"itemIdentifier": m} for m in reported]}


def sqs_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Lambda handler for an SQS trigger; returns the partial batch response."""
    return run(lambda app: _handle(app, event, context))
