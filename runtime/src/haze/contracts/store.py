"""The ``Store`` protocol: the small atomic key/value surface the queue manager needs.

Unique locks, middleware state (rate limits, overlap locks, exception throttles),
worker signals (restart, pause) and batch state all live in a store. Every store
must offer atomic add-if-absent with a TTL, atomic increment and an owner-checked
delete; a store that cannot (Cloudflare KV) sets ``atomic = False`` and the manager
logs a warning when it is used for locks or batches. Batches also need
``settle_batch_job``: one job's count in one atomic step; concurrency limits need
``touch``: an owner-checked lease renewal.

A store whose backend can push messages (Redis pub/sub, PostgreSQL LISTEN/NOTIFY)
also implements ``StatusNotifier``: ``Queue.wait`` then wakes on the final status
write instead of polling for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, NamedTuple, Protocol, runtime_checkable

__all__ = ["AddsListed", "BatchSettled", "StatusNotifier", "Store", "Subscription"]


class BatchSettled(NamedTuple):
    """What ``Store.settle_batch_job`` did."""

    #: True when this call counted the job; False when it had been counted already.
    counted: bool
    #: The batch's ``pending`` counter after the call (0 when absent).
    pending: int
    #: The outcome the job is counted with: this call's, or the earlier one's.
    outcome: str


@runtime_checkable
class Store(Protocol):
    """Key/value operations used by locks, middleware and batches. Values are JSON data."""

    name: str
    atomic: bool
    #: True when every process sharing the config sees the same data (redis, database).
    shared: bool

    async def get(self, key: str) -> Any | None:
        """The value under ``key``, or None when absent or expired."""

    async def get_many(self, keys: Sequence[str]) -> list[Any | None]:
        """Values for several keys in one round trip, None where absent."""

    async def put(self, key: str, value: Any, ttl: float | None = None) -> None:
        """Set ``key`` unconditionally; ``ttl`` in seconds (None = no expiry)."""

    async def add(self, key: str, value: Any, ttl: float | None = None) -> bool:
        """Set ``key`` only if absent (atomically). True when this call set it."""

    async def increment(self, key: str, by: int = 1, ttl: float | None = None) -> int:
        """Atomically add ``by`` (may be negative) and return the new value; absent = 0.

        ``ttl`` applies when the key is created by this call.
        """

    async def delete(self, key: str, owner: Any | None = None) -> bool:
        """Delete ``key``; with ``owner``, only when the stored value equals it. True if deleted."""

    async def ttl(self, key: str) -> float | None:
        """Seconds until ``key`` expires, None when absent or without expiry."""

    async def touch(self, key: str, owner: Any, ttl: float) -> bool:
        """Make ``key`` expire ``ttl`` seconds from now, only while it holds ``owner``
        (a lease renewal, atomic on atomic stores). True when renewed; False when the key
        is absent, expired or held by someone else (the lease was lost).

        >>> # await store.add("slot:0", "run-1", ttl=30)   # take the lease
        >>> # await store.touch("slot:0", "run-1", ttl=30)  # True: 30 s more
        """

    async def settle_batch_job(
        self,
        batch: str,
        job: str,
        outcome: str,
        *,
        count: int = 1,
        cancel: bool = False,
        now: float = 0.0,
        ttl: float | None = None,
        keep: int = 0,
    ) -> BatchSettled:
        """Count ``job`` of the batch whose keys start with ``batch``, once, in one step.

        When ``<batch>:done:<job>`` is absent: set it to ``outcome``; add ``count`` to
        ``<batch>:failed`` (``outcome == "failed"``, also writing the job id under
        ``<batch>:failed:<n>`` for the new value n) or else to ``<batch>:processed``;
        with ``cancel``, add ``<batch>:cancelled`` = ``now`` if absent; with ``keep``
        above 0, add 1 to ``<batch>:jobs`` and, while its new value n is at most
        ``keep``, write the job id under ``<batch>:jobs:<n>`` (the batch's job list,
        bounded); subtract ``count`` from ``<batch>:pending``. When the marker is there, the job was
        counted already: nothing changes, except that a job counted ``"failed"`` that
        now ends ``"done"`` (retried from failed jobs) moves once to processed
        (``<batch>:recovered:<job>`` marker, ``<batch>:recovered`` counter).
        Keys created here get ``ttl``. Atomic stores do all of it atomically, so a
        crash leaves either nothing or everything.

        >>> # await store.settle_batch_job("haze:batch:b1", "job-7", "done", ttl=3600)
        >>> # BatchSettled(counted=True, pending=0, outcome='done')
        """

    async def close(self) -> None:
        """Release connections."""


@runtime_checkable
class AddsListed(Protocol):
    """A store that adds a key and numbers it in a listing in ONE atomic write (a Lua
    script on Redis, a transaction on SQL), so a crash leaves it either absent or both
    added and listed. Stores without it do the three writes one by one."""

    async def add_listed(self, key: str, value: Any, counter: str, listed: Any) -> bool:
        """When ``key`` is absent: set it to ``value``, increment ``counter`` to ``n``
        and set ``<counter>:<n>`` to ``listed``; True. Else change nothing; False.

        >>> # await store.add_listed("haze:wf:r1:run", {...}, "haze:wf:runs", "r1")
        """
        ...


class Subscription(Protocol):
    """Messages of one channel, from the moment ``StatusNotifier.subscribe`` entered."""

    async def receive(self, timeout: float) -> str | None:
        """The next message, or None when none came within ``timeout`` seconds. A
        message may be lost (a dropped connection): callers keep a slow poll."""


@runtime_checkable
class StatusNotifier(Protocol):
    """A store that can push a short message to the processes listening on a channel.

    ``subscribe`` is listening once it has been entered, so a message sent after that
    reaches the subscriber: subscribe first, then read the state it is about.

    >>> # async with store.subscribe("haze:final:job-1") as sub:
    >>> #     ... read the record once ...
    >>> #     await sub.receive(timeout=2.0)   # "done", or None
    >>> # await store.notify("haze:final:job-1", "done")   # in another process
    """

    async def notify(self, channel: str, message: str) -> None:
        """Send ``message`` to the current subscribers of ``channel`` (none: dropped)."""

    def subscribe(self, channel: str) -> AbstractAsyncContextManager[Subscription]:
        """Listen on ``channel`` for the duration of the ``async with`` block."""
