"""The ``Store`` protocol: the small atomic key/value surface the queue manager needs.

Unique locks, middleware state (rate limits, overlap locks, exception throttles),
worker signals (restart, pause) and batch state all live in a store. Every store
must offer atomic add-if-absent with a TTL, atomic increment and an owner-checked
delete; a store that cannot (Cloudflare KV) sets ``atomic = False`` and the manager
logs a warning when it is used for locks or batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

__all__ = ["Store"]


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

    async def close(self) -> None:
        """Release connections."""
