"""``QueueWorker``: the Python Worker entrypoint whose ``queue()`` runs haze jobs.

``dist/cloudflare/src/entry.py`` (``haze build --preset cloudflare``) is::

    from haze_cloudflare import QueueWorker

    class Default(QueueWorker):
        app_root = "."          # the bundled app: config/*.py and app/job/**

Each invocation binds the Worker's ``env`` (Queue, D1 and KV bindings) for haze, boots
the app once per isolate, and runs every message of the batch through the queue
manager, exactly as ``haze queue:work`` runs a claimed job. The manager's verdict is
applied to the Cloudflare message:

=====================  =============================================================
outcome                what the message gets
=====================  =============================================================
success / skipped      ``message.ack()``
retry (tries left)     ``message.retry(delaySeconds=<haze backoff>)``: Cloudflare counts
                       the attempt and redelivers after the delay
``job.release(d)``     a *new* message (same job id) whose envelope ``attempts`` carries
                       the tries used so far, sent with ``delaySeconds=d`` through the
                       Queue binding; then ``ack()``: no try is consumed
final failure          recorded in the connection's failed store, then ``ack()``
=====================  =============================================================

Queue events: ``looping`` is emitted before each message is taken (the claim of a
``queue:work`` loop), ``worker_idle`` once the batch is done (the consumer waits for
Cloudflare's next delivery); both with the consumed connection and ``queues=None`` (one
Cloudflare queue carries every haze queue of the connection).

The attempt number a job sees is ``message.attempts`` (Cloudflare's delivery count,
1-based) plus the envelope's ``attempts`` offset. Give the queue's consumer a
``max_retries`` of at least ``tries - 1``: past it Cloudflare moves the message to the
dead-letter queue itself, before haze's final failure.

``fetch()`` is an optional authenticated dispatch endpoint that answers exactly as the
Lambda, server and Vercel entrypoints do (``haze.integrations.http_dispatch``): ``POST``
a JSON body ``{"job": "send_invoice", "payload": {...}, "delay"?, "queue"?, "group"?}``
with ``Authorization: Bearer <HAZE_HTTP_SECRET>`` (a Worker secret), or signed with
``X-Haze-Timestamp`` and an ``X-Haze-Signature`` HMAC of ``"{timestamp}.{body}"``
(refused when more than 5 minutes off); 202 ``{"id", "job", "skipped", "deferred"}``.
Without the secret it answers 500 and dispatches nothing.

``scheduled()`` is the Cron Trigger handler: it dispatches the schedules of
``config/schedule.py`` whose trigger fired (see ``haze.scheduling.utc_cron``).

Subclass on the Cloudflare runtime: ``workers.WorkerEntrypoint``. Anywhere else (CPython,
Pyodide under Node.js in tests) a small local base with the same constructor, so this
module imports everywhere. No threads are used.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import json
import logging
import os
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from haze.driver_api import ConfigError, HazeError

from haze_cloudflare._js import bind_env, binding, env_vars, register_plugins, to_py

if TYPE_CHECKING:  # loaded by the first invocation, not at import (cold start)
    from haze.contracts.driver import Reserved
    from haze.driver_api import App, Delivery, Message

__all__ = ["LocalResponse", "MessageDelivery", "QueueWorker"]

log = logging.getLogger("haze.cloudflare")

# Typed against workers-runtime-sdk (PyPI) where it is installed; its modules import
# only inside the Workers runtime. The ``unused-ignore`` codes keep mypy quiet both with
# and without the SDK (pyproject.toml: ignore_missing_imports for workers.*).
try:  # the Cloudflare Python Workers runtime
    from workers import WorkerEntrypoint as _Base

    _HAVE_WORKERS = True
except ImportError:
    _HAVE_WORKERS = False

    class _Base:  # type: ignore[no-redef, unused-ignore]
        """Stand-in for ``workers.WorkerEntrypoint`` outside the Cloudflare runtime."""

        def __init__(self, ctx: Any = None, env: Any = None):
            self.ctx = ctx
            self.env = env


async def _settle(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value


_Method = TypeVar("_Method", bound=Callable[..., Awaitable[Any]])


def _invocation(method: _Method) -> _Method:
    """An entrypoint method (``queue``, ``fetch``) runs with the invocation's env bound
    and its vars and secrets as what ``env()`` reads, for this invocation only."""

    @functools.wraps(method)
    async def run(self: QueueWorker, first: Any, env: Any = None, ctx: Any = None) -> Any:
        with self._worker_vars(env):
            return await method(self, first, env, ctx)

    return run  # type: ignore[return-value]


class MessageDelivery:
    """A Cloudflare queue message as the token of a ``Reserved``: settled once.

    ``verdict`` is ``"ack"`` or ``"retry"`` after settling, ``delay`` the retry's
    ``delaySeconds``.
    """

    __slots__ = ("delay", "message", "verdict")

    def __init__(self, message: Any):
        self.message = message
        self.verdict: str | None = None
        self.delay: int | None = None

    def _settling(self, verdict: str) -> None:
        if self.verdict is not None:
            raise HazeError(f"message already settled ({self.verdict}); cannot {verdict}")
        self.verdict = verdict

    async def ack(self) -> None:
        self._settling("ack")
        await _settle(self.message.ack())

    async def retry(self, delay: int) -> None:
        self._settling("retry")
        self.delay = delay
        # Pyodide passes keyword arguments to a JS function as a trailing options object:
        # this is message.retry({delaySeconds}) in JavaScript.
        await _settle(self.message.retry(delaySeconds=delay))


@dataclass
class LocalResponse:
    """What ``fetch()`` returns outside the Cloudflare runtime."""

    body: str
    status: int = 200
    headers: dict[str, str] = field(default_factory=lambda: {"content-type": "application/json"})

    def json(self) -> Any:
        return json.loads(self.body)


#: One booted app per QueueWorker class and isolate.
_apps: dict[type, App] = {}
_boot_locks: dict[type, asyncio.Lock] = {}


class QueueWorker(_Base):  # type: ignore[misc, valid-type, unused-ignore]
    """A Worker entrypoint that runs haze jobs from Cloudflare Queues (see the module doc).

    Class attributes a subclass may set:

    ``haze_app``   an ``App`` to use as is;
    ``app_root``   the app root to boot (``config/*.py``, ``app/job/**``), else the
                   ``HAZE_APP_ROOT`` env var (a Worker var or ``os.environ``), else an
                   ``App()`` with no files;
    ``connection`` the haze connection the consumed queue belongs to (default: the
                   message's own connection, else the first ``cloudflare`` connection);
    ``dispatch_secret`` the env var holding the Bearer secret of ``fetch()``.
    """

    haze_app: App | None = None
    app_root: str | None = None
    connection: str | None = None
    dispatch_secret: str = "HAZE_HTTP_SECRET"

    def __init__(self, ctx: Any = None, env: Any = None):
        super().__init__(ctx, env)
        self._bind(None)  # this invocation's env: bindings for dispatches made before queue()
        #: Outcomes of the last ``queue()`` call, one per message ("success", "retry"…).
        self.outcomes: list[str] = []

    # -- the app ----------------------------------------------------------------------

    @classmethod
    def preload(cls) -> None:
        """Import what an invocation runs, and the app's job modules, now.

        Call it at the top level of the Worker's entry: a deployed Python Worker runs
        that once and starts every isolate from a memory snapshot of the result, so the
        imports are not paid again per isolate. The config files are not read here: the
        Worker's vars and secrets (what ``env()`` reads) exist only inside a request.
        Nothing random is drawn (ids are drawn per isolate, at its first request).

        >>> class Default(QueueWorker):
        ...     app_root = APP_ROOT
        >>> Default.preload()
        """
        from haze import define_cache_config, define_database_config, define_redis_config
        from haze.contracts.driver import Reserved  # noqa: F401
        from haze.driver_api import (
            App,
            Delivery,  # noqa: F401
            decode,  # noqa: F401
            define_haze_config,
            define_queue_config,
        )
        from haze.integrations.http_dispatch import dispatch_request  # noqa: F401

        root = cls.app_root
        if root is None or cls.haze_app is not None:
            return
        # Empty configs: the files stay unread (see above); only discovery runs. The
        # app built inside the first request finds these modules already imported.
        App(
            root,
            queue=define_queue_config(),
            cache=define_cache_config(),
            redis=define_redis_config(),
            database=define_database_config(),
            haze=define_haze_config(),
        )

    def create_app(self) -> App:
        """Build the app (once per isolate): ``haze_app``, ``app_root`` or HAZE_APP_ROOT."""
        register_plugins()  # a bundle has no entry points: before the app resolves any
        if self.haze_app is not None:
            return self.haze_app
        from haze.driver_api import App

        root = self.app_root
        if root is None:
            value = binding("HAZE_APP_ROOT")
            root = str(to_py(value)) if value is not None else os.environ.get("HAZE_APP_ROOT")
        return App(root=root) if root else App()

    async def get_app(self) -> App:
        """The booted (entered) app of this class."""
        cls = type(self)
        app = _apps.get(cls)
        if app is not None:
            return app
        lock = _boot_locks.setdefault(cls, asyncio.Lock())
        async with lock:
            app = _apps.get(cls)
            if app is None:
                from haze.integrations.http_dispatch import max_body

                with self._worker_vars(None):  # config files read the Worker's vars
                    max_body()  # a bad HAZE_HTTP_MAX_BODY stops the boot with one line
                    app = await self.create_app().ensure_entered()
                _apps[cls] = app
        return app

    def _bind(self, env: Any) -> None:
        if env is None:
            env = getattr(self, "env", None)
        if env is not None:
            bind_env(env)

    @contextlib.contextmanager
    def _worker_vars(self, env: Any) -> Iterator[None]:
        """``env()`` reads this env's vars and secrets inside the block (``self.env``
        when ``env`` is None); nothing is written to ``os.environ``."""
        if env is None:
            env = getattr(self, "env", None)
        if env is None:
            yield
            return
        from haze.driver_api import env_source  # at the first invocation (cold start)

        with env_source(env_vars(env)):
            yield

    # -- queue() ------------------------------------------------------------------------

    @_invocation
    async def queue(self, batch: Any, env: Any = None, ctx: Any = None) -> None:
        """Run every message of ``batch`` through haze and settle it (see the module doc)."""
        from haze.contracts.driver import Concurrent
        from haze.driver_api import Delivery

        self._bind(env)
        app = await self.get_app()
        messages = list(batch.messages)
        queue_name = str(to_py(getattr(batch, "queue", "")) or "")
        concurrency = 1
        consumed: str | None = None
        try:
            consumed = self._connection_for(app, None)
            driver = app.driver(consumed)
            if isinstance(driver, Concurrent):
                concurrency = max(1, int(driver.concurrency))
        except ConfigError:
            pass
        delivery = Delivery(app.manager, consumed)

        async def one(message: Any) -> str:
            return await self.handle_message(app, message, queue_name, delivery)

        async with _listed(app, consumed, delivery, queue_name, concurrency):
            self.outcomes = await delivery.run_batch(
                messages, one, concurrency=concurrency, events=True
            )

    async def handle_message(
        self, app: App, message: Any, queue_name: str = "", delivery: Delivery | None = None
    ) -> str:
        """Run one Cloudflare message through the manager; returns the outcome."""
        from haze.driver_api import Delivery

        token = MessageDelivery(message)
        try:
            reserved, connection = self.reserved(app, message, token)
            outcome = await (delivery or Delivery(app.manager)).run(
                reserved, app.driver(connection)
            )
        except Exception:
            log.exception(
                "haze: cannot process Cloudflare message %s from queue %r",
                _message_id(message),
                queue_name,
            )
            if token.verdict is None:
                try:  # let Cloudflare redeliver it (and dead-letter it after max_retries)
                    await _settle(message.retry())
                    token.verdict = "retry"
                except Exception:
                    log.exception("haze: message.retry() failed")
            return "error"
        if token.verdict is None:  # pragma: no cover - the manager always settles
            await token.ack()
        return outcome

    def reserved(self, app: App, message: Any, delivery: MessageDelivery) -> tuple[Reserved, str]:
        """A ``Reserved`` for a Cloudflare message, and the haze connection it belongs to.

        The attempt is ``message.attempts`` (Cloudflare's delivery count) plus the
        envelope's ``attempts`` offset."""
        from haze.contracts.driver import Reserved

        cf_attempts = int(to_py(getattr(message, "attempts", 1)) or 1)
        body, error = _body_text(to_py(message.body))
        reserved = Reserved.delivered(body, cf_attempts, delivery, error)
        return reserved, self._connection_for(app, reserved.message)

    def _connection_for(self, app: App, message: Message | None) -> str:
        conns = app.queue_config.connections
        if self.connection is not None:
            return app.connection_name(self.connection)
        if (
            message is not None
            and message.connection in conns
            and conns[message.connection]["driver"] == "cloudflare"
        ):
            return message.connection
        names = [n for n, o in conns.items() if o["driver"] == "cloudflare"]
        if not names:
            raise ConfigError(
                "QueueWorker consumes Cloudflare Queues, but no connection in config/queue.py "
                'uses the cloudflare driver; add e.g. "cloudflare": {"driver": "cloudflare", '
                '"binding": "QUEUE"}',
                source=app.queue_config.source,
                key="connections",
            )
        default = app.queue_config.default
        return default if default in names else names[0]

    # -- fetch(): authenticated dispatch ---------------------------------------------------

    @_invocation
    async def fetch(self, request: Any, env: Any = None, ctx: Any = None) -> Any:
        """``POST {"job", "payload", "delay"?, "queue"?, "group"?}``, authenticated like
        every haze HTTP entrypoint (``haze.integrations.http_dispatch``)."""
        from haze.driver_api import run_in_app
        from haze.integrations.http_dispatch import (
            DispatchResponse,
            check_head,
            dispatch_request,
        )

        self._bind(env)
        method = str(getattr(request, "method", "GET"))
        secret_value = binding(self.dispatch_secret)
        secret = (
            str(to_py(secret_value))
            if secret_value is not None
            else os.environ.get(self.dispatch_secret, "")
        )
        headers = {
            name: value
            for name in ("authorization", "x-haze-signature", "x-haze-timestamp", "content-length")
            if (value := _header(request, name)) is not None
        }
        # The headers decide first (credentials, a declared size over the limit): a
        # refused request's body is never read.
        refused = check_head(method, headers, where="cloudflare fetch", secret=secret)
        if refused is not None:
            return self._response(refused.body, refused.status, refused.headers)
        raw = str(await _settle(request.text())).encode()
        app = await self.get_app()

        async def answer() -> DispatchResponse:
            return await dispatch_request(
                app, method, headers, raw, where="cloudflare fetch", secret=secret
            )

        response: DispatchResponse = await run_in_app(app, answer)
        return self._response(response.body, response.status, response.headers)

    async def send_event(self, run_id: str, name: str, payload: Any = None) -> bool:
        """Send event ``name`` to workflow run ``run_id`` from this Worker: for a
        subclass's own ``fetch()`` (a webhook route of your own). ``Workflow.send_event``
        with this Worker's app current; False when the run had that event already.

        >>> class Default(QueueWorker):
        ...     async def fetch(self, request, env=None, ctx=None):
        ...         data = json.loads(await request.text())
        ...         await self.send_event(data["run"], "paid", data)
        ...         return self._response({"ok": True}, 202)
        """
        from haze.driver_api import Workflow, run_in_app

        self._bind(None)
        app = await self.get_app()

        async def send() -> bool:
            return await Workflow.send_event(run_id, name, payload)

        kept: bool = await run_in_app(app, send)
        return kept

    # -- scheduled() ----------------------------------------------------------------------

    @_invocation
    async def scheduled(self, controller: Any, env: Any = None, ctx: Any = None) -> list[str]:
        """The Cron Trigger handler: dispatch the app's schedules whose trigger is
        ``controller.cron`` and that are due at ``controller.scheduledTime`` (in their
        time zone); returns their names. ``haze build --preset cloudflare`` writes one
        trigger per distinct cron into ``triggers.crons``.

        A schedule fires once per trigger: with a D1 or KV store the tick is claimed
        there first, so a trigger Cloudflare delivers twice dispatches once.
        """
        from datetime import UTC, datetime

        from haze.driver_api import dispatch_trigger, run_in_app

        self._bind(env)
        cron = str(to_py(getattr(controller, "cron", "")) or "")
        when = to_py(getattr(controller, "scheduledTime", None))
        at = datetime.fromtimestamp(float(when) / 1000, UTC) if when else datetime.now(UTC)
        app = await self.get_app()

        async def fire() -> list[str]:
            return await dispatch_trigger(app, "cloudflare", cron, at)

        fired: list[str] = await run_in_app(app, fire)
        return fired

    @staticmethod
    def _response(data: Any, status: int, headers: dict[str, str] | None = None) -> Any:
        body = json.dumps(data)
        if _HAVE_WORKERS:
            from workers import Response

            all_headers = {"content-type": "application/json", **(headers or {})}
            return Response(body, status=status, headers=all_headers)
        return LocalResponse(body, status)


def _listed(
    app: App, connection: str | None, delivery: Delivery, queue: str, concurrency: int
) -> contextlib.AbstractAsyncContextManager[None]:
    """This isolate on the dashboard's Workers page while a batch runs (a short lease,
    written at most every few seconds; an isolate that gets no more batches drops off)."""
    from haze.driver_api import invocations

    if connection is None:
        return contextlib.nullcontext()
    listed = invocations(app, connection, "cloudflare")
    return listed.invocation(delivery, [queue] if queue else None, concurrency)


def _body_text(raw: Any) -> tuple[str, BaseException | None]:
    """A message body as JSON text, or (what it shows, why it cannot be a haze message).

    A producer that sent with Cloudflare's default content type (``v8``) can put any
    structured-cloneable value in a body. workerd turns a ``Date`` into its ISO string
    before Python sees it (so it arrives as text, indistinguishable from a string); a
    value with no JSON form that stays a JS object (a ``RegExp``) fails here.
    """
    from haze.driver_api import MessageDecodeError

    if isinstance(raw, (bytes, bytearray, memoryview)):
        raw = bytes(raw).decode("utf-8", "replace")
    if isinstance(raw, str):
        return raw, None
    try:
        return json.dumps(raw, separators=(",", ":"), ensure_ascii=False), None
    except (TypeError, ValueError, RecursionError):
        found: list[str] = []

        def shown(value: Any) -> str:
            found.append(_js_kind(value))
            return f"<{found[-1]} {str(value)[:80]}>"

        try:
            text = json.dumps(raw, separators=(",", ":"), ensure_ascii=False, default=shown)
        except (TypeError, ValueError, RecursionError):
            text = repr(raw)[:1000]
        kinds = ", ".join(sorted(set(found))) or type(raw).__name__
        return text, MessageDecodeError(
            f"message body is not JSON: it holds a JavaScript {kinds}, which has no JSON "
            'form; haze messages are JSON (send them with contentType "json")'
        )


def _js_kind(value: Any) -> str:
    """``Date``, ``RegExp``, a class name… of a JS object (``object`` when unknown)."""
    try:
        name = value.constructor.name
    except Exception:
        name = None
    return str(name) if isinstance(name, str) and name else type(value).__name__


def _header(request: Any, name: str) -> str | None:
    headers = getattr(request, "headers", None)
    if headers is None:
        return None
    for key in (name, name.title()):
        try:
            value = headers.get(key)
        except Exception:
            value = None
        value = to_py(value)
        if value:
            return str(value)
    return None


def _message_id(message: Any) -> str:
    try:
        return str(to_py(message.id))
    except Exception:
        return "?"
