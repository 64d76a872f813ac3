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
import logging
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # loaded on the first invocation, not at import (cold start)
    from haze import App
    from haze.contracts.driver import FailedJob, Reserved
    from haze.drivers.sqs import SqsDriver

from haze_lambda._boot import run

__all__ = ["sqs_handler"]

log = logging.getLogger("haze.lambda")


class _RecordDriver:
    """The connection's driver for one received record: everything is delegated, and
    ``release`` notes whether the message stayed in the queue (to be reported)."""

    def __init__(self, driver: SqsDriver) -> None:
        self._d = driver
        self.name = driver.name
        self.remote = driver.remote
        self.local_callbacks = driver.local_callbacks
        self.inline = driver.inline
        self.max_message_size = driver.max_message_size
        self.kept = False

    @property
    def failed(self) -> Any:
        return self._d.failed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._d, name)

    async def ack(self, job: Reserved) -> bool:
        return await self._d.ack(job)

    async def release(self, job: Reserved, delay: float, *, consume_attempt: bool) -> bool:
        self.kept = await self._d.settle_release(job, delay, consume_attempt=consume_attempt)
        return True

    async def fail(self, job: Reserved, failed: FailedJob) -> bool:
        return await self._d.fail(job, failed)


def _connection_for(app: App, arn: str) -> tuple[SqsDriver, str]:
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


async def _handle(app: App, event: dict[str, Any], context: Any) -> dict[str, Any]:
    from haze._app.env import env_duration

    records: list[dict[str, Any]] = list(event.get("Records") or [])
    margin = env_duration("HAZE_SQS_MARGIN", 5.0)
    loop = asyncio.get_running_loop()
    remaining = _remaining(context)
    deadline = None if remaining is None else loop.time() + remaining - margin
    resolved = [_connection_for(app, r.get("eventSourceARN", "")) for r in records]
    active: dict[int, tuple[SqsDriver, Reserved]] = {}
    reported: list[str] = []
    outcomes: dict[str, int] = {}

    async def one(record: dict[str, Any], driver: SqsDriver, url: str) -> bool:
        """Run one record; True when it must be reported as a batch item failure."""
        receipt = driver.receipt_from_record(url, record)
        job, kept = await driver.admit(url, receipt, record.get("body") or "")
        if job is None:
            outcomes["forwarded"] = outcomes.get("forwarded", 0) + 1
            return kept
        if deadline is not None and loop.time() >= deadline:
            await driver.settle_release(job, 0.0, consume_attempt=False)
            outcomes["handed_back"] = outcomes.get("handed_back", 0) + 1
            return False
        adapter = _RecordDriver(driver)
        active[id(job)] = (driver, job)
        try:
            outcome = await app.manager.process(job, adapter)
        finally:
            del active[id(job)]
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        return adapter.kept

    async def heartbeat(interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            by_driver: dict[int, tuple[SqsDriver, list[Reserved]]] = {}
            for d, j in list(active.values()):
                by_driver.setdefault(id(d), (d, []))[1].append(j)
            for d, jobs in by_driver.values():
                try:
                    await d.heartbeat(jobs)
                except Exception as e:
                    log.warning("haze_lambda: heartbeat failed: %s", e)

    drivers = list({id(d): d for d, _ in resolved}.values())
    beat = None
    if drivers:
        beat = asyncio.ensure_future(heartbeat(min(d.heartbeat_interval for d in drivers)))
    try:
        fifo = any(d.fifo for d in drivers)
        if fifo:
            for i, (record, (driver, url)) in enumerate(zip(records, resolved, strict=True)):
                try:
                    report = await one(record, driver, url)
                except Exception:
                    log.exception(
                        "haze_lambda: record %s could not be settled; reporting it "
                        "and the rest of the batch",
                        record.get("messageId"),
                    )
                    report = True
                if report:
                    reported.extend(r["messageId"] for r in records[i:])
                    break
        else:
            limit = asyncio.Semaphore(max(d.concurrency for d in drivers) if drivers else 1)

            async def bounded(record: dict[str, Any], driver: SqsDriver, url: str) -> None:
                async with limit:
                    try:
                        report = await one(record, driver, url)
                    except Exception:
                        log.exception(
                            "haze_lambda: record %s could not be settled; reporting it as failed",
                            record.get("messageId"),
                        )
                        report = True
                if report:
                    reported.append(record["messageId"])

            await asyncio.gather(
                *(bounded(r, d, u) for r, (d, u) in zip(records, resolved, strict=True))
            )
    finally:
        if beat is not None:
            beat.cancel()
    order = {r["messageId"]: i for i, r in enumerate(records)}
    reported.sort(key=lambda m: order.get(m, 0))
    log.info("haze_lambda: %d record(s): %s", len(records), outcomes)
    return {"batchItemFailures": [{"itemIdentifier": m} for m in reported]}


def sqs_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Lambda handler for an SQS trigger; returns the partial batch response."""
    return run(lambda app: _handle(app, event, context))
