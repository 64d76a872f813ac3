"""Callbacks of chains and batches: a job reference anywhere, a plain function where the
dispatching process also runs the jobs (sync, memory).

A job reference travels as its JSON link and is dispatched when due; a function stays
in this process under a random id. A callback dispatched with a claim key (``once``)
runs once however many times it is dispatched: the first message to claim the key owns
it (a redelivery of that message still does), every other one is skipped.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from haze._base.message import new_id
from haze._engine.offload import Offload
from haze._jobs.definition import DispatchResult, JobDefinition, PendingDispatch, link_to_pending

if TYPE_CHECKING:
    from haze._engine.stores import EngineStores
    from haze._engine.view import EngineApp

__all__ = ["Callbacks"]

log = logging.getLogger("haze")

Dispatch = Callable[..., Awaitable[DispatchResult]]


class Callbacks:
    """Plain-function callbacks of one app, and how any callback runs."""

    def __init__(
        self, app: EngineApp, stores: EngineStores, dispatch: Dispatch, offload: Offload
    ) -> None:
        self.app = app
        self.offload = offload
        self.stores = stores
        self._dispatch = dispatch
        self._local: dict[str, Callable[..., Any]] = {}  # id -> function

    def ref(self, cb: object, connection: str, where: str) -> dict[str, Any]:
        """Serialise a callback: a job reference anywhere, a function on sync/memory only."""
        if isinstance(cb, PendingDispatch):
            return cb.to_link(self.app)
        if isinstance(cb, JobDefinition):
            return PendingDispatch(cb, None).to_link(self.app)
        if callable(cb):
            driver = self.app.driver(connection)
            if not driver.local_callbacks:
                raise ValueError(
                    f"{where}: a plain function cannot travel to the workers of connection "
                    f'"{connection}" (driver {type(driver).__name__}); pass a job reference '
                    "such as cleanup.with_({...}) instead"
                )
            ref = new_id()
            self._local[ref] = cb
            return {"fn": ref}
        raise ValueError(f"{where}: expected a job reference or a function, got {cb!r}")

    def forget(self, refs: Any) -> None:
        """Drop plain-function callbacks that can no longer fire (no leak in long apps)."""
        for ref in refs or ():
            if isinstance(ref, dict) and "fn" in ref:
                self._local.pop(ref["fn"], None)

    async def claim_once(self, key: str, owner: str, ttl: float | None = None) -> bool:
        """True when ``owner`` (a message id) may run the callback claimed by ``key``,
        kept ``ttl`` seconds (None: as long as batches are kept)."""
        store = self.stores.batches()
        ttl = self.app.queue_config.batches_ttl if ttl is None else ttl
        if await store.add(key, owner, ttl):
            return True
        return bool(await store.get(key) == owner)

    async def run(
        self, ref: dict[str, Any], args: tuple[Any, ...], *, once: str | None = None, **opts: Any
    ) -> None:
        """Dispatch a job-reference callback, or call a local function with ``args``
        (with ``once``: only one of any number of dispatches runs)."""
        if "fn" not in ref:
            meta = None if once is None else {"once": once}
            # an offloaded payload stays in the store: a callback may run again
            ref = await self.offload.restore_link(ref)
            await self._dispatch(link_to_pending(ref, self.app), meta=meta, **opts)
            return
        fn = self._local.get(ref["fn"])
        if fn is None:
            log.warning("a callback function is no longer registered in this process")
            return
        if once is not None and not await self.claim_once(once, new_id()):
            return  # a call is never redelivered: a fresh owner claims or loses
        try:
            result = fn(*args)
            if inspect.isawaitable(result):
                await result
        except Exception:
            log.exception("callback %r raised", fn)
