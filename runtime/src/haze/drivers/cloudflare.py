"""The ``cloudflare`` driver: Cloudflare Queues, inside a Worker and from anywhere else.

One haze connection is one Cloudflare queue; the haze queue name (``emails``…) travels
in the message, so every haze queue dispatched to the connection shares that queue.

Producers
    Inside a Python Worker (``haze_cloudflare`` installed and the Worker's ``env`` bound
    with ``haze_cloudflare.bind_env`` — ``QueueWorker`` does it), messages go through the
    Queue binding: ``env[binding].send(body, {delaySeconds, contentType: "json"})`` and
    ``sendBatch`` for ``Queue.bulk``. Anywhere else (``haze-jobs[cloudflare]``: httpx) they go
    through the REST API with ``account_id``, ``queue_id`` and ``api_token``:
    ``POST …/queues/{id}/messages`` and ``…/messages/batch``.
Limits
    A delay over 12 hours (43200 s) raises ``DelayTooLongError`` at dispatch, naming the
    limit; nothing is enqueued. Delays are whole seconds (rounded up). A body over 128 KB
    (``max_message_size`` overrides) raises ``PayloadTooLargeError``. A retry backoff or a
    ``job.release(delay)`` over 12 hours is capped at 12 hours with a warning.
Consumers
    In a Worker, ``haze_cloudflare.QueueWorker.queue()`` turns each delivered message into
    a ``Reserved`` whose token is the message; ``ack``/``release``/``fail`` below settle it:
    success → ``message.ack()``; retry → ``message.retry(delaySeconds=backoff)`` (Cloudflare
    counts the attempt); ``job.release()`` → a *new* message carrying the attempts used so
    far (envelope ``attempts``), then ``ack()`` of the old one, so no try is consumed; final
    failure → the failed store, then ``ack()``.
    Outside a Worker, ``haze queue:work --connection cloudflare`` is an HTTP pull consumer:
    ``POST …/messages/pull`` (``batch_size``, ``visibility_timeout_ms``) and
    ``POST …/messages/ack`` (``acks`` and ``retries`` with ``delay_seconds``). Pulled JSON
    bodies arrive base64-encoded. A message's attempt number is Cloudflare's ``attempts``
    plus the envelope's ``attempts`` offset.
Failed jobs
    ``failed_store`` names a database connection (its ``failed_jobs`` table: D1 through the
    binding in a Worker, D1 REST or any SQL database elsewhere) or a cache store
    (``haze._failed.failed_store``; a bare name that is both is the database). Without
    it, failures are kept in memory (lost with the isolate) and a warning says so.
    Messages that exhaust the queue's own ``max_retries`` go to its dead-letter queue, not
    to the failed store: keep ``max_retries`` >= ``tries - 1``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Protocol

from haze._base import plugins
from haze._base.errors import ConfigError, DelayTooLongError, HazeError
from haze._base.http import LoopClient
from haze._base.message import Message, envelope_of
from haze._failed import failed_store
from haze.contracts.driver import (
    CappedDelay,
    Concurrent,
    DelayStep,
    FailedJob,
    FailedJobStore,
    Interruptible,
    MaxDelay,
    Reserved,
)
from haze.drivers._parts import Item, in_parts
from haze.drivers.context import DriverContext

__all__ = [
    "API_URL",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "MAX_DELAY_SECONDS",
    "CloudflareDriver",
    "CloudflareError",
    "Delivery",
    "Producer",
    "RestClient",
    "decode_pulled_body",
    "delay_seconds",
    "register_binding_producer",
]

log = logging.getLogger("haze.drivers.cloudflare")

#: Cloudflare Queues hold a delayed message (or a retry) at most 12 hours.
MAX_DELAY_SECONDS = 12 * 60 * 60
#: Cloudflare Queues accept messages up to 128 KB: 128,000 bytes, not 128 KiB (workerd's
#: queue broker refuses a 128,001-byte body), so a body between the two is offloaded or
#: refused by haze rather than failing at the queue.
DEFAULT_MAX_MESSAGE_SIZE = 128_000
#: sendBatch / messages/batch: at most 100 messages and 256 KB (256,000 bytes) per call.
MAX_BATCH_MESSAGES = 100
MAX_BATCH_BYTES = 256_000
API_URL = "https://api.cloudflare.com/client/v4"

Json = dict[str, Any]


class CloudflareError(HazeError):
    """The Cloudflare API refused a request or could not be reached (never shows the token)."""

    def __init__(self, message: str, *, status: int | None = None):
        self.status = status
        super().__init__(message if status is None else f"HTTP {status}: {message}")


# --------------------------------------------------------------------------- protocols


class Producer(Protocol):
    """Puts bodies on one Cloudflare queue (the binding in a Worker, or the REST API)."""

    async def send(self, body: Json, delay: int) -> None: ...

    async def send_batch(self, items: Sequence[tuple[Json, int]]) -> None: ...


class Delivery(Protocol):
    """One delivered message, settled exactly once: the token of a cloudflare ``Reserved``."""

    async def ack(self) -> None: ...

    async def retry(self, delay: int) -> None: ...


#: The plugin (group ``haze.bindings``, name ``cloudflare``) that reaches a Worker's Queue
#: bindings: binding name -> a producer, or None when no Worker env with that binding is
#: bound (then the REST API is used). The Cloudflare adapter provides it.
BINDINGS_GROUP = plugins.BINDINGS


def register_binding_producer(fn: Callable[[str], Producer | None]) -> None:
    """Install the Worker-binding producer lookup in this process (before the plugin's
    entry point)."""
    plugins.register(BINDINGS_GROUP, "cloudflare", fn)


def _binding_lookup() -> Callable[[str], Producer | None] | None:
    lookup: Callable[[str], Producer | None] | None = plugins.find(BINDINGS_GROUP, "cloudflare")
    return lookup


# --------------------------------------------------------------------------- helpers


def delay_seconds(delay: float, connection: str, *, cap: bool = False) -> int:
    """A delay in whole seconds for Cloudflare (rounded up).

    Over 12 hours: ``DelayTooLongError`` naming the limit, or (``cap=True``, for retries
    and releases) 12 hours and a warning.
    """
    if delay <= 0:
        return 0
    seconds = math.ceil(delay - 1e-9)
    if seconds > MAX_DELAY_SECONDS:
        if not cap:
            raise DelayTooLongError(
                f'connection "{connection}": a delay of {delay:g}s is over the 12-hour '
                f"({MAX_DELAY_SECONDS} s) limit of Cloudflare Queues; nothing was enqueued. "
                "Dispatch it later (e.g. from a scheduled job) or use another connection."
            )
        log.warning(
            'connection "%s": a retry/release delay of %gs is over the 12-hour limit of '
            "Cloudflare Queues; using %d s",
            connection,
            delay,
            MAX_DELAY_SECONDS,
        )
        return MAX_DELAY_SECONDS
    return seconds


def decode_pulled_body(body: Any, metadata: Json | None = None) -> str:
    """The JSON text of a message pulled over HTTP.

    Messages sent with ``content_type: "json"`` come back base64-encoded; ``text`` ones as
    they were sent. Objects (a server that returns them parsed) are re-encoded.
    """
    if isinstance(body, (dict, list)):
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    if isinstance(body, (bytes, bytearray)):
        return bytes(body).decode("utf-8")
    if not isinstance(body, str):
        return json.dumps(body)
    kind = str((metadata or {}).get("CF-Content-Type") or "").lower()
    stripped = body.strip()
    if kind != "text" and stripped and stripped[0] not in '{["':
        try:
            raw = base64.b64decode(stripped + "=" * (-len(stripped) % 4), validate=True)
            text = raw.decode("utf-8")
            json.loads(text)
            return text
        except (ValueError, UnicodeDecodeError):
            pass
    return body


def _body_dict(body: str) -> Json:
    data = envelope_of(body)
    if data is None:
        raise TypeError("a haze message body is a JSON object")
    return data


def _chunks(items: Sequence[tuple[Json, int]]) -> list[list[tuple[Json, int]]]:
    """Split for sendBatch: at most 100 messages and about 256 KB per call."""
    out: list[list[tuple[Json, int]]] = []
    current: list[tuple[Json, int]] = []
    size = 0
    for item in items:
        n = len(json.dumps(item[0], separators=(",", ":"), ensure_ascii=False).encode()) + 64
        if current and (len(current) >= MAX_BATCH_MESSAGES or size + n > MAX_BATCH_BYTES):
            out.append(current)
            current, size = [], 0
        current.append(item)
        size += n
    if current:
        out.append(current)
    return out


# --------------------------------------------------------------------------- REST


class RestClient:
    """The Cloudflare Queues REST API for one queue (httpx; ``Authorization: Bearer``)."""

    def __init__(
        self,
        account_id: str,
        queue_id: str,
        api_token: str,
        api_url: str = API_URL,
        timeout: float = 30.0,
    ):
        self._http = LoopClient(
            what="the cloudflare driver outside a Worker (REST API)",
            extra="cloudflare",
            timeout=timeout,
            headers={"authorization": f"Bearer {api_token}", "content-type": "application/json"},
        )
        self.base = f"{api_url.rstrip('/')}/accounts/{account_id}/queues/{queue_id}"
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"<RestClient {self.base}>"

    async def post(self, path: str, payload: Json) -> Any:
        url = self.base + path
        try:
            response = await self._http.get().post(url, json=payload)
        except self._http.httpx.HTTPError as e:
            raise CloudflareError(f"cannot reach {url} ({type(e).__name__}: {e})") from e
        try:
            data = response.json()
        except ValueError:
            data = None
        if response.status_code >= 400 or not isinstance(data, dict) or not data.get("success"):
            errors = data.get("errors") if isinstance(data, dict) else None
            detail = (
                "; ".join(
                    f"{e.get('code', '')} {e.get('message', '')}".strip()
                    for e in errors or []
                    if isinstance(e, dict)
                )
                or response.text[:300]
            )
            raise CloudflareError(f"POST {url}: {detail}", status=response.status_code)
        return data.get("result")

    async def send(self, body: Json, delay: int) -> None:
        msg: Json = {"body": body, "content_type": "json"}
        if delay:
            msg["delay_seconds"] = delay
        await self.post("/messages", msg)

    async def send_batch(self, items: Sequence[tuple[Json, int]]) -> None:
        for chunk in _chunks(items):
            messages = []
            for body, delay in chunk:
                m: Json = {"body": body, "content_type": "json"}
                if delay:
                    m["delay_seconds"] = delay
                messages.append(m)
            await self.post("/messages/batch", {"messages": messages})

    async def pull(self, batch_size: int, visibility_timeout_ms: int) -> Json:
        result = await self.post(
            "/messages/pull",
            {"batch_size": batch_size, "visibility_timeout_ms": visibility_timeout_ms},
        )
        return result if isinstance(result, dict) else {"messages": result or []}

    async def settle(self, acks: Sequence[str], retries: Sequence[tuple[str, int]]) -> None:
        payload: Json = {
            "acks": [{"lease_id": lease} for lease in acks],
            "retries": [
                {"lease_id": lease, "delay_seconds": delay} if delay else {"lease_id": lease}
                for lease, delay in retries
            ],
        }
        await self.post("/messages/ack", payload)

    async def purge(self) -> None:
        await self.post("/purge", {"delete_messages_permanently": True})

    async def close(self) -> None:
        await self._http.close()


class _Lease:
    """A message pulled over HTTP: settled through ``/messages/ack``."""

    __slots__ = ("client", "lease_id")

    def __init__(self, client: RestClient, lease_id: str):
        self.client = client
        self.lease_id = lease_id

    async def ack(self) -> None:
        await self.client.settle([self.lease_id], [])

    async def retry(self, delay: int) -> None:
        await self.client.settle([], [(self.lease_id, delay)])


# --------------------------------------------------------------------------- the driver


class CloudflareDriver(Interruptible, DelayStep, CappedDelay, MaxDelay, Concurrent):
    """Cloudflare Queues; see the module docstring."""

    #: the config options it takes besides the common ones (``DeclaresOptions``)
    options: ClassVar[Mapping[str, str]] = {
        "binding": "str",
        "account_id": "str",
        "queue_id": "str",
        "api_token": "str",
        "api_url": "str",
        "failed_store": "str",
        "visibility_timeout": "duration",
    }

    def cap_delay(self, delay: float) -> float:
        if delay <= MAX_DELAY_SECONDS:
            return delay
        return float(delay_seconds(delay, self.name, cap=True))

    remote = True
    #: delays are whole seconds (a retry backoff is rounded up): what logs report
    delay_step = 1.0
    #: the longest delay of one message (a workflow's longer sleep goes in hops)
    max_delay = float(MAX_DELAY_SECONDS)
    local_callbacks = False
    inline = False
    #: the REST client's unreachable-API errors are CloudflareError (not yet told apart)
    outage_errors: tuple[type[BaseException], ...] = ()

    def __init__(self, name: str, options: dict[str, Any], context: DriverContext | None = None):
        self.name = name
        self.settings = options
        self.context = context
        size = options.get("max_message_size")
        self.max_message_size: int | None = size if size is not None else DEFAULT_MAX_MESSAGE_SIZE
        self.concurrency: int = options.get("concurrency") or 1
        self.binding: str = options.get("binding") or "QUEUE"
        self.visibility_timeout: float = options.get("visibility_timeout") or 30.0
        self._rest: RestClient | None = None
        self._failed: FailedJobStore | None = None
        self._buffer: deque[Json] = deque()
        self._backlog = 0
        self._wakeup: asyncio.Event | None = None
        self._wake_loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:
        return f"<CloudflareDriver {self.name!r} binding={self.binding!r}>"

    # -- transports -----------------------------------------------------------------

    def rest(self) -> RestClient:
        """The REST client (``account_id``, ``queue_id``, ``api_token``; ``api_url``)."""
        if self._rest is None:
            needed = ("account_id", "queue_id", "api_token")
            missing = [k for k in needed if not self.settings.get(k)]
            if missing:
                raise ConfigError(
                    f"outside a Worker the cloudflare driver uses the REST API and needs "
                    f"{', '.join(missing)} (no Queue binding {self.binding!r} is bound here; "
                    "inside a Worker, bind the env with haze_cloudflare.bind_env)",
                    key=f"connections.{self.name}",
                )
            self._rest = RestClient(
                self.settings["account_id"],
                self.settings["queue_id"],
                self.settings["api_token"],
                self.settings.get("api_url") or API_URL,
            )
        return self._rest

    def producer(self) -> Producer:
        """The Queue binding inside a Worker, else the REST API."""
        lookup = _binding_lookup()
        if lookup is not None:
            p = lookup(self.binding)
            if p is not None:
                return p
        return self.rest()

    # -- failed jobs ----------------------------------------------------------------

    @property
    def failed(self) -> FailedJobStore:
        if self._failed is None:
            self._failed = failed_store(
                self.name, self.settings.get("failed_store"), self.context, log
            )
        return self._failed

    # -- producer side ----------------------------------------------------------------

    async def enqueue(self, body: str, message: Message, delay: float) -> None:
        seconds = delay_seconds(delay, self.name)
        await self.producer().send(_body_dict(body), seconds)

    async def enqueue_many(self, items: Sequence[tuple[str, Message, float]]) -> None:
        if not items:
            return
        prepared = [(_body_dict(body), delay_seconds(delay, self.name)) for body, _, delay in items]
        # One sendBatch per chunk, sent here rather than by the producer: a chunk that
        # fails after others were queued is then raised naming its messages (in_parts).
        of = {m.id: p for (_, m, _), p in zip(items, prepared, strict=True)}
        parts, start = [], 0
        for chunk in _chunks(prepared):
            parts.append(items[start : start + len(chunk)])
            start += len(chunk)
        producer = self.producer()

        async def send(part: Sequence[Item]) -> None:
            await producer.send_batch([of[m.id] for _, m, _ in part])

        await in_parts(parts, send, self.name)

    # -- settling a delivered message -------------------------------------------------

    @staticmethod
    def _delivery(job: Reserved) -> Delivery:
        token = job.token
        if token is None or not hasattr(token, "ack"):
            raise HazeError("this message was not delivered by Cloudflare Queues")
        delivery: Delivery = token
        return delivery

    # Cloudflare settles a lease it no longer grants without saying so: True throughout.

    async def ack(self, job: Reserved) -> bool:
        await self._delivery(job).ack()
        return True

    async def release(self, job: Reserved, delay: float, *, consume_attempt: bool) -> bool:
        seconds = delay_seconds(delay, self.name, cap=True)
        delivery = self._delivery(job)
        if consume_attempt:
            await delivery.retry(seconds)  # Cloudflare counts this attempt
            return True
        # job.release(): a new message that carries the tries used so far, then ack the old
        # one. Sent first: a crash in between runs the job twice rather than never.
        body = _body_dict(job.body)
        used = max(0, job.attempt - 1)
        if used:
            body["attempts"] = used
        else:
            body.pop("attempts", None)
        await self.producer().send(body, seconds)
        await delivery.ack()
        return True

    async def fail(self, job: Reserved, failed: FailedJob) -> bool:
        await self.failed.record(failed)
        await self._delivery(job).ack()
        return True

    # -- HTTP pull consumer ---------------------------------------------------------

    def _wake(self) -> asyncio.Event:
        loop = asyncio.get_running_loop()
        if self._wakeup is None or self._wake_loop is not loop:
            self._wakeup, self._wake_loop = asyncio.Event(), loop
        return self._wakeup

    def interrupt(self) -> None:
        """End an idle wait now (the worker is stopping)."""
        if self._wakeup is not None:
            self._wakeup.set()

    def reserved_from_pull(self, item: Json, client: RestClient) -> Reserved:
        """A ``Reserved`` for one message of a ``/messages/pull`` result."""
        cf_attempts = int(item.get("attempts") or 1)
        lease = _Lease(client, str(item.get("lease_id")))
        try:
            body = decode_pulled_body(item.get("body"), item.get("metadata"))
        except Exception as e:
            return Reserved.delivered(str(item.get("body")), cf_attempts, lease, e)
        return Reserved.delivered(body, cf_attempts, lease)

    async def _pull(self) -> None:
        client = self.rest()
        result = await client.pull(
            min(100, max(1, self.concurrency)), int(self.visibility_timeout * 1000)
        )
        self._backlog = int(result.get("message_backlog_count") or 0)
        for item in result.get("messages") or []:
            self._buffer.append(item)

    async def reserve(self, queues: Sequence[str], wait: float) -> Reserved | None:
        """Pull (short polling); one Cloudflare queue carries every haze queue of the
        connection, so ``queues`` does not filter here."""
        if not self._buffer:
            await self._pull()
        if not self._buffer and wait > 0:
            event = self._wake()
            event.clear()
            try:
                await asyncio.wait_for(event.wait(), wait)
            except TimeoutError:
                pass
            if not event.is_set():
                await self._pull()
        if not self._buffer:
            return None
        return self.reserved_from_pull(self._buffer.popleft(), self.rest())

    # -- inspection -----------------------------------------------------------------

    async def size(self, queue: str) -> int:
        """The backlog Cloudflare reported on the last pull (the whole queue; 0 before
        any pull): Cloudflare has no per-haze-queue count."""
        return self._backlog + len(self._buffer)

    async def purge(self, queue: str) -> int:
        """Purge the whole Cloudflare queue (every haze queue on this connection)."""
        n = self._backlog + len(self._buffer)
        await self.rest().purge()
        self._buffer.clear()
        self._backlog = 0
        return n

    async def close(self) -> None:
        if self._rest is not None:
            await self._rest.close()
