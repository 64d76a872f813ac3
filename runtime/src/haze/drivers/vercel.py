"""The ``vercel`` driver (``haze-jobs[vercel]``): Vercel Queues through the official
``vercel-queue`` SDK, consumed by a Vercel function (push) or by any worker (poll).

Configuration (``config/queue.py``)::

    "vercel": {"driver": "vercel", "topic": "haze-{queue}", "consumer_group": "haze",
               "region": "iad1",            # default: VERCEL_REGION, else iad1
               "token": env("VERCEL_QUEUE_TOKEN"),   # outside Vercel (OIDC on Vercel)
               "base_url": None,            # the Queue API (default: the hosted one)
               "retry_after": "5m",         # the lease taken on each message (30 s-1 h)
               "retention": "7d",           # how long a message is kept (1 min-7 d)
               "hops": True,                # delays past the cap go in hops
               "failed_store": "main"}      # a database connection or a cache store

**Topics.** The haze queue ``q`` is the topic ``topic.format(queue=q)``, the queue name
escaped the SDK's reversible way (``sanitize_name``: Vercel topic names are
``[A-Za-z0-9_-]+``), so every haze queue name has a topic of its own. Every consumer
reads the topics as the one ``consumer_group``.

**Attempts.** The service counts deliveries per consumer group (``delivery_count``) but
never changes a message, so the attempt is ``envelope "attempts" + delivery_count``. A
retry sets the message's visibility to the job's backoff (the next delivery counts one
more). ``job.release()`` must not use a try: it sends a NEW message whose envelope
carries ``attempts = attempt - 1`` and acknowledges the delivered one. A backoff longer
than the service's one-hour visibility is re-sent the same way with ``attempts =
attempt``. A killed worker's message comes back when its lease runs out, with one more
delivery, which counts as the lost attempt.

**Delays.** The service holds a message until it is due for at most its retention (7
days); the driver keeps an hour of it (half, under 2 h) to run the job. A longer delay
is sent for that long with ``meta.due`` in the envelope; a consumer that receives it
before it is due sends it on (the time left, up to one hop) and acknowledges it.
``"hops": False`` refuses such a delay at dispatch with ``DelayTooLongError``.

**Duplicates.** Each send carries an idempotency key of its own, and the driver sends
again (3 tries) with the same key when the answer is lost or the service is busy: the
service keeps one message. Its dedup (a 24-hour window, identical bodies only) does not
fit ``unique`` jobs, whose lock lasts until the job finishes and whose repeat may carry
another payload, nor a failed job queued again, so those locks stay in the app's store.

**Failed jobs.** The service keeps none: ``failed_store`` names a database connection or
a cache store (as for sqs and cloudflare); without it they stay in this process's memory
and a warning says so.

**Sizes.** ``max_message_size`` (default 4 MiB, which keeps a push callback under a
Vercel function's 4.5 MB request limit; at most the service's 100 MB less 48 bytes kept
for the ``attempts`` and ``meta.due`` the driver may add) refuses larger bodies at
dispatch with ``PayloadTooLargeError``.

**What the API does not say.** It has no queue depth, no list of messages, no purge and
no lookup by job id: ``size()`` raises ``QueueCountUnavailableError`` (declared by the
``UncountedQueues`` capability, which ``queue_check``, ``queue:monitor`` and the
dashboard read to say so), and ``purge()`` drains what is visible to the group now.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import re
import string
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

from haze._base.deps import require
from haze._base.errors import (
    BackendUnavailableError,
    ConfigError,
    DelayTooLongError,
    PayloadTooLargeError,
    QueueCountUnavailableError,
)
from haze._base.message import Message, decode
from haze._failed import failed_store
from haze.contracts.driver import (
    Concurrent,
    DeclaresOptions,
    DelayStep,
    FailedJob,
    FailedJobStore,
    Interruptible,
    Leased,
    QueueNameRules,
    Reserved,
    UncountedQueues,
)
from haze.drivers._hops import due_of
from haze.drivers._hops import rewrite_hop as rewrite
from haze.drivers._parts import side_by_side
from haze.drivers._vercel_message import _Body
from haze.drivers._vercel_send import lost_answer, may_have_landed

__all__ = [
    "DEFAULT_MAX_MESSAGE_SIZE",
    "MAX_RETENTION",
    "MAX_VISIBILITY",
    "SERVICE_MAX_MESSAGE_SIZE",
    "VercelDriver",
    "VercelReceipt",
]

log = logging.getLogger("haze.vercel")

#: The longest the service keeps a message (and so the longest delay it holds).
MAX_RETENTION = 7 * 24 * 3600
MIN_RETENTION = 60
#: The longest lease (visibility timeout) the service grants.
MAX_VISIBILITY = 3600
MIN_VISIBILITY = 1
#: The service's message size limit (100 MB).
SERVICE_MAX_MESSAGE_SIZE = 100_000_000
#: The default ``max_message_size``: 4 MiB, so a push callback's body stays under the
#: 4.5 MB request limit of a Vercel function.
DEFAULT_MAX_MESSAGE_SIZE = 4 * 1024 * 1024
#: Bytes kept free at dispatch for the ``attempts`` and ``meta.due`` a re-send adds.
_HEADROOM = 48
#: Of a message's retention, what is kept to run it once due (half, under 2 h).
_RUN_MARGIN = 3600
#: A message this close to its ``due`` time counts as due (delays are whole seconds).
_DUE_TOLERANCE = 1.0
_TOPIC = re.compile(r"[A-Za-z0-9_-]+")
#: Region ids (``iad1``, ``sfo1``), as the SDK checks them.
_REGION = re.compile(r"[a-z]{2,5}[0-9]{1,2}")
_POLL_SLEEP, _POLL_MAX_SLEEP = 0.05, 1.0
_SEND_TRIES = 3


def _sdk() -> Any:
    return require("vercel.queue", what="the vercel driver", extra="vercel", package="vercel-queue")


@dataclass(slots=True)
class VercelReceipt:
    """The driver's token on a delivered message (``Reserved.token``): the SDK message
    (its metadata holds the receipt handle) and the client that settles it."""

    message: Any
    client: Any
    #: Delivered by a push callback: a retry is left to the SDK (``RetryAfter``), which
    #: applies it once it has stopped renewing the lease.
    push: bool = False
    #: The visibility a push retry asks for (seconds), set by ``release``.
    retry_delay: int | None = None


def check_template(name: str, template: str) -> str:
    """``template``, refused unless it makes one topic per haze queue (without ``{queue}``
    a worker of one queue would run another's jobs)."""
    key = f"connections.{name}.topic"
    hint = "use letters, digits, '-', '_' and {queue} once, e.g. \"haze-{queue}\""
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as e:
        raise ConfigError(f"{template!r} is not a topic template ({e}); {hint}", key=key) from e
    fields = [(field, spec, conv) for _, field, spec, conv in parts if field is not None]
    for field, spec, conv in fields:
        if field != "queue" or spec or conv:
            bad = f"{{{field}}}" if field != "queue" else "a format spec on {queue}"
            raise ConfigError(f"{template!r} has {bad}, which haze cannot fill; {hint}", key=key)
    literal = "".join(text for text, *_ in parts)
    if len(fields) != 1 or (literal and not _TOPIC.fullmatch(literal)):
        raise ConfigError(
            f"{template!r} must hold {{queue}} exactly once, so each haze queue has a topic "
            f"of its own, and only topic characters around it; {hint}",
            key=key,
        )
    return template


class VercelDriver(
    Interruptible, Leased, DelayStep, Concurrent, QueueNameRules, UncountedQueues, DeclaresOptions
):
    """Vercel Queues; see the module docstring for the rules."""

    options: ClassVar[dict[str, str]] = {
        "topic": "str",
        "consumer_group": "str",
        "region": "str",
        "token": "str",
        "base_url": "str",
        "retry_after": "duration",
        "retention": "duration",
        "hops": "bool",
        "failed_store": "str",
    }
    remote = True
    local_callbacks = False
    inline = False
    #: delays, backoffs and leases are whole seconds
    delay_step = 1.0
    counts_note = (
        "the Vercel Queues API tells no queue depth (no ready, delayed or running count) "
        "and lists no message: see the deployment's Queues tab on vercel.com"
    )

    def __init__(self, name: str, options: dict[str, Any], app: Any = None) -> None:
        self.name = name
        self.app = app
        self.config = options
        self.topic_template: str = check_template(name, options.get("topic") or "haze-{queue}")
        self.consumer_group: str = options.get("consumer_group") or "haze"
        self.retry_after = self._seconds("retry_after", 300, MIN_VISIBILITY, MAX_VISIBILITY)
        self.retention = self._seconds("retention", MAX_RETENTION, MIN_RETENTION, MAX_RETENTION)
        self.hops: bool = options.get("hops") is not False
        self.run_margin = min(_RUN_MARGIN, self.retention // 2)
        self.max_delay: float = float(self.retention - self.run_margin)
        limit = SERVICE_MAX_MESSAGE_SIZE - _HEADROOM
        size = options.get("max_message_size")
        if size is not None and size > limit:
            raise ConfigError(
                f"is {size} bytes, over the 100 MB ({SERVICE_MAX_MESSAGE_SIZE} bytes) limit of "
                f"Vercel Queues less {_HEADROOM} bytes haze keeps for re-sends; use {limit} "
                "or less",
                key=f"connections.{name}.max_message_size",
            )
        self.max_message_size: int | None = size or DEFAULT_MAX_MESSAGE_SIZE
        self.concurrency: int = options.get("concurrency") or 1
        self.heartbeat_interval: float = self.retry_after / 3  # a 1 s lease: every 0.33 s
        sdk = _sdk()  # fails here, naming haze-jobs[vercel], when the SDK is missing
        #: the SDK's "cannot reach the Queue API" and "the service is overloaded / broken"
        self.outage_errors: tuple[type[BaseException], ...] = (
            sdk.CommunicationError,
            sdk.ThrottledError,
            sdk.InternalServerError,
        )
        self._failed: FailedJobStore | None = None
        self._client: Any = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._sleep = _POLL_SLEEP
        #: The wall clock (seconds since the epoch); tests may replace it.
        self.clock = time.time

    def _seconds(self, key: str, default: int, low: int, high: int) -> int:
        raw = self.config.get(key)
        value = default if raw is None else math.ceil(float(raw))
        if not low <= value <= high:
            raise ConfigError(
                f"must be between {low}s and {high}s on Vercel Queues, got {value}s",
                key=f"connections.{self.name}.{key}",
            )
        return value

    def __repr__(self) -> str:
        return f"<VercelDriver {self.name!r} topic={self.topic_template!r}>"

    # -- the SDK client -------------------------------------------------------------

    def _settings(self) -> dict[str, Any]:
        """The client's token, region and URL, refused in one line when they cannot be
        found outside Vercel (on Vercel the SDK takes an OIDC token and the region)."""
        on_vercel = os.environ.get("VERCEL") == "1"
        token = (
            self.config.get("token")
            or os.environ.get("VERCEL_QUEUE_TOKEN")
            or os.environ.get("VERCEL_OIDC_TOKEN")
        )
        base_url = self.config.get("base_url") or os.environ.get("VERCEL_QUEUE_BASE_URL")
        region = self.config.get("region") or os.environ.get("VERCEL_REGION")
        key = f"connections.{self.name}"
        if not on_vercel and not token:
            raise ConfigError(
                "outside Vercel the vercel driver needs a token: set token, or "
                "VERCEL_QUEUE_TOKEN, or VERCEL_OIDC_TOKEN (`vercel env pull`)",
                key=f"{key}.token",
            )
        if not on_vercel and not base_url and not region:
            raise ConfigError(
                "outside Vercel the vercel driver needs where the Queue API is: set region "
                "(the one the producers send to, e.g. iad1) or base_url",
                key=f"{key}.region",
            )
        if region and not _REGION.fullmatch(region):
            raise ConfigError(
                f"{region!r} is not a Vercel region id (iad1, sfo1)", key=f"{key}.region"
            )
        if base_url and not re.match(r"https?://[^/\s]+", base_url):
            raise ConfigError(
                f"{base_url!r} is not an http(s) URL; use e.g. https://iad1.vercel-queue.com",
                key=f"{key}.base_url",
            )
        settings: dict[str, Any] = {"region": region or "iad1", "token": token or None}
        if base_url:
            settings["base_url"] = base_url
        return settings

    def client(self) -> Any:
        """The SDK's ``QueueClient`` for this event loop (its HTTP pool is per loop)."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            sdk = _sdk()
            self._client = sdk.QueueClient(deployment=sdk.ALL_DEPLOYMENTS, **self._settings())
            self._client_loop = loop
        return self._client

    def topic(self, queue: str) -> Any:
        """The SDK topic of haze queue ``queue``."""
        return _sdk().Topic(self.topic_name(queue), transport=_Body())

    def topic_name(self, queue: str) -> str:
        """The topic of haze queue ``queue``: the SDK's reversible escape of the name
        (``bt_jobq`` → ``bt__jobq``, ``ténant`` → ``t_E9nant``) in the template."""
        name = self.topic_template.format(queue=str(_sdk().sanitize_name(queue)))
        if not _TOPIC.fullmatch(name):
            raise ValueError(
                f"queue {queue!r} makes the topic {name!r}, which Vercel Queues refuses "
                "(letters, digits, '-' and '_' only); fix the connection's topic template"
            )
        return name

    def check_queue(self, queue: str) -> None:
        self.topic_name(queue)

    @property
    def failed(self) -> FailedJobStore:
        if self._failed is None:
            self._failed = failed_store(self.name, self.config.get("failed_store"), self.app, log)
        return self._failed

    # -- producing --------------------------------------------------------------------

    def _delay(self, delay: float, message: Message) -> tuple[int, float | None]:
        """Whole seconds to hold a message, and its ``meta.due`` when it goes in hops."""
        seconds = max(0, math.ceil(delay - 1e-9)) if delay > 0 else 0
        if seconds <= self.max_delay:
            return seconds, None
        if not self.hops:
            raise DelayTooLongError(
                f'job "{message.job}": a delay of {delay:g}s is over the {self.max_delay:g}s '
                f'cap of connection "{self.name}" (Vercel Queues keeps a message '
                f"{self.retention}s, less {self.run_margin}s to run it) and hops are off; set "
                '"hops": True or dispatch it later (nothing was enqueued)'
            )
        return int(self.max_delay), self.clock() + delay

    def _check_size(self, body: str, message: Message, limit: int) -> bytes:
        raw = body.encode("utf-8")
        if len(raw) > limit:
            raise PayloadTooLargeError(
                f'job "{message.job}": the message is {len(raw)} bytes, over the {limit}-byte '
                f'limit of connection "{self.name}" (Vercel Queues takes at most 100 MB); '
                "pass ids instead of data (nothing was enqueued)"
            )
        return raw

    async def _send(self, queue: str, raw: bytes, delay: int, job_id: str | None = None) -> None:
        """One send, repeated (up to 3 tries) when the answer is lost or the service is
        busy; every try carries the same idempotency key, so the service keeps one. A
        send of job ``job_id`` whose tries all failed after one may have stored it
        raises ``DispatchOutcomeUnknownError`` (``_vercel_send``)."""
        key = f"haze-{uuid.uuid4().hex}"
        landed = False
        for left in range(_SEND_TRIES - 1, -1, -1):
            try:
                await self.client().send(
                    self.topic(queue),
                    raw,
                    idempotency_key=key,
                    retention=timedelta(seconds=self.retention),
                    delay=timedelta(seconds=delay) if delay else None,
                )
                return
            except self.outage_errors as e:
                landed = landed or may_have_landed(e, _sdk())
                if left:
                    await asyncio.sleep(0.2 * (_SEND_TRIES - left))
                    continue
                if not landed or job_id is None:
                    raise
                topic = self.topic_name(queue)
                raise lost_answer(self.name, job_id, topic, _SEND_TRIES, e) from None

    async def enqueue(self, body: str, message: Message, delay: float) -> None:
        await self._enqueue(body, message, delay)

    async def _enqueue(self, body: str, message: Message, delay: float) -> None:
        topic = self.topic_name(message.queue)
        del topic  # refused before anything is sent
        seconds, due = self._delay(delay, message)
        raw = self._check_size(body, message, self.max_message_size or DEFAULT_MAX_MESSAGE_SIZE)
        if due is not None:
            raw = rewrite(body, due=due).encode("utf-8")
        await self._send(message.queue, raw, seconds, message.id)

    async def enqueue_many(self, items: Sequence[tuple[str, Message, float]]) -> None:
        """One send per message (the Queue API has no batch send), the sizes and delays
        of all checked first so a refused one sends none.

        A topic's messages go one after the other, in the order given: the service
        stores them in the order their sends arrive, so sends in flight together could
        put a batch's later members ahead of its first (a worker of concurrency 1 then
        runs them first). Topics are sent to side by side; a send that fails stops its
        topic's later ones, which would otherwise overtake it. When some were sent, the
        others are raised in one ``DispatchIncompleteError``, each with its id."""
        by_topic: dict[str, list[tuple[str, Message, float]]] = {}
        for body, message, delay in items:
            topic = self.topic_name(message.queue)
            self._delay(delay, message)
            self._check_size(body, message, self.max_message_size or DEFAULT_MAX_MESSAGE_SIZE)
            by_topic.setdefault(topic, []).append((body, message, delay))
        await side_by_side(list(by_topic.values()), self._enqueue, self.name)

    async def resend(self, job: Reserved, delay: float, attempts: int) -> None:
        """Send ``job`` again as a new message carrying ``attempts`` tries used (a
        release, a backoff past the lease limit, a hop). Sent before the old one is
        acknowledged: a crash in between runs the job twice rather than never."""
        seconds = max(0, math.ceil(delay - 1e-9)) if delay > 0 else 0
        due = None
        if seconds > self.max_delay:
            seconds, due = int(self.max_delay), self.clock() + delay
        body = rewrite(job.body, attempts=attempts, due=due)
        await self._send(job.queue, body.encode("utf-8"), seconds)

    # -- consuming --------------------------------------------------------------------

    def reserved(self, message: Any, client: Any, queue: str | None = None) -> Reserved:
        """A ``Reserved`` for one SDK message (a poll's of ``queue``, or a push callback's);
        a body that names no queue keeps the one its topic is of."""
        raw = message.payload
        count = int(message.metadata.delivery_count or 1)
        token = VercelReceipt(message, client)
        error: BaseException | None = None
        decoded: Message | None = None
        try:
            body = raw.decode("utf-8") if isinstance(raw, (bytes, bytearray)) else str(raw)
        except UnicodeDecodeError as e:
            body, error = bytes(raw).decode("utf-8", "replace"), e
        if error is None:
            try:
                decoded = decode(body)
            except Exception as e:
                error = e
        offset = decoded.attempts if decoded is not None else 0
        if decoded is not None:
            queue = decoded.queue
        elif queue is None:
            topic = message.metadata.topic
            known = self.config.get("queues") or ["default"]
            queue = next((q for q in known if self.topic_name(q) == topic), "default")
        return Reserved(decoded, offset + count, body, queue, token, error)

    async def admit(self, job: Reserved) -> Reserved | None:
        """``job``, or None when it is a hop not due yet (sent on and acknowledged)."""
        due = due_of(job.message)
        if due is None:
            return job
        left = due - self.clock()
        if left <= _DUE_TOLERANCE:
            return job
        await self.resend(job, left, job.message.attempts if job.message else 0)
        await self._ack(job)
        return None

    def _stop_event(self) -> asyncio.Event:
        if self._stop is None:
            self._stop = asyncio.Event()
        return self._stop

    def interrupt(self) -> None:
        if self._stop is not None:
            self._stop.set()

    async def _poll(self, queue: str) -> Reserved | None:
        client = self.client()
        for _ in range(10):  # past hops that are not due yet
            got = None
            async for delivery in client.poll(
                self.topic(queue), self.consumer_group, limit=1, lease_duration=self.retry_after
            ):
                got = self.reserved(delivery.accept(), client, queue)
            if got is None:
                return None
            job = await self.admit(got)
            if job is not None:
                return job
        return None

    async def reserve(self, queues: Sequence[str], wait: float) -> Reserved | None:
        """Poll the topics in priority order; the Queue API does not long-poll, so an
        idle wait polls again every 50 ms, slowing to once a second."""
        queues = list(queues) or list(self.config.get("queues") or ["default"])
        stop = self._stop_event()
        stop.clear()
        deadline = time.monotonic() + max(0.0, wait)
        while True:
            for queue in queues:
                job = await self._poll(queue)
                if job is not None:
                    self._sleep = _POLL_SLEEP
                    return job
            left = deadline - time.monotonic()
            if left <= 0 or stop.is_set():
                return None
            try:
                await asyncio.wait_for(stop.wait(), min(left, self._sleep))
            except TimeoutError:
                pass
            self._sleep = min(_POLL_MAX_SLEEP, self._sleep * 2)

    # -- settling ---------------------------------------------------------------------

    @staticmethod
    def _receipt(job: Reserved) -> VercelReceipt:
        token = job.token
        if not isinstance(token, VercelReceipt):
            raise TypeError("this message was not delivered by Vercel Queues")
        return token

    async def _ack(self, job: Reserved) -> bool:
        receipt = self._receipt(job)
        sdk = _sdk()
        try:
            await receipt.client.acknowledge(receipt.message)
        except (sdk.MessageLeaseExpiredError, sdk.MessageNotInFlightError):
            return False  # the lease ran out: another consumer has the message now
        return True

    async def ack(self, job: Reserved) -> bool:
        return await self._ack(job)

    async def release(self, job: Reserved, delay: float, *, consume_attempt: bool) -> bool:
        seconds = max(0, math.ceil(delay - 1e-9)) if delay > 0 else 0
        if consume_attempt and seconds <= MAX_VISIBILITY:
            receipt = self._receipt(job)
            if receipt.push:
                receipt.retry_delay = seconds
            else:
                await receipt.client.retry_after(receipt.message, timedelta(seconds=seconds))
            return True
        # job.release() (no try used), or a backoff past the longest lease: a new message
        used = job.attempt if consume_attempt else max(0, job.attempt - 1)
        await self.resend(job, delay, used)
        return await self._ack(job)

    async def fail(self, job: Reserved, failed: FailedJob) -> bool:
        await self.failed.record(failed)
        return await self._ack(job)

    async def heartbeat(self, jobs: Sequence[Reserved]) -> None:
        for job in jobs:
            receipt = self._receipt(job)
            try:
                await receipt.client.extend_lease(
                    receipt.message, timedelta(seconds=self.retry_after)
                )
            except Exception as e:  # the lease is gone: the ack will say so
                log.debug("lease of %s not renewed: %s", job.queue, e)

    # -- inspection -------------------------------------------------------------------

    async def size(self, queue: str) -> int:
        raise QueueCountUnavailableError(
            f'connection "{self.name}" ({self.topic_name(queue)}): {self.counts_note}'
        )

    async def probe(self, queue: str) -> None:
        """Renew the lease of a message no one sent: the service answers "not found"
        and nothing changes (the Queue API has no read-only call)."""
        sdk = _sdk()
        meta = sdk.MessageMetadata(
            message_id="haze-probe", delivery_count=1, created_at=datetime.now(UTC),
            topic=self.topic_name(queue), consumer_group=sdk.sanitize_name(self.consumer_group),
            receipt_handle="haze-probe",
        )  # fmt: skip
        try:
            await self.client().extend_lease(meta, timedelta(seconds=MIN_VISIBILITY))
        except (sdk.MessageNotFoundError, sdk.MessageLockedError):
            return
        except self.outage_errors as e:
            raise BackendUnavailableError(
                f'connection "{self.name}": the Vercel Queues API is unavailable ({e})'
            ) from e

    async def purge(self, queue: str) -> int:
        """Acknowledge every message of ``queue``'s topic visible to the consumer group
        now (delayed and running ones stay: the API has no purge)."""
        client, n = self.client(), 0
        while True:
            got = 0
            async for delivery in client.poll(
                self.topic(queue), self.consumer_group, limit=10, lease_duration=MIN_VISIBILITY
            ):
                await client.acknowledge(delivery.accept())
                got += 1
            n += got
            if not got:
                return n

    async def close(self) -> None:
        self._client = None
