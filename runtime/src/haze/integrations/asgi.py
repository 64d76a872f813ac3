"""``run_in_server``: run a queue worker inside an ASGI server (uvicorn, hypercorn…).

With ``run_in_server=True`` (or ``{"connection", "queues", "concurrency"}``) in
``config/queue.py``, wrap your ASGI app::

    from haze import App
    from haze.integrations.asgi import run_in_server
    app = run_in_server(starlette_app, App(root="."))

or, for Starlette/FastAPI's ``lifespan=`` parameter::

    from haze.integrations.asgi import haze_lifespan
    app = FastAPI(lifespan=haze_lifespan(App(root=".")))

The worker starts when the server's lifespan starts (the server is about to listen)
and drains on shutdown: it stops claiming and waits for running jobs. It never starts
in tests (pytest loaded, e.g. Starlette's ``TestClient``) or CLI commands, nor when
``HAZE_RUN_IN_SERVER=0``. ``sync`` has nothing to consume (skipped with a warning);
``memory`` is already consumed by the web process, so an extra worker starts only
when ``queues`` or ``concurrency`` are given.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from haze._workers.worker import Worker
from haze.contracts.driver import IdlePolling

if TYPE_CHECKING:
    from haze._app.app import App

__all__ = ["ServerWorker", "haze_lifespan", "run_in_server"]

log = logging.getLogger("haze")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def _suppressed() -> str | None:
    if os.environ.get("HAZE_RUN_IN_SERVER", "").strip().lower() in ("0", "false", "no", "off"):
        return "HAZE_RUN_IN_SERVER=0"
    if "pytest" in sys.modules:
        return "running under pytest"
    return None


class ServerWorker:
    """Starts and drains the ``run_in_server`` worker of a haze app."""

    def __init__(self, app: App, *, force: bool = False) -> None:
        self.app = app
        self.force = force
        self.worker: Worker | None = None
        self._entered = False

    async def start(self) -> None:
        if self._entered:
            return
        await self.app.__aenter__()
        self._entered = True
        settings = self.app.queue_config.run_in_server
        if settings is None:
            return
        why = None if self.force else _suppressed()
        if why is not None:
            log.info("haze: run_in_server worker not started (%s)", why)
            return
        name = self.app.connection_name(settings.get("connection"))
        driver = self.app.driver(name)
        if driver.inline:
            log.warning(
                'haze: run_in_server skipped: connection "%s" is sync and runs jobs '
                "inside dispatch(); there is nothing to consume",
                name,
            )
            return
        queues = settings.get("queues")
        concurrency = settings.get("concurrency")
        if not driver.remote and queues is None and concurrency is None:
            return  # the web process already consumes its memory connection
        pace = driver if isinstance(driver, IdlePolling) else None
        self.worker = Worker(
            self.app,
            name,
            queues or ["default"],
            concurrency or 1,
            control=driver.remote,
            sleep=float(pace.sleep) if pace is not None else 1.0,
            max_sleep=pace.max_sleep if pace is not None else None,
        )
        self.worker.start()
        log.info(
            'haze: run_in_server worker started on "%s" (queues %s, concurrency %d)',
            name,
            ",".join(queues or ["default"]),
            concurrency or 1,
        )

    async def stop(self) -> None:
        if self.worker is not None:
            await self.worker.stop()
            self.worker = None
        if self._entered:
            self._entered = False
            await self.app.__aexit__(None, None, None)


def haze_lifespan(app: App, *, force: bool = False) -> Callable[[Any], Any]:
    """A Starlette/FastAPI ``lifespan`` that runs the app's ``run_in_server`` worker."""

    @asynccontextmanager
    async def lifespan(_asgi_app: Any) -> AsyncIterator[None]:
        server = ServerWorker(app, force=force)
        await server.start()
        try:
            yield
        finally:
            await server.stop()

    return lifespan


def run_in_server(asgi_app: ASGIApp, app: App, *, force: bool = False) -> ASGIApp:
    """Wrap any ASGI app: the haze worker follows the server's lifespan events."""
    server = ServerWorker(app, force=force)

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await asgi_app(scope, receive, send)
            return

        async def hooked_receive() -> Message:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await server.start()
            elif message["type"] == "lifespan.shutdown":
                await server.stop()
            return message

        try:
            await asgi_app(scope, hooked_receive, send)
        except Exception:
            # An app without lifespan support: answer the protocol ourselves.
            await _own_lifespan(server, receive, send)

    return wrapped


async def _own_lifespan(server: ServerWorker, receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await server.start()
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await server.stop()
            await send({"type": "lifespan.shutdown.complete"})
            return
