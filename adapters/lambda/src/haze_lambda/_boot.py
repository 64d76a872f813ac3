"""Booting the app once per Lambda execution environment, and running async code.

Lambda keeps a process alive between invocations (a "warm" container) and freezes it
in between. The app is therefore built once, on the first invocation, and cached at
module level; every later invocation of that process reuses it.

Async code runs on ONE event loop per process, created with the app and reused by
every invocation (``loop.run_until_complete``), rather than ``asyncio.run`` per call:
``asyncio.run`` creates and closes a loop each time, and whatever the app opened on
the previous loop (SQLite/PostgreSQL/MySQL connections and pools, redis clients,
httpx clients, the memory driver's timers) is bound to that closed loop and breaks on
the next call ("attached to a different loop"), or must be reopened on every
invocation. A persistent loop keeps those connections warm, which is the point of
a warm start. Nothing runs on it while the process is frozen, and nothing is left on
it between invocations: each one ends by stopping the app's in-process consumers of
``memory`` connections (their queued jobs stay; the next dispatch starts one again)
and cancelling, with a warning, any task it started and did not wait for (frozen, it
would never finish). At process exit (a local run, a test; Lambda itself kills the
process) the app is stopped and the loop closed, so no "Task was destroyed but it is
pending!" or "Event loop is closed" is printed.

The app root is ``HAZE_APP_ROOT``; else the bundled app (``haze build --preset
aws-lambda`` puts ``config/`` and ``app/`` beside ``handler.py``, the function's
``LAMBDA_TASK_ROOT``); else the working directory, if it holds an app. The cache is
keyed by process id, so a forked worker (awslambdaric's multi-concurrency mode)
builds its own.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:  # loaded by the first invocation, not at import (cold start)
    from haze import App

__all__ = ["app_root", "boot", "check_settings", "reset", "run"]

T = TypeVar("T")

log = logging.getLogger("haze.lambda")

_lock = threading.RLock()
_state: dict[str, Any] = {}
_exit_hook: list[bool] = []


def _is_app(path: Path) -> bool:
    return (path / "config").is_dir() or (path / "app" / "job").is_dir()


def app_root() -> Path:
    """Where the app is: ``HAZE_APP_ROOT``, the bundle (``LAMBDA_TASK_ROOT``), or the cwd."""
    env = os.environ.get("HAZE_APP_ROOT")
    if env:
        path = Path(env)
        if not path.is_dir():
            raise RuntimeError(f"HAZE_APP_ROOT={env!r} is not a directory")
        return path
    for candidate in (os.environ.get("LAMBDA_TASK_ROOT"), os.getcwd()):
        if candidate and _is_app(Path(candidate)):
            return Path(candidate)
    raise RuntimeError(
        "haze_lambda: no app found; set HAZE_APP_ROOT to the directory holding config/ and "
        "app/job/, or deploy the bundle made by `haze build --preset aws-lambda`"
    )


def check_settings() -> None:
    """Read every size, duration and number setting of the environment once, so that a
    bad value fails the boot with one line naming it, not each invocation later."""
    # haze's modules load at the first invocation, not when Lambda imports the handler
    # (tests/test_import_cost.py): the only imports inside functions in this adapter.
    from haze.driver_api import env, env_duration
    from haze.integrations.http_dispatch import max_body

    max_body()
    for name in ("HAZE_SQS_MARGIN", "HAZE_SCHEDULE_MARGIN", "HAZE_SCHEDULE_MAX_TIME"):
        env_duration(name, 0.0)
    env("HAZE_SCHEDULE_CONCURRENCY", 0)


def boot(root: str | os.PathLike[str] | None = None) -> App:
    """The app of this process, built and entered on first use (on the process's loop)."""
    with _lock:
        app: App | None = _state.get("app")
        if app is not None and _state.get("pid") == os.getpid():
            return app
        check_settings()
        from haze.driver_api import App

        path = Path(root) if root is not None else app_root()
        loop = asyncio.new_event_loop()
        app = App(root=path)
        loop.run_until_complete(app.__aenter__())
        _state.update(app=app, loop=loop, pid=os.getpid(), root=path)
        if not _exit_hook:
            _register_exit_hook()
            _exit_hook.append(True)
        return app


def run(fn: Callable[[App], Awaitable[T]]) -> T:
    """Run ``fn(app)`` on the process's loop, with the app pinned as the current app."""
    with _lock:
        app = boot()
        loop: asyncio.AbstractEventLoop = _state["loop"]

        from haze.driver_api import run_in_app

        async def pinned() -> T:
            try:
                return await run_in_app(app, lambda: fn(app))
            finally:
                await _end_invocation(app)

        return loop.run_until_complete(pinned())


async def _end_invocation(app: App) -> None:
    """Leave no task on the loop: Lambda freezes the process until the next invocation
    (if any), so a task still pending here would not run until then, or ever."""
    await app.manager.stop_local_workers()
    current = asyncio.current_task()
    left = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
    if left:
        log.warning(
            "haze_lambda: cancelled %d task(s) the invocation started and did not wait for "
            "(they would not run while Lambda freezes the process): %s",
            len(left),
            ", ".join(t.get_name() for t in left),
        )
        for t in left:
            t.cancel()
        await asyncio.gather(*left, return_exceptions=True)


def _close_loop(loop: asyncio.AbstractEventLoop) -> None:
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for t in tasks:
        t.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.run_until_complete(loop.shutdown_default_executor())
    loop.close()


def _register_exit_hook() -> None:
    """Stop the app at exit, while thread pools still take work (SQLite connections close
    through theirs). ``concurrent.futures`` shuts every pool down in a threading exit
    hook, which runs before ``atexit`` callbacks; threading's hooks run last-registered
    first, so one registered after it runs before it."""
    import concurrent.futures.thread  # noqa: F401  (its hook is registered on import)

    register = getattr(threading, "_register_atexit", None)
    if register is None:  # pragma: no cover - every CPython since 3.9 has it
        atexit.register(_at_exit)
    else:
        register(_at_exit)


def _at_exit() -> None:
    try:
        reset()
    except Exception:  # the process is exiting: report, do not raise
        log.exception("haze_lambda: stopping the app at exit failed")


def reset() -> None:
    """Stop and forget the cached app (tests; a new root on the next ``boot``)."""
    with _lock:
        app: App | None = _state.get("app")
        loop: asyncio.AbstractEventLoop | None = _state.get("loop")
        if (
            app is not None
            and loop is not None
            and _state.get("pid") == os.getpid()
            and not loop.is_closed()
            and not loop.is_running()
        ):
            try:
                loop.run_until_complete(app.__aexit__(None, None, None))
            finally:
                _close_loop(loop)
        _state.clear()
