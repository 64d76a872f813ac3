"""The one place that turns an async method into its ``_blocking`` twin.

Sync code (Flask, Django views, sync Lambda handlers) calls ``x_blocking(...)``. The
coroutine runs on one background event loop thread that lives for the process, so
in-process (``memory``) consumers started by a blocking dispatch keep running
between calls. Calling a twin inside a running event loop raises ``RuntimeError``:
that code should ``await`` the async method instead.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextvars
import functools
import sys
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, TypeVar

__all__ = ["blocking", "blocking_method", "run_blocking"]

P = ParamSpec("P")
R = TypeVar("R")
S = TypeVar("S")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None


def _background_loop() -> asyncio.AbstractEventLoop:
    global _loop, _thread
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            _thread = threading.Thread(target=run, name="haze-blocking", daemon=True)
            _thread.start()
            ready.wait()
            _loop = loop
        return _loop


def _shutdown() -> None:
    loop = _loop
    if loop is not None and not loop.is_closed():
        loop.call_soon_threadsafe(loop.stop)


atexit.register(_shutdown)


def run_blocking(coro: Coroutine[Any, Any, R], name: str = "this call") -> R:
    """Run ``coro`` to completion from sync code and return its result."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        coro.close()
        raise RuntimeError(
            f"{name}_blocking() was called inside a running event loop; "
            f"use 'await {name}(...)' in async code"
        )
    if sys.platform == "emscripten":
        coro.close()
        raise RuntimeError(
            f"{name}_blocking() needs threads; under Pyodide use 'await {name}(...)'"
        )
    loop = _background_loop()
    ctx = contextvars.copy_context()
    result: concurrent.futures.Future[R] = concurrent.futures.Future()

    def start() -> None:
        task = loop.create_task(coro, context=ctx)

        def done(t: asyncio.Task[R]) -> None:
            if t.cancelled():
                result.cancel()
            elif t.exception() is not None:
                result.set_exception(t.exception())
            else:
                result.set_result(t.result())

        task.add_done_callback(done)

    loop.call_soon_threadsafe(start)
    return result.result()


def blocking(fn: Callable[P, Awaitable[R]]) -> Callable[P, R]:
    """The blocking twin of an async function."""
    name = fn.__name__

    @functools.wraps(fn)
    def twin(*args: P.args, **kwargs: P.kwargs) -> R:
        async def call() -> R:
            return await fn(*args, **kwargs)

        return run_blocking(call(), name)

    twin.__name__ = f"{name}_blocking"
    twin.__doc__ = f"Blocking twin of ``{name}`` for sync code; see ``{name}``."
    return twin


def blocking_method(
    fn: Callable[Concatenate[S, P], Awaitable[R]],
) -> Callable[Concatenate[S, P], R]:
    """The blocking twin of an async method (``x_blocking = blocking_method(x)``)."""
    return blocking(fn)
