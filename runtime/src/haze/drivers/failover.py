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
- A bulk dispatch goes to one connection. When that connection queued part of it before
  its backend went away, only the messages it did not queue go on to the next one; those
  whose send lost its reply (they may be queued) are never sent again, and the bulk
  raises ``DispatchIncompleteError`` listing them in ``unknown``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from haze._base.describe import error_line
from haze._base.errors import (
    BackendUnavailableError,
    ConfigError,
    DispatchIncompleteError,
    DispatchOutcomeUnknownError,
)
from haze._base.message import Message
from haze._failed import FailedJobsUnion
from haze.contracts.driver import DispatchOnly, Driver, FailedJob, Reserved, unavailable
from haze.drivers._parts import Item, counts
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
        await self._first_that_takes([(body, message, delay)], many=False)

    async def enqueue_many(self, items: Sequence[Item]) -> None:
        if items:
            await self._first_that_takes(items, many=True)

    async def _send(self, member: Driver, items: Sequence[Item], many: bool) -> None:
        if member.inline:
            for body, message, _ in items:
                await self._run_inline(message, body, member)
        elif many:
            await member.enqueue_many(items)
        else:
            await member.enqueue(*items[0])

    async def _first_that_takes(self, items: Sequence[Item], *, many: bool) -> None:
        """Send ``items`` to the first connection that takes them. A bulk that a
        connection queued in part before its backend went away goes on to the next
        connection with only the messages surely not queued."""
        what = f"{len(items)} job(s)" if many else f"job {items[0][1].id}"
        left, unknown, reasons = list(items), list[str](), list[str]()
        partial: BackendUnavailableError | DispatchIncompleteError | None = None  # a part queued
        for member in self.members:
            try:
                await self._send(member, left, many)
            except DispatchIncompleteError as e:
                unknown += e.unknown
                down = self._outage(member, e.__cause__)
                if down is None:
                    raise self._incomplete(items, e.failed, unknown, e) from None
                left, partial = [i for i in left if i[1].id in e.failed], partial or e
                if not member.remote:
                    self._ensure_local_worker(member.name)  # it queued the rest
                reasons.append(f"{member.name!r}: {down}")
                self._went_down(member, down)
                if not left:
                    raise self._incomplete(items, {}, unknown, e) from None
                continue
            except DispatchOutcomeUnknownError as e:
                # its first part may be queued there; the parts after it were not sent
                maybe = set(e.job_ids)
                rest = [i for i in left if i[1].id not in maybe]
                if not many or not rest or len(rest) == len(left):
                    if partial is None:
                        raise  # sent to the next too, it could run twice
                    raise self._incomplete(items, _ids(rest, e), unknown + list(maybe), e) from None
                unknown += [m.id for _, m, _ in left if m.id in maybe]
                left, partial = rest, partial or e
                reasons.append(f"{member.name!r}: {error_line(e)}")
                self._went_down(member, e)
                continue
            except Exception as e:
                down = self._outage(member, e)
                if partial is None and down is None:
                    raise  # not an outage: the next connection would refuse it too
                if down is None:
                    raise self._incomplete(items, _ids(left, e), unknown, e) from None
                reasons.append(f"{member.name!r}: {down}")
                self._went_down(member, down)
                continue
            if not member.remote and not member.inline:
                self._ensure_local_worker(member.name)
            self._took(member, what, skipped=len(reasons))
            if partial is not None and unknown:
                raise self._incomplete(items, {}, unknown, partial) from None
            return
        why = f"no listed connection could take {what} ({'; '.join(reasons)})"
        if partial is not None:
            raise self._incomplete(items, {m.id: why for _, m, _ in left}, unknown, partial)
        raise BackendUnavailableError(f"failover connection {self.name!r}: {why}") from None

    def _outage(
        self, member: Driver, error: BaseException | None
    ) -> BackendUnavailableError | None:
        """``error`` as the outage of ``member``'s backend, or None (another error)."""
        if error is None or member.inline:
            return None
        return unavailable(member, error)

    def _incomplete(
        self,
        items: Sequence[Item],
        failed: dict[str, str],
        unknown: list[str],
        cause: BaseException,
    ) -> DispatchIncompleteError:
        """The error of a bulk whose messages were queued on the listed connections
        but those ``failed`` names (surely not queued) and ``unknown`` lists."""
        queued = len(items) - len(failed) - len(unknown)
        error = DispatchIncompleteError(
            f"failover connection {self.name!r} {counts(queued, failed, unknown)} "
            f"({error_line(cause)})",
            failed=failed,
            unknown=unknown,
        )
        error.__cause__ = cause
        return error

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


def _ids(items: Sequence[Item], error: BaseException) -> dict[str, str]:
    """Each of ``items`` not queued, with ``error`` as the reason."""
    why = error_line(error)
    return {m.id: why for _, m, _ in items}
