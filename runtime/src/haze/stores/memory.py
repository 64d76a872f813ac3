"""The ``memory`` store: a dict with expiry, for one process (tests, dev, Pyodide)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from haze.contracts.store import BatchSettled
from haze.stores.workflow_state import KeyValueWorkflowState

__all__ = ["MemoryStore"]

_monotonic = time.monotonic


class MemoryStore:
    """Atomic within one process: every method runs without awaiting, so the event loop
    cannot interleave two of them. Not shared between processes.

    >>> store = MemoryStore()
    """

    #: the config options it takes besides ``driver`` (``DeclaresOptions``)
    options: ClassVar[Mapping[str, str]] = {}
    _workflow_state: KeyValueWorkflowState | None = None
    atomic = True
    shared = False

    def __init__(
        self, name: str = "memory", options: dict[str, Any] | None = None, app: Any = None
    ):
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

    def workflow_state(self) -> KeyValueWorkflowState:
        """Workflow runs kept in this store (``HasWorkflowState``)."""
        if self._workflow_state is None:
            self._workflow_state = KeyValueWorkflowState(self)
        return self._workflow_state

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

    async def add_listed(self, key: str, value: Any, counter: str, listed: Any) -> bool:
        # no await between the three: nothing else runs in between
        if self._live(key) is not None:
            return False
        self._data[key] = (value, None)
        item = self._live(counter)
        n = 1 if item is None else int(item[0]) + 1
        self._data[counter] = (n, None if item is None else item[1])
        self._data[f"{counter}:{n}"] = (listed, None)
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

    async def touch(self, key: str, owner: Any, ttl: float) -> bool:
        item = self._live(key)
        if item is None or item[0] != owner:
            return False
        self._data[key] = (item[0], _monotonic() + ttl)
        return True

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
        # No await in here: the event loop cannot run anything else in between.
        expires = None if ttl is None else _monotonic() + ttl
        marker = self._live(f"{batch}:done:{job}")
        if marker is None:
            self._data[f"{batch}:done:{job}"] = (outcome, expires)
            if outcome == "failed":
                n = self._incr(f"{batch}:failed", count, expires)
                self._data[f"{batch}:failed:{n}"] = (job, expires)
                if cancel and self._live(f"{batch}:cancelled") is None:
                    self._data[f"{batch}:cancelled"] = (now, expires)
            else:
                self._incr(f"{batch}:processed", count, expires)
            if keep > 0 and (n := self._incr(f"{batch}:jobs", 1, expires)) <= keep:
                self._data[f"{batch}:jobs:{n}"] = (job, expires)
            return BatchSettled(True, self._incr(f"{batch}:pending", -count, expires), outcome)
        first = str(marker[0])
        if outcome == "done" and first == "failed" and not self._live(f"{batch}:recovered:{job}"):
            self._data[f"{batch}:recovered:{job}"] = (1, expires)
            self._incr(f"{batch}:recovered", 1, expires)
            self._incr(f"{batch}:processed", 1, expires)
        pending = self._live(f"{batch}:pending")
        return BatchSettled(False, 0 if pending is None else int(pending[0]), first)

    def _incr(self, key: str, by: int, expires: float | None) -> int:
        item = self._live(key)
        value = by if item is None else int(item[0]) + by
        self._data[key] = (value, expires if item is None else item[1])
        return value

    async def close(self) -> None:
        return None

    def clear(self) -> None:
        self._data.clear()
