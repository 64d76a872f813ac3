"""The consumer function of a ``vercel`` connection: Vercel Queues' push mode.

Vercel calls a function for each message of the topics its trigger names (``POST`` with
the message and CloudEvent headers). :class:`QueueFunction` is that function, an ASGI
``app``: it hands the callback to the SDK's own ``accept_and_handle`` (which fetches a
header-only delivery, checks the delivery and keeps its lease while the job runs), and
a subscriber of the connection's topics runs the message through haze's consumer core.
haze settles each message itself:

- success: acknowledged;
- a retry: ``RetryAfter(backoff)``, which the SDK applies as the message's visibility
  once it has stopped renewing the lease (the next delivery counts one more try);
- ``job.release()`` (no try used), or a backoff past the one-hour lease: a new message
  carrying the tries used, and the delivered one acknowledged;
- final failure: the failed store, then acknowledged;
- a hop of a long delay that is not due: sent on, acknowledged, not run.

A message that is not JSON or names no registered job fails as a job (kept in the
failed store with the reason). An error of haze's own backends answers 500, and Vercel
delivers the message again. ``haze build --preset vercel`` writes
``dist/vercel/api/queue.py`` with ``app = QueueFunction(root=ROOT)``.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import os
from collections.abc import Awaitable, Callable, MutableMapping
from datetime import timedelta
from typing import Any

from haze._app.app import App
from haze._base.current import run_in_app
from haze._base.errors import ConfigError
from haze._workers.delivery import Delivery
from haze.drivers.vercel import VercelDriver, VercelReceipt, _sdk

__all__ = ["QueueFunction"]

log = logging.getLogger("haze.vercel")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

#: The app, driver and connection serving the callback in progress (the SDK's
#: subscriber registry is process-wide; a callback names its own).
_serving: contextvars.ContextVar[tuple[App, VercelDriver, str]] = contextvars.ContextVar(
    "haze_vercel_serving"
)
#: Topic patterns and consumer groups a subscriber is registered for, in this process.
_registered: dict[tuple[str, str], Any] = {}


async def _on_message(message: Any) -> None:
    """The SDK subscriber: run one delivered message through haze (see the module doc)."""
    app, driver, connection = _serving.get()
    sdk = _sdk()
    client = driver.client()
    job = driver.reserved(message, client)
    receipt = job.token
    assert isinstance(receipt, VercelReceipt)
    receipt.push = True
    if not await _holds_lease(driver, message, client):
        raise sdk.Handoff()  # acknowledged already, or no delivery of the service: not run
    admitted = await driver.admit(job)
    if admitted is not None:
        # The SDK renews the lease while the job runs: no heartbeat of haze's own.
        await Delivery(app.manager, connection).run(admitted, driver)
    if receipt.retry_delay is not None:
        raise sdk.RetryAfter(receipt.retry_delay)
    raise sdk.Handoff()  # settled by haze: the SDK does nothing more


async def _holds_lease(driver: VercelDriver, message: Any, client: Any) -> bool:
    """Whether the service still leases ``message`` to this callback. The SDK trusts the
    body and receipt handle a callback carries, so without asking, a callback POSTed again
    after its message was acknowledged would run the job again, and one the service never
    sent would run whatever it names. An outage propagates (500: Vercel delivers again)."""
    sdk = _sdk()
    try:
        await client.extend_lease(message, timedelta(seconds=driver.retry_after))
    except (
        sdk.MessageNotFoundError,
        sdk.MessageAlreadyProcessedError,
        sdk.MessageLockedError,
        sdk.BadRequestError,
    ) as e:
        meta = message.metadata
        log.warning(
            "queue callback for message %s of %s not run: the service does not lease it to "
            "this delivery (%s)",
            meta.message_id,
            meta.topic,
            type(e).__name__,
        )
        return False
    return True


def _subscribe(driver: VercelDriver) -> None:
    """Register ``_on_message`` for ``driver``'s topics and consumer group, once."""
    sdk = _sdk()
    pattern = driver.topic_template.split("{queue}")[0] + "*"
    key = (pattern, driver.consumer_group)
    if key in _registered:
        return

    async def handler(message: Any) -> None:
        await _on_message(message)

    # The payload arrives as the raw bytes (a body that is not JSON fails as a job).
    handler.__annotations__ = {"message": sdk.Message[bytes], "return": None}
    topic = sdk.TopicPattern(pattern)
    _registered[key] = sdk.subscribe(
        topic=topic, consumer_group=driver.consumer_group, retry_after=driver.retry_after
    )(handler)


def consumed_connection(app: App, name: str | None = None) -> str:
    """The vercel connection a function consumes: ``name``, ``HAZE_VERCEL_CONNECTION``,
    or the app's only vercel connection."""
    connections = app.queue_config.connections
    wanted = name or os.environ.get("HAZE_VERCEL_CONNECTION") or None
    vercel = [n for n, o in connections.items() if o.get("driver") == "vercel"]
    if wanted is None and len(vercel) == 1:
        wanted = vercel[0]
    if wanted is None or wanted not in vercel:
        raise ConfigError(
            f"the queue function consumes a vercel connection, and the app has "
            f"{', '.join(vercel) or 'none'}: set HAZE_VERCEL_CONNECTION to one of them "
            '(or add {"driver": "vercel", "topic": "haze-{queue}"} to config/queue.py)',
            source=app.queue_config.source,
            key="connections",
        )
    return wanted


class QueueFunction:
    """The ASGI app Vercel calls for each message of a vercel connection.

    >>> app = QueueFunction(root="/var/task")  # dist/vercel/api/queue.py  # doctest: +SKIP
    """

    def __init__(
        self, app: App | None = None, *, root: Any = None, connection: str | None = None
    ) -> None:
        if (app is None) == (root is None):
            raise TypeError("QueueFunction needs exactly one of app= or root=")
        self._fixed = app
        self._root = root
        self._connection = connection
        self._per_loop: tuple[asyncio.AbstractEventLoop, App] | None = None

    def app(self) -> App:
        """The haze app serving this event loop (built once per loop from ``root``)."""
        if self._fixed is not None:
            return self._fixed
        loop = asyncio.get_running_loop()
        if self._per_loop is None or self._per_loop[0] is not loop:
            self._per_loop = (loop, App(root=self._root))
        return self._per_loop[1]

    async def handle(self, body: bytes, headers: dict[str, str]) -> bool:
        """Run one push callback (the SDK raises what it cannot accept); True once done."""
        app = self.app()
        connection = consumed_connection(app, self._connection)
        driver = app.driver(connection)
        if not isinstance(driver, VercelDriver):
            raise ConfigError(f'connection "{connection}" is not a vercel connection')
        _subscribe(driver)
        token = _serving.set((app, driver, connection))
        try:
            await driver.client().accept_and_handle(body, headers)
        finally:
            _serving.reset(token)
        return True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        if scope.get("method") != "POST":
            await _answer(send, 405, {"error": "Vercel Queues POSTs each message here"})
            return
        body = bytearray()
        while True:
            event = await receive()
            body.extend(event.get("body", b""))
            if not event.get("more_body"):
                break
        headers = {
            k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or []
        }
        missing = _not_a_delivery(headers)
        if missing:
            # a scanner or a misrouted request: nothing Vercel would deliver again
            await _answer(send, 400, {"error": f"not a Vercel Queues push delivery: {missing}"})
            return
        app = self.app()
        try:
            raw = bytes(body)
            handled: bool = await run_in_app(app, lambda: self.handle(raw, headers))
            assert handled
        except Exception as e:
            # Vercel delivers the message again after the trigger's retryAfterSeconds.
            line = str(e).strip().splitlines()[0] if str(e).strip() else ""
            log.error("queue callback not handled: %s: %s", type(e).__name__, line)
            await _answer(send, 500, {"error": f"{type(e).__name__}: {line}"})
            return
        await _answer(send, 200, {"ok": True})


#: The CloudEvent type and headers every Vercel Queues push delivery carries.
_EVENT_TYPE = "com.vercel.queue.v2beta"
_EVENT_HEADERS = ("ce-vqsqueuename", "ce-vqsconsumergroup", "ce-vqsmessageid")


def _not_a_delivery(headers: dict[str, str]) -> str:
    """What a request lacks to be a push delivery ("" when it has it all)."""
    if headers.get("ce-type") != _EVENT_TYPE:
        return f"ce-type is {headers.get('ce-type', '')!r}, not {_EVENT_TYPE!r}"
    absent = [h for h in _EVENT_HEADERS if not headers.get(h)]
    return f"no {', '.join(absent)} header" if absent else ""


async def _answer(send: Send, status: int, data: dict[str, Any]) -> None:
    body = json.dumps(data).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
