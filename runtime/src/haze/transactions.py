"""The transaction-hook registry behind after-commit dispatch and ``haze.after_commit``.

Integrations (``haze.integrations.sqlalchemy``, the ``Db`` facade) register a
*provider*: a function returning the innermost active ``Transaction`` in the current
context, or None. ``after_commit(fn)`` attaches ``fn`` to it; with no active
transaction ``fn`` runs at once. An integration calls ``fire(callbacks)`` after the
outermost commit and simply forgets the callbacks on rollback.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from haze._base.blocking import run_blocking

__all__ = ["Transaction", "after_commit", "current_transaction", "fire", "register_provider"]

log = logging.getLogger("haze")

Callback = Callable[[], Any]


class Transaction(Protocol):
    """An active transaction (or savepoint) that can hold after-commit callbacks."""

    def on_commit(self, callback: Callback) -> None:
        """Run ``callback`` after the outermost commit; drop it if this level rolls back."""


_providers: list[Callable[[], Transaction | None]] = []
_pending: set[asyncio.Task[Any]] = set()


def register_provider(provider: Callable[[], Transaction | None]) -> None:
    """Add a source of active transactions (idempotent)."""
    if provider not in _providers:
        _providers.append(provider)


def unregister_provider(provider: Callable[[], Transaction | None]) -> None:
    if provider in _providers:
        _providers.remove(provider)


def current_transaction() -> Transaction | None:
    """The innermost active transaction any provider knows of in this context."""
    for provider in reversed(_providers):
        tx = provider()
        if tx is not None:
            return tx
    return None


def after_commit(fn: Callback) -> None:
    """Run ``fn`` (sync or async) after the current transaction commits, or now if none.

    >>> after_commit(lambda: print("committed"))
    committed
    """
    if not callable(fn):
        raise TypeError(f"after_commit: expected a callable, got {fn!r}")
    tx = current_transaction()
    if tx is None:
        fire([fn])
    else:
        tx.on_commit(fn)


def fire(callbacks: Iterable[Callback]) -> None:
    """Run after-commit callbacks: errors are logged, never raised (the commit happened)."""
    for cb in callbacks:
        try:
            result = cb()
        except Exception:
            log.exception("after-commit callback %r failed", cb)
            continue
        if inspect.isawaitable(result):
            _schedule(result)


def _schedule(awaitable: Any) -> None:
    async def run() -> None:
        try:
            await awaitable
        except Exception:
            log.exception("after-commit callback failed")

    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        run_blocking(run(), "after_commit")
        return
    task = loop.create_task(run())
    _pending.add(task)
    task.add_done_callback(_pending.discard)


async def wait_pending() -> None:
    """Wait for after-commit callbacks that were scheduled on this loop (``Queue.idle()``)."""
    loop = asyncio.get_running_loop()
    while True:
        mine = [t for t in _pending if t.get_loop() is loop and not t.done()]
        if not mine:
            return
        await asyncio.gather(*mine, return_exceptions=True)
