"""Where a dispatched message goes: a ``Route`` per queue connection.

A connection is resolved once, on its first dispatch, into a route: its driver and
what the driver declares (it keeps plain messages, runs jobs inline, is consumed by
other processes, caps a message's size), the app's recorder and the state store its
records and locks go to. The dispatcher builds and encodes a message, then hands it to
the route: the route writes the status record, enqueues (or runs it inline on the
``sync`` driver), undoes the record and the lock when the enqueue failed, and makes
sure an in-process consumer takes it.

>>> # route = dispatcher.route("redis")
>>> # await route.send(message, body, payload, delay=0.0, keep=False)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from haze._base.errors import (
    DispatchIncompleteError,
    DispatchOutcomeUnknownError,
    PayloadTooLargeError,
)
from haze.contracts.driver import KeepsMessages, unavailable
from haze.contracts.plain import PlainQueue

if TYPE_CHECKING:
    from haze._base.message import Message
    from haze._engine.locks import Locks
    from haze._engine.tracking import Tracking
    from haze._engine.view import EngineApp
    from haze._jobs.definition import JobDefinition
    from haze.contracts.driver import Driver
    from haze.contracts.recorder import DispatchRecorder
    from haze.contracts.store import Store

__all__ = ["Route", "RunInline", "checked_size"]

#: Runs a message now, in the caller's context (the ``sync`` driver).
RunInline = Callable[["Message", str, "Driver"], Awaitable[None]]
#: (body, message, delay) of one message of a batch enqueue.
Item = tuple[str, "Message", float]


def checked_size(
    body: str, driver: Driver, job: JobDefinition[Any], *, offloaded: bool = False
) -> str:
    """``body`` unless it is over ``driver``'s size limit: ``PayloadTooLargeError``
    (``offloaded``: its payload already went to the store, so ``offload`` is no remedy)."""
    limit = driver.max_message_size
    if limit is not None:
        size = len(body) if body.isascii() else len(body.encode("utf-8"))
        if size > limit:
            what = f'job "{job.name}": the message is {size} bytes, over the {limit}-byte limit'
            raise PayloadTooLargeError(
                f'{what} of connection "{driver.name}" even with its payload offloaded; '
                'raise "max_message_size" or keep chain links small (nothing was enqueued)'
                if offloaded
                else f'{what} of connection "{driver.name}"; pass ids instead of data, or set '
                '"offload" on the connection ({"offload": {"to": "s3://bucket/prefix"}}) to '
                "send large payloads through an object store (nothing was enqueued)"
            )
    return body


class Route:
    """One queue connection of an app, resolved: its driver and where its records go."""

    __slots__ = (
        "_app",
        "_ensure_local_worker",
        "_locks",
        "_run_inline",
        "_tracking",
        "driver",
        "inline",
        "keeper",
        "name",
        "plain",
        "remote",
    )

    def __init__(
        self,
        app: EngineApp,
        name: str,
        driver: Driver,
        *,
        tracking: Tracking,
        locks: Locks,
        run_inline: RunInline,
        ensure_local_worker: Callable[[str], None],
    ) -> None:
        self._app = app
        self.name = name
        self.driver = driver
        #: the driver, when it keeps plain messages (checked once, here)
        self.keeper = driver if isinstance(driver, KeepsMessages) and not driver.inline else None
        self.inline = driver.inline
        self.remote = driver.remote
        #: the driver, when plain jobs take its short path (an in-process queue)
        local = self.keeper is not None and not self.remote
        self.plain = driver if local and isinstance(driver, PlainQueue) else None
        self._tracking = tracking
        self._locks = locks
        self._run_inline = run_inline
        self._ensure_local_worker = ensure_local_worker

    @property
    def recorder(self) -> DispatchRecorder | None:
        """The app's test recorder (read at each dispatch: a fake can be set any time)."""
        return self._app.recorder

    def state_store(self) -> Store:
        """Where status records and locks of this app's dispatches go."""
        return self._tracking.state_store()

    async def send(
        self, message: Message, body: str, payload: str, delay: float, *, keep: bool
    ) -> None:
        """The status record, then the driver (or the inline run). ``keep``: the message
        is plain and unencrypted, so a driver that keeps messages may keep it."""
        driver = self.driver
        tracked = message.meta is not None and "track" in message.meta
        if tracked:
            await self._tracking.queued(message, delay)
        try:
            if self.inline:
                await self._run_inline(message, body, driver)
            else:
                if keep and self.keeper is not None:
                    self.keeper.keep_next(message, body, payload)
                await driver.enqueue(body, message, delay)
        except BaseException as e:
            if self.inline:
                raise
            if not isinstance(e, DispatchOutcomeUnknownError):
                # the job may be queued: its lock and status record stay with it
                await self._undo(message, tracked)
            down = unavailable(driver, e) if isinstance(e, Exception) else None
            if down is not None:
                raise down from None  # one line, not the client library's traceback chain
            raise
        if not self.remote and not self.inline:
            self._ensure_local_worker(self.name)

    def keep(self, message: Message, payload: Any, delay: float) -> bool:
        """A plain, unencrypted, untracked message with its payload already copied
        (``copy_plain``): queued by the keeping driver with no body written. False: the
        driver did not keep it, and it goes through ``send``."""
        keeper = self.keeper
        if keeper is None or not keeper.keep(message, payload, delay):
            return False
        if not self.remote:
            self._ensure_local_worker(self.name)
        return True

    async def send_many(self, items: list[Item]) -> None:
        """Many built and encoded messages, with the driver's batch primitive."""
        driver = self.driver
        for _, message, delay in items:
            if message.meta is not None and "track" in message.meta:
                await self._tracking.queued(message, delay)
        if self.inline:
            for body, message, _ in items:
                await self._run_inline(message, body, driver)
            return
        try:
            await driver.enqueue_many(items)
        except Exception as e:
            # A status record may not outlive a job that was not queued: the driver
            # names those it did not queue, any other error means none was (a
            # cancellation says nothing of what went out: the records stay).
            lost = e.failed if isinstance(e, DispatchIncompleteError) else None
            maybe = e.job_ids if isinstance(e, DispatchOutcomeUnknownError) else ()
            for _, message, _ in items:
                if (lost is None or message.id in lost) and message.id not in maybe:
                    await self._undo(message, message.meta is not None and "track" in message.meta)
            down = unavailable(driver, e)
            if down is None:
                raise
            raise down from None
        if not self.remote:
            self._ensure_local_worker(self.name)

    async def _undo(self, message: Message, tracked: bool) -> None:
        """The enqueue failed: no record or lock may outlive a job that was not queued."""
        if tracked:
            # its reply may be lost while the store is unreachable: asked again, and
            # never in the way of the lock's release below
            await self._locks.discard(f"haze:status:{message.id}")
        if message.unique is not None:
            await self._locks.unlock(message)

    def __repr__(self) -> str:
        return f"<Route {self.name} -> {type(self.driver).__name__}>"
