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
``ApproximateReceiveCount``, as on a worker, less the receives that ran nothing.
Records of a standard queue run concurrently (up to the connection's
``concurrency``); records of a FIFO queue run in order, and after the first reported
record the rest of the batch is reported unprocessed, as AWS requires for FIFO
triggers. Those were not run: each one's unused receive is counted in the app's state
store (``haze:sqs:unused:<messageId>``, kept 14 days) before it is made visible again
at once (its group then resumes when the reported record's own delay ends). That count
is written for every record when the invocation starts and taken back (the key
deleted, or set back) as each one starts, so the records an invocation that dies (out
of memory, a crash) never started keep their tries too, on both kinds of queue.

Records not started before the function's deadline (less ``HAZE_SQS_MARGIN``, default
5 s) are handed back without using a try: on a FIFO queue by reporting them (a re-sent
message would go behind later ones), on a standard queue by re-sending them; an
undecodable record is reported (Lambda would delete it unreported). A function whose
timeout is at or below the margin is refused with a ``ConfigError``. Running jobs get
the worker's visibility heartbeat; a queue whose ``VisibilityTimeout`` is shorter than
its interval gets a warning.

The connection is ``HAZE_SQS_CONNECTION``, else the ``sqs`` connection of
``config/queue.py`` whose queues include the record's ``eventSourceARN``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # loaded on the first invocation, not at import (cold start)
    from haze import App
    from haze.contracts.driver import (
        Concurrent,
        Driver,
        FailedJob,
        FailedJobStore,
        Leased,
        Reserved,
    )
    from haze.driver_api import Delivery, Message
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
        async def hand_back(self, receipts: Sequence[SqsReceipt]) -> None: ...
        async def visibility_timeout(self, url: str) -> int: ...


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
    from haze.driver_api import ConfigError
    from haze.drivers.sqs import SqsDriver

    named = os.environ.get("HAZE_SQS_CONNECTION")
    candidates = (
        [named]
        if named
        else [n for n, c in app.queue_config.connections.items() if c.get("driver") == "sqs"]
    )
    found: list[tuple[str, SqsRecords, str]] = []
    for name in candidates:
        driver = app.driver(name)
        if not isinstance(driver, SqsDriver):
            raise RuntimeError(f'haze_lambda: connection "{name}" does not use the sqs driver')
        url = driver.url_for_arn(arn)
        if url is not None:
            found.append((name, driver, url))
    if len(found) > 1:
        names = ", ".join(f'"{n}"' for n, _, _ in found)
        raise ConfigError(
            f"haze_lambda: the queue {arn} fits the queue_url of connections {names}; give "
            "them queue_url templates that cannot both fit one queue, or set "
            "HAZE_SQS_CONNECTION"
        )
    if found:
        return found[0][1], found[0][2]
    if named:
        kind = "FIFO" if arn.endswith(".fifo") else "standard"
        raise ConfigError(
            f'haze_lambda: connection "{named}" (HAZE_SQS_CONNECTION) does not serve the '
            f"{kind} queue {arn}: its queue_url names no such queue, or a queue of the other "
            "kind (a FIFO queue is only served by a FIFO connection); point "
            "HAZE_SQS_CONNECTION at the connection of that queue, or unset it"
        )
    raise ConfigError(
        f"haze_lambda: no sqs connection of config/queue.py serves the queue {arn}; check "
        "queue_url (a queue of that connection) or set HAZE_SQS_CONNECTION"
    )


def _remaining(context: Any) -> float | None:
    get = getattr(context, "get_remaining_time_in_millis", None)
    if get is None:
        return None
    try:
        return float(get()) / 1000.0
    except Exception:
        return None


#: What became of a record: settled (deleted or replaced: not reported), kept (in its
#: queue with the visibility haze set: a retry, a FIFO hold; reported), or unrun (not
#: run: reported, handed back at once, and its receive not counted as an attempt).
_SETTLED, _KEPT, _UNRUN = "settled", "kept", "unrun"
#: Takes back the unused receive noted for a record when it starts (see ``_charge``).
_Started = Callable[[], Awaitable[None]]
#: How long a message's count of unused receives is kept: SQS's longest retention.
_UNUSED_TTL = 14 * 86400.0


def _unused_key(message_id: str) -> str:
    return f"haze:sqs:unused:{message_id}"


async def _run_record(
    delivery: Delivery,
    record: dict[str, Any],
    driver: SqsRecords,
    url: str,
    deadline: float | None,
    unused: int,
    started: _Started | None,
) -> str:
    """Run one record; returns what became of it (``_SETTLED``, ``_KEPT``, ``_UNRUN``).
    ``started`` takes back the receive charged as unused when the invocation began (None:
    none was): it is called before the job runs, or once the record no longer needs it
    (a FIFO hold the driver counts itself, a message re-sent or replaced)."""
    past = deadline is not None and asyncio.get_running_loop().time() >= deadline
    if past and driver.fifo:
        # handed back by reporting it: a re-sent message would go behind later ones
        delivery.outcomes["handed_back"] += 1
        return _UNRUN
    receipt = driver.receipt_from_record(url, record)
    receipt.unused = unused
    job, kept = await driver.admit(url, receipt, record.get("body") or "")
    if past and job is not None and job.message is None:
        # not recorded as failed yet: Lambda must not delete it
        delivery.outcomes["handed_back"] += 1
        return _UNRUN
    if started is not None:
        await started()
    if job is None:
        delivery.outcomes["forwarded"] += 1
        return _KEPT if kept else _SETTLED
    if past:
        delivery.outcomes["handed_back"] += 1
        await driver.settle_release(job, 0.0, consume_attempt=False)
        return _SETTLED
    adapter = _RecordDriver(driver)
    await delivery.run(job, adapter, leased=driver)
    return _KEPT if adapter.kept else _SETTLED


async def _unused_counts(app: App, records: list[dict[str, Any]]) -> list[int] | None:
    """Each record's receives that ran nothing (records reported unprocessed, or left
    unstarted by an invocation that died); None when the store cannot be read."""
    if not records:
        return []
    keys = [_unused_key(str(r.get("messageId"))) for r in records]
    try:
        values = await app.manager.state_store().get_many(keys)
    except Exception as e:
        log.warning("haze_lambda: could not read the unused receives of the records: %s", e)
        return None
    return [int(v or 0) for v in values]


async def _charge(
    app: App, records: list[dict[str, Any]], unused: list[int]
) -> list[_Started | None]:
    """Note this receive as unused for every record before any runs, so one the
    invocation never starts (it dies first: out of memory, a crash) keeps its tries;
    returns each record's ``started``, which takes the note back (the key is deleted
    again, or set back to its earlier count). A record whose note could not be written
    gets None: its receive counts as an attempt, as before."""
    store = app.manager.state_store()
    keys = [_unused_key(str(r.get("messageId"))) for r in records]
    results = await asyncio.gather(
        *(store.put(k, n + 1, _UNUSED_TTL) for k, n in zip(keys, unused, strict=True)),
        return_exceptions=True,
    )
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        log.warning(
            "haze_lambda: could not note %d record(s) as not started yet (should this "
            "invocation die before running them, their next receive counts as an "
            "attempt): %s",
            len(failed),
            failed[0],
        )

    def started(key: str, before: int) -> _Started:
        async def take_back() -> None:
            try:
                await (store.put(key, before, _UNUSED_TTL) if before else store.delete(key))
            except Exception as e:  # it may run once more after a crash: never once less
                log.warning("haze_lambda: could not note that %s started: %s", key, e)

        return take_back

    return [
        None if isinstance(r, BaseException) else started(k, n)
        for k, n, r in zip(keys, unused, results, strict=True)
    ]


async def _hand_back(
    app: App, unrun: list[tuple[dict[str, Any], SqsRecords, str]], noted: set[str]
) -> None:
    """Records reported without running: their receive is noted as unused (so it is not
    counted as an attempt) unless ``_charge`` already did, then they are made visible
    again."""
    if not unrun:
        return
    store = app.manager.state_store()
    notes = [
        store.increment(_unused_key(str(r.get("messageId"))), 1, _UNUSED_TTL)
        for r, d, _ in unrun
        # a standard queue's unrun record is an undecodable one: no tries to keep
        if d.fifo and str(r.get("messageId")) not in noted
    ]
    for result in await asyncio.gather(*notes, return_exceptions=True):
        if isinstance(result, BaseException):
            log.warning(
                "haze_lambda: could not note a record reported unprocessed (its next run "
                "counts one more attempt): %s",
                result,
            )
            break
    by_driver: dict[int, tuple[SqsRecords, list[SqsReceipt]]] = {}
    for record, driver, url in unrun:
        receipts = by_driver.setdefault(id(driver), (driver, []))[1]
        receipts.append(driver.receipt_from_record(url, record))
    for driver, receipts in by_driver.values():
        try:
            await driver.hand_back(receipts)
        except Exception as e:  # they come back after their visibility timeout instead
            log.warning("haze_lambda: could not hand back the unprocessed records: %s", e)


#: The queues whose VisibilityTimeout this process has checked against the heartbeat.
_checked: set[str] = set()


async def _check_visibility(resolved: list[tuple[SqsRecords, str]]) -> None:
    """Warn once per queue when Lambda's receive (with the queue's VisibilityTimeout)
    hides a record for less than the heartbeat's interval: a record running longer is
    delivered again before its first heartbeat."""
    for driver, url in {url: (d, url) for d, url in resolved}.values():
        if url in _checked:
            continue
        _checked.add(url)
        try:
            visibility = await driver.visibility_timeout(url)
        except Exception as e:  # a check, not the invocation's work
            log.debug("haze_lambda: could not read the VisibilityTimeout of %s: %s", url, e)
            continue
        if visibility < driver.heartbeat_interval:
            log.warning(
                "haze_lambda: the SQS queue %s has a VisibilityTimeout of %ds, shorter than "
                'the heartbeat of connection "%s" (every %gs, retry_after / 3): a record '
                "running longer than %ds is delivered again while it runs; raise the "
                "queue's VisibilityTimeout, or lower retry_after to at most 3 x %ds",
                url.rsplit("/", 1)[-1],
                visibility,
                driver.name,
                driver.heartbeat_interval,
                visibility,
                visibility,
            )


def _listed(
    app: App, delivery: Delivery, resolved: list[tuple[SqsRecords, str]], concurrency: int
) -> AbstractAsyncContextManager[None]:
    """This execution environment on the dashboard's Workers page while the records run
    (haze._runners.presence.Invocations: a short lease, written at most every few
    seconds, never removed: an idle environment drops off by itself)."""
    from haze.driver_api import invocations

    if not resolved:
        return contextlib.nullcontext()
    queues = sorted({url.rsplit("/", 1)[-1] for _, url in resolved})
    listed = invocations(app, resolved[0][0].name, "lambda")
    return listed.invocation(delivery, queues, concurrency)


def _deadline(remaining: float | None, read_at: float) -> float | None:
    """The loop time after which no record starts (None: no deadline); refuses a
    function whose whole timeout is within ``HAZE_SQS_MARGIN``."""
    from haze.driver_api import ConfigError, env_duration

    margin = env_duration("HAZE_SQS_MARGIN", 5.0)
    if remaining is None:
        return None
    if remaining <= margin:
        raise ConfigError(
            f"haze_lambda.sqs_handler: the function's timeout ({remaining:.1f}s left at the "
            f"start of the invocation) is at or below HAZE_SQS_MARGIN ({margin:g}s), so every "
            "record would be handed back for ever; raise the function's timeout above the "
            "margin, or lower HAZE_SQS_MARGIN"
        )
    return read_at + remaining - margin


async def _run_records(
    app: App,
    delivery: Delivery,
    records: list[dict[str, Any]],
    resolved: list[tuple[SqsRecords, str]],
    deadline: float | None,
) -> tuple[list[str], set[str]]:
    """What became of each record (``_SETTLED``, ``_KEPT``, ``_UNRUN``), in order, and
    the message ids whose receive ``_charge`` noted as unused."""
    drivers = list({id(d): d for d, _ in resolved}.values())
    fifo = any(d.fifo for d in drivers)
    unused = await _unused_counts(app, records)
    # unread counts are not charged: taking a charge back would write over them
    starts = await _charge(app, records, unused) if unused else [None] * len(records)
    unused = unused or [0] * len(records)
    noted = {str(r.get("messageId")) for r, s in zip(records, starts, strict=True) if s}

    async def one(
        item: tuple[dict[str, Any], tuple[SqsRecords, str], int, _Started | None],
    ) -> str:
        record, (driver, url), n, started = item
        try:
            return await _run_record(delivery, record, driver, url, deadline, n, started)
        except Exception:
            log.exception(
                "haze_lambda: record %s could not be settled; %s",
                record.get("messageId"),
                "reporting it and the rest of the batch" if fifo else "reporting it as failed",
            )
            return _KEPT

    beat = None
    beating = [True]  # ends the heartbeat even if a client swallows its cancellation
    if drivers:
        beat = asyncio.ensure_future(
            delivery.keep_leases(
                min(d.heartbeat_interval for d in drivers),
                lambda e: log.warning("haze_lambda: heartbeat failed: %s", e),
                alive=lambda: beating[0],
            )
        )
    concurrency = max((d.concurrency for d in drivers), default=1)
    try:
        # FIFO: in order, and after the first reported record the rest of the batch is
        # reported unprocessed, as AWS requires for FIFO triggers.
        async with _listed(app, delivery, resolved, concurrency):
            kinds = await delivery.run_batch(
                list(zip(records, resolved, unused, starts, strict=True)),
                one,
                concurrency=concurrency,
                stop=(lambda kind: kind != _SETTLED) if fifo else None,
            )
    finally:
        beating[0] = False
        if beat is not None:
            beat.cancel()
            await asyncio.gather(beat, return_exceptions=True)
    return kinds + [_UNRUN] * (len(records) - len(kinds)), noted


async def _handle(
    app: App, event: dict[str, Any], remaining: float | None, read_at: float
) -> dict[str, Any]:
    from haze.driver_api import Delivery

    deadline = _deadline(remaining, read_at)
    records: list[dict[str, Any]] = list(event.get("Records") or [])
    resolved = [_connection_for(app, r.get("eventSourceARN", "")) for r in records]
    await _check_visibility(resolved)
    delivery = Delivery(app.manager)
    kinds, noted = await _run_records(app, delivery, records, resolved, deadline)
    await _hand_back(
        app,
        [
            (r, d, url)
            for r, (d, url), kind in zip(records, resolved, kinds, strict=True)
            if kind == _UNRUN
        ],
        noted,
    )
    reported = [r["messageId"] for r, kind in zip(records, kinds, strict=True) if kind != _SETTLED]
    log.info("haze_lambda: %d record(s): %s", len(records), dict(delivery.outcomes))
    return {"batchItemFailures": [{"itemIdentifier": m} for m in reported]}


def sqs_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Lambda handler for an SQS trigger; returns the partial batch response."""
    # read before the app boots: a cold start's boot is part of the invocation's time
    remaining, read_at = _remaining(context), time.monotonic()
    return run(lambda app: _handle(app, event, remaining, read_at))
