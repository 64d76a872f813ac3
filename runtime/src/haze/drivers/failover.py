"""The ``failover`` connection: dispatch to the first listed connection that can take the job.

``config/queue.py``::

    "main": {"driver": "failover", "connections": ["redis", "database"]}

- **Dispatch** (``enqueue``, and ``enqueue_many`` for ``Queue.bulk`` and batches) tries
  each listed connection in order. It moves on to the next one only when a connection's
  backend cannot be reached (what its driver counts as an outage: Redis refusing
  connections, a database that is down or locked). Any other error, such as a payload over
  the size limit, is raised at once: the next connection would refuse it too. So is
  ``DispatchOutcomeUnknownError`` (the connection lost its reply and the job may be
  queued there): sent to the next connection too, it could run twice.
- **Logs.** The first dispatch that skips a connection logs one warning naming it and the
  connection that took the job; later dispatches during the same outage log at INFO, and
  the connection taking jobs again is logged at INFO too.
- **Workers** consume the real connections, one ``haze queue:work --connection NAME``
  per listed connection. The failover connection itself has nothing to consume.
- The message keeps ``"connection": "<failover name>"``: chain links, batch callbacks and
  ``queue:retry`` of a failed job dispatch through the failover connection again.
- ``size``/``purge`` add up the listed connections; failed jobs are the union of theirs.
- A bulk dispatch goes to one connection as a whole. A backend that fails midway through
  a bulk write may have kept part of it, and those jobs are then queued on the next
  connection too (at least once, never lost).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, ClassVar

from haze._base.errors import BackendUnavailableError, ConfigError, DispatchOutcomeUnknownError
from haze._base.message import Message
from haze._failed import FailedJobsUnion
from haze.contracts.driver import DispatchOnly, Driver, FailedJob, Reserved, unavailable
from haze.drivers.context import DriverContext

__all__ = ["FailoverDriver"]

log = logging.getLogger("haze.drivers.failover")


class FailoverDriver(DispatchOnly):
    """Dispatch-only connection over other connections; see the module docstring."""

    #: the config options it takes; a dispatch-only connection takes none of the common
    #: ones (``DeclaresOptions``)
    options: ClassVar[Mapping[str, str]] = {"connections": "names"}

    inline = False
    #: every listed connection was tried: the error names each one's reason
    outage_errors: tuple[type[BaseException], ...] = (BackendUnavailableError,)

    def __init__(self, name: str, options: dict[str, Any], context: DriverContext):
        self.name = name
        names: list[str] = list(options.get("connections") or [])
        if not names:
            raise ConfigError("is required for failover", key=f"connections.{name}.connections")
        self.members: list[Driver] = [context.driver(n) for n in names]
        # The two engine calls a member needs: an inline member runs the job here, a
        # local one needs this process's consumer. Kept, not the context.
        self._run_inline = context.run_inline
        self._ensure_local_worker = context.ensure_local_worker
        #: Never consumed in this process under its own name (the listed connections
        #: are, by their own workers): the manager must not start a local worker for it.
        self.remote = True
        # A plain-function callback can only travel if every connection it may land on
        # runs in this process.
        self.local_callbacks = all(m.local_callbacks for m in self.members)
        limits = [m.max_message_size for m in self.members if m.max_message_size is not None]
        #: the smallest limit: a message that fits goes to any of the connections
        self.max_message_size: int | None = min(limits) if limits else None
        self.failed = FailedJobsUnion(lambda: [m.failed for m in self.members])
        self._down: set[str] = set()

    # -- producer -----------------------------------------------------------------

    async def enqueue(self, body: str, message: Message, delay: float) -> None:
        async def send(member: Driver) -> None:
            if member.inline:
                await self._run_inline(message, body, member)
            else:
                await member.enqueue(body, message, delay)

        await self._first_that_takes(send, f"job {message.id}")

    async def enqueue_many(self, items: Sequence[tuple[str, Message, float]]) -> None:
        if not items:
            return

        async def send(member: Driver) -> None:
            if member.inline:
                for body, message, _ in items:
                    await self._run_inline(message, body, member)
            else:
                await member.enqueue_many(items)

        await self._first_that_takes(send, f"{len(items)} job(s)")

    async def _first_that_takes(self, send: Callable[[Driver], Awaitable[None]], what: str) -> None:
        reasons: list[str] = []
        for member in self.members:
            try:
                await send(member)
            except DispatchOutcomeUnknownError:
                raise  # it may be queued there: sent to the next too, it could run twice
            except Exception as e:
                down = unavailable(member, e) if not member.inline else None
                if down is None:
                    raise  # not an outage: the next connection would refuse it too
                reasons.append(f"{member.name!r}: {down}")
                self._went_down(member, down)
                continue
            if not member.remote and not member.inline:
                self._ensure_local_worker(member.name)
            self._took(member, what, skipped=len(reasons))
            return
        raise BackendUnavailableError(
            f"failover connection {self.name!r}: no listed connection could take {what} "
            f"({'; '.join(reasons)})"
        ) from None

    def _went_down(self, member: Driver, error: BaseException) -> None:
        if member.name in self._down:
            return
        self._down.add(member.name)
        log.warning(
            "haze: failover connection %r: %s; dispatching to the next listed connection "
            "until it is back",
            self.name,
            error,
        )

    def _took(self, member: Driver, what: str, *, skipped: int) -> None:
        if member.name in self._down:
            self._down.discard(member.name)
            log.info(
                "haze: failover connection %r: connection %r takes jobs again",
                self.name,
                member.name,
            )
        if skipped:
            log.info(
                "haze: failover connection %r: %s went to connection %r",
                self.name,
                what,
                member.name,
            )

    # -- consumer: none -----------------------------------------------------------

    def no_consumer(self) -> ConfigError:
        """The error for a worker pointed at this connection (it has nothing to claim)."""
        real = ", ".join(m.name for m in self.members)
        return ConfigError(
            f"{self.name!r} is a failover connection: it only dispatches, to the first of "
            f"{real} that is reachable. Run one worker per listed connection instead "
            f"(haze queue:work --connection NAME, for each of {real})",
            key=f"connections.{self.name}",
        )

    async def reserve(self, queues: Sequence[str], wait: float) -> Reserved | None:
        raise self.no_consumer()

    async def ack(self, job: Reserved) -> None:
        raise self.no_consumer()

    async def release(self, job: Reserved, delay: float, *, consume_attempt: bool) -> None:
        raise self.no_consumer()

    async def fail(self, job: Reserved, failed: FailedJob) -> None:
        raise self.no_consumer()

    # -- inspection ---------------------------------------------------------------

    async def size(self, queue: str) -> int:
        return sum([await m.size(queue) for m in self.members])

    async def purge(self, queue: str) -> int:
        return sum([await m.purge(queue) for m in self.members])

    async def close(self) -> None:
        return None  # the listed connections belong to the app, which closes them
