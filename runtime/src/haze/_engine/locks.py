"""Unique locks and debounce: the store keys that decide whether a dispatch or a run happens.

A unique job takes ``haze:unique:<job>:<key>`` at dispatch (skipped while another
message holds it) and releases it when it ends, or when it starts for
``until="processing"``. A debounced job writes its id under ``haze:debounce:<job>:<key>``
at dispatch; a run whose id is no longer there was superseded and is skipped.
"""

from __future__ import annotations

import inspect
import logging
import time
from typing import TYPE_CHECKING, Any

from haze._base.crypto import keyed_digest
from haze._base.errors import HazeError, KeyFunctionError
from haze._engine.hooks import Outcome, Run
from haze._jobs.context import current_tenant

if TYPE_CHECKING:
    from haze._base.message import Message
    from haze._engine.stores import EngineStores
    from haze._engine.view import EngineApp
    from haze._jobs.definition import JobDefinition
    from haze.contracts.driver import Driver

__all__ = ["Locks", "UniqueRelease", "scoped_key"]

log = logging.getLogger("haze")
_time = time.time


def scoped_key(kind: str, *parts: object) -> str:
    """A store key scoped by the current tenant (locks and middleware state)."""
    tenant = current_tenant()
    rest = ":".join(str(p) for p in parts)
    return f"haze:{kind}:{tenant}:{rest}" if tenant else f"haze:{kind}:{rest}"


class Locks:
    """Unique locks and debounce keys of one app."""

    def __init__(self, app: EngineApp, stores: EngineStores) -> None:
        self.app = app
        self.stores = stores

    async def _key(self, kind: str, job: JobDefinition[Any], key_fn: Any, message: Message) -> str:
        suffix = ""
        if key_fn is not None:
            try:
                value = key_fn(job.from_wire(message.payload))
                if inspect.isawaitable(value):
                    value = await value
            except Exception as e:
                said = (str(e).splitlines() or [""])[0]  # the error stays one line
                raise KeyFunctionError(
                    f'Job "{job.name}": its {kind} key function raised {type(e).__name__}: '
                    f"{said} for this payload; nothing was queued"
                ) from e
            # An encrypted job's key is often a field of its secret payload: keep a keyed
            # hash of it, not the value.
            suffix = keyed_digest(self.app, str(value)) if job.encrypted else str(value)
        return scoped_key(kind, job.name, suffix)

    async def lock(self, job: JobDefinition[Any], message: Message, driver: Driver) -> str | None:
        """Take the unique lock for ``message``; returns the holder's id when it is taken."""
        opts = job.unique
        assert opts is not None
        key = await self._key("unique", job, opts.key, message)
        store = self.stores.state()
        if self.app.recorder is None:
            self.stores.check(store, driver, "unique jobs")
        # The holder's lock can expire between a failed add and the get: try again
        # rather than report a skip with no holder id.
        for _ in range(3):
            if await store.add(key, message.id, opts.ttl):
                message.unique = {"key": key, "until": opts.until}
                return None
            holder = await store.get(key)
            if holder is not None:
                return str(holder)
        raise HazeError(
            f'job "{job.name}": the unique lock {key!r} kept changing hands; dispatch again'
        )

    async def unlock(self, message: Message) -> None:
        if message.unique is None:
            return
        try:
            await self.stores.state().delete(message.unique["key"], owner=message.id)
        except Exception:
            log.exception("could not release unique lock %s", message.unique.get("key"))

    async def debounce(self, job: JobDefinition[Any], message: Message, delay: float) -> float:
        """Make ``message`` the latest of its burst; returns how long it waits."""
        opts = job.debounce
        assert opts is not None
        key = await self._key("debounce", job, opts.key, message)
        store = self.stores.state()
        now = _time()
        wait = max(delay, opts.wait)
        ttl = (opts.max_wait or opts.wait) + wait + 60
        if opts.max_wait is not None:
            await store.add(key + ":first", now, ttl)
            first = await store.get(key + ":first")
            if first is not None:
                wait = max(0.0, min(wait, float(first) + opts.max_wait - now))
        await store.put(key, message.id, ttl)
        message.meta = {**(message.meta or {}), "debounce": key}
        return wait

    async def superseded(self, job: JobDefinition[Any], message: Message) -> bool:
        """Whether a later dispatch of the burst replaced this debounced message."""
        assert message.meta is not None
        key = message.meta["debounce"]
        store = self.stores.state()
        latest = await store.get(key)
        max_wait = job.debounce.max_wait if job.debounce is not None else None
        if latest is not None and latest != message.id:
            # superseded: skip, unless the burst has waited max_wait already (a stream
            # of dispatches faster than the workers must not postpone the job forever)
            first = None
            if max_wait is not None:
                first = await store.get(key + ":first")
            if first is None or max_wait is None or _time() < float(first) + max_wait:
                return True
        if max_wait is not None:
            # the burst is over: the next dispatch starts a new max_wait window
            await store.delete(key + ":first")
        return False


class UniqueRelease:
    """Outcome hook: a unique job's lock goes when the job ends (after the failed record
    for a failure, so a new dispatch cannot start before the failure is kept)."""

    plain_quiet = True  # wants() is False for a plain success (PlainQuiet)

    def __init__(self, locks: Locks) -> None:
        self.locks = locks

    def wants(self, run: Run) -> bool:
        return run.message.unique is not None

    async def settling(self, run: Run) -> None:
        if run.outcome in (Outcome.SUCCESS, Outcome.CANCELLED, Outcome.SKIPPED):
            await self.locks.unlock(run.message)

    async def settled(self, run: Run) -> None:
        if run.outcome == Outcome.FAILED:
            await self.locks.unlock(run.message)
