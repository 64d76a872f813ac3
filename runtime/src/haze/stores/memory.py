"""The ``memory`` store: a dict with expiry, for one process (tests, dev, Pyodide)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

__all__ = ["MemoryStore"]

_monotonic = time.monotonic


class MemoryStore:
    """Atomic within one process: every method runs without awaiting, so the event loop
    cannot interleave two of them. Not shared between processes.

    >>> store = MemoryStore()
    """

    atomic = True
    shared = False

    def __init__(self, name: str = "memory", options: dict[str, Any] | None = None):
        self.name = name
        self._data: dict[str, tuple[Any, float | None]] = {}

    def _live(self, key: str) -> tuple[Any, float | None] | None:
        item = self._data.get(key)
        if item is None:
            return None
        expires = item[1]
        if expires is not None and expires <= _monotonic():
            del self._data[key]
            return None
        return item

    async def get(self, key: str) -> Any | None:
        item = self._live(key)
        return None if item is None else item[0]

    async def get_many(self, keys: Sequence[str]) -> list[Any | None]:
        out: list[Any | None] = []
        for k in keys:
            item = self._live(k)
            out.append(None if item is None else item[0])
        return out

    async def put(self, key: str, value: Any, ttl: float | None = None) -> None:
        self._data[key] = (value, None if ttl is None else _monotonic() + ttl)

    async def add(self, key: str, value: Any, ttl: float | None = None) -> bool:
        if self._live(key) is not None:
            return False
        self._data[key] = (value, None if ttl is None else _monotonic() + ttl)
        return True

    async def increment(self, key: str, by: int = 1, ttl: float | None = None) -> int:
        item = self._live(key)
        if item is None:
            value = by
            self._data[key] = (value, None if ttl is None else _monotonic() + ttl)
        else:
            value = int(item[0]) + by
            self._data[key] = (value, item[1])
        return value

    async def delete(self, key: str, owner: Any | None = None) -> bool:
        item = self._live(key)
        if item is None:
            return False
        if owner is not None and item[0] != owner:
            return False
        del self._data[key]
        return True

    async def ttl(self, key: str) -> float | None:
        item = self._live(key)
        if item is None or item[1] is None:
            return None
        return max(0.0, item[1] - _monotonic())

    async def close(self) -> None:
        return None

    def clear(self) -> None:
        self._data.clear()
