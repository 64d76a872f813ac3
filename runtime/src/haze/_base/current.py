"""The current app: which App a dispatch, a job or a facade call acts on.

Every layer asks for the current app, but only the composition root knows what an App
is. So the context lives here as plain ``object``s: ``haze.contracts.app.use_app`` reads
it as an ``AppView``, ``haze.App``'s module wraps it with its ``App`` type and registers
how the implicit default app is built (:func:`set_default_factory`). The package
(``haze/__init__.py``, loaded before any of its modules) names the module that
registers it as ``_APP_MODULE``: the kernel never names a layer above it.

>>> # use_app()                        -> the job's app, the entered one, or the default
>>> # await run_in_app(app, lambda: x) -> x computed with ``app`` current
"""

from __future__ import annotations

import asyncio
import contextvars
import importlib
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

__all__ = [
    "add_enter_hook",
    "app_var",
    "default_app",
    "entered",
    "explicit_app",
    "left",
    "remove_enter_hook",
    "run_in_app",
    "set_default_factory",
    "use_app",
]

T = TypeVar("T")

#: The app of the running job (or of ``run_in_app``/``async with app``), else None.
#: ``Any`` because the kernel cannot name ``App``: callers annotate what they get.
app_var: contextvars.ContextVar[Any] = contextvars.ContextVar("haze_app", default=None)

_last_entered: object = None
_default_app: object = None
_default_factory: Callable[[], object] | None = None
_default_lock = threading.Lock()
_enter_hooks: list[Callable[[Any], None]] = []


def use_app() -> object:
    """The current app: the job's app inside a job, else the most recently entered app,
    else the implicit default app (one ``memory`` connection)."""
    app = app_var.get()
    if app is not None:
        return app
    if _last_entered is not None:
        return _last_entered
    return default_app()


def explicit_app() -> object:
    """The app :func:`use_app` would return, or None where that would be the implicit
    default app (nothing current, nothing entered): nothing is created."""
    app = app_var.get()
    return app if app is not None else _last_entered


def default_app() -> object:
    """The process-wide implicit app, built on first use by the registered factory."""
    global _default_app
    with _default_lock:
        if _default_app is None:
            factory = _default_factory
            if factory is None:
                # Nothing has imported the composition root yet (a script that only
                # defined and dispatched jobs): importing it registers the factory.
                module: str = sys.modules[__name__.partition(".")[0]]._APP_MODULE
                importlib.import_module(module)
                factory = _default_factory
            assert factory is not None, f"{module} registers the default app factory"
            _default_app = factory()
        return _default_app


def set_default_factory(factory: Callable[[], object]) -> None:
    """How the implicit default app is built (``haze.App``'s module registers it)."""
    global _default_factory
    _default_factory = factory


def entered(app: object) -> contextvars.Token[Any]:
    """``app`` was entered (``async with app``): it is current here, and the most
    recently entered app elsewhere. Returns the token for :func:`left`."""
    global _last_entered
    _last_entered = app
    for hook in list(_enter_hooks):
        hook(app)
    return app_var.set(app)


def left(app: object, token: contextvars.Token[Any]) -> None:
    """``app`` was exited: undo :func:`entered`."""
    global _last_entered
    if _last_entered is app:
        _last_entered = None
    try:
        app_var.reset(token)
    except ValueError:  # exited in another context (e.g. a fixture's teardown task)
        app_var.set(None)


def add_enter_hook(hook: Callable[[Any], None]) -> None:
    """Call ``hook(app)`` whenever an app is entered (``Queue.fake()`` made before the
    test's app was entered uses it to fake that app too)."""
    _enter_hooks.append(hook)


def remove_enter_hook(hook: Callable[[Any], None]) -> None:
    """Undo :func:`add_enter_hook` (no error when ``hook`` is not there)."""
    if hook in _enter_hooks:
        _enter_hooks.remove(hook)


async def run_in_app(app: object, fn: Callable[[], Awaitable[T] | T]) -> T:
    """Run ``fn`` with ``app`` as the current app (for scripts with several apps)."""
    token = app_var.set(app)
    try:
        result = fn()
        if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
            return await result  # type: ignore[no-any-return]
        return result  # type: ignore[return-value]
    finally:
        app_var.reset(token)
