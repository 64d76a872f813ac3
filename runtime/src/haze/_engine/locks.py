"""Unique locks and debounce: the store keys that decide whether a dispatch or a run happens.

A unique job takes ``haze:unique:<job>:<key>`` at dispatch (skipped while another
message holds it) and releases it when it ends, or when it starts for
``until="processing"``. A debounced job writes its id under ``haze:debounce:<job>:<key>``
at dispatch; a run whose id is no longer there was superseded and is skipped.
"""

from __future__ import annotations

import asyncio
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

#: how long releasing a lock is tried again while its store cannot be reached
RELEASE_SECONDS = 2.0
#: how long a release the store could not take then goes on in the background
RELEASE_BACKGROUND_SECONDS = 300.0
#: how long an app's stop waits for the releases still going on in the background
STOP_RELEASE_SECONDS = 2.0


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
        #: key -> the background release of a failed dispatch's lock (see _release)
        self._releasing: dict[str, asyncio.Task[bool]] = {}

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
        if self._releasing:
            await self._released(key)
        # The holder's lock can expire between a failed add and the get: try again
        # rather than report a skip with no holder id.
        for _ in range(3):
            try:
                taken = await store.add(key, message.id, opts.ttl)
                holder = None if taken else await store.get(key)
            except OSError:  # BackendUnavailableError
                # The add may have been written before its reply was lost: a lock named
                # for this message (and only such a one) goes with the failed dispatch.
                await self._release(key, message.id)
                raise
            # holder == message.id: a client that sent the add again on a fresh
            # connection after its reply was lost (redis-py's retry) found this lock
            if taken or holder == message.id:
                message.unique = {"key": key, "until": opts.until}
                return None
            if holder is not None:
                return str(holder)
        raise HazeError(
            f'job "{job.name}": the unique lock {key!r} kept changing hands; dispatch again'
        )

    async def unlock(self, message: Message) -> None:
        if message.unique is None:
            return
        await self._release(message.unique["key"], message.id)

    async def discard(self, key: str) -> None:
        """Delete ``key`` whoever wrote it (the status record of a dispatch that raised),
        asked again while the store cannot take it, as a lock's release is: a record
        left behind would say queued for a job that never was."""
        await self._release(key, None)

    async def _release(self, key: str, owner: str | None) -> None:
        """Delete ``key`` if ``owner`` holds it. A lock left behind blocks its key for its
        whole ``for`` with no job to release it, so a delete the store cannot take now
        (a connection killed under it is not the store gone) is asked again for up to
        ``RELEASE_SECONDS``, then goes on in the background for up to
        ``RELEASE_BACKGROUND_SECONDS``; a dispatch of the key in this process waits for
        it first."""
        if await self._try_release(key, owner, RELEASE_SECONDS):
            return
        task = asyncio.get_running_loop().create_task(
            self._try_release(key, owner, RELEASE_BACKGROUND_SECONDS, last=True)
        )
        self._releasing[key] = task
        task.add_done_callback(
            lambda t: self._releasing.pop(key) if self._releasing.get(key) is t else None
        )

    async def finish_releases(self) -> None:
        """At the app's stop: wait (a little) for this loop's background releases; name
        the keys still there after that (the loop and the store go with the app, so a
        release dropped silently would leave a key blocked with no job to free it)."""
        loop = asyncio.get_running_loop()
        tasks = {k: t for k, t in self._releasing.items() if t.get_loop() is loop}
        if not tasks:
            return
        await asyncio.wait(set(tasks.values()), timeout=STOP_RELEASE_SECONDS)
        for key, task in tasks.items():
            if not task.done():
                task.cancel()
                log.warning(
                    "%s of a dispatch that failed could not be deleted before the app "
                    "stopped (its store is unreachable): it stays until it expires",
                    key,
                )

    async def _released(self, key: str) -> None:
        """Wait (a little) for this process's background release of ``key``, if any."""
        task = self._releasing.get(key)
        if task is not None and task.get_loop() is asyncio.get_running_loop():
            await asyncio.wait({task}, timeout=RELEASE_SECONDS)

    async def _try_release(
        self, key: str, owner: str | None, seconds: float, last: bool = False
    ) -> bool:
        """True once the delete went through (or failed for good: logged)."""
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        pause = 0.01
        while True:
            try:
                await self.stores.state().delete(key, owner=owner)
                return True
            except Exception as e:
                # OSError (BackendUnavailableError): the store's server is unreachable, so
                # try again until ``seconds`` pass; anything else fails for good
                unreachable = isinstance(e, OSError)
                if not unreachable or loop.time() + pause > end:
                    if last or not unreachable:
                        log.exception("could not delete %s of a dispatch that failed", key)
                    return not unreachable
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.2)

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
