"""Crash points for the crash-injection suites (``test_batch_crash``, ``test_schedule_crash``).

A "crash" is simulated deterministically: :class:`CrashingStore` wraps a real store and
counts its writes (put/add/increment/touch/delete/settle_batch_job) on an
:class:`Injector`; the suites count their queue driver's writes on the same injector.
The k-th write raises :class:`Crash` instead of happening. Not a test module: the
Pyodide contract run leaves out both suites that import it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from haze.stores import Store


class Crash(BaseException):
    """The simulated SIGKILL.

    A ``BaseException`` so that no handler in haze swallows it, as nothing runs after a
    SIGKILL."""


class Injector:
    """Counts writes and raises :class:`Crash` at write number ``crash_at``.

    ``stay_dead``: every write after the crash raises too (a process that died does not
    write again); without it, later writes are counted and happen (the batch suite
    redelivers the message on the same store, as a fresh worker would).
    ``armed = False`` stops counting and crashing altogether (the schedule suite's second
    scheduler shares the store with the dead first one)."""

    def __init__(self, crash_at: int | None, *, stay_dead: bool = False) -> None:
        self.crash_at = crash_at
        self.stay_dead = stay_dead
        self.armed = True
        self.writes = 0
        self.crashed: str | None = None

    def tick(self, what: str) -> None:
        if not self.armed:
            return
        if self.stay_dead and self.crashed is not None:
            raise Crash(f"already dead, {what}")
        self.writes += 1
        if self.writes == self.crash_at:
            self.crashed = f"write {self.writes} ({what})"
            raise Crash(self.crashed)


class CrashingStore:
    """The store under test, with a crash point before each write."""

    def __init__(self, inner: Store, injector: Injector) -> None:
        self.inner = inner
        self.injector = injector
        self.name = inner.name
        self.atomic = inner.atomic
        self.shared = inner.shared

    async def get(self, key: str) -> Any:
        return await self.inner.get(key)

    async def get_many(self, keys: Sequence[str]) -> list[Any]:
        return await self.inner.get_many(keys)

    async def ttl(self, key: str) -> float | None:
        return await self.inner.ttl(key)

    async def put(self, key: str, value: Any, ttl: float | None = None) -> None:
        self.injector.tick(f"put {key}")
        await self.inner.put(key, value, ttl)

    async def add(self, key: str, value: Any, ttl: float | None = None) -> bool:
        self.injector.tick(f"add {key}")
        return await self.inner.add(key, value, ttl)

    async def increment(self, key: str, by: int = 1, ttl: float | None = None) -> int:
        self.injector.tick(f"increment {key}")
        return await self.inner.increment(key, by, ttl)

    async def touch(self, key: str, owner: Any, ttl: float) -> bool:
        self.injector.tick(f"touch {key}")
        return await self.inner.touch(key, owner, ttl)

    async def delete(self, key: str, owner: Any = None) -> bool:
        self.injector.tick(f"delete {key}")
        return await self.inner.delete(key, owner)

    async def settle_batch_job(self, batch: str, job: str, outcome: str, **kw: Any) -> Any:
        self.injector.tick(f"settle {job} {outcome}")
        return await self.inner.settle_batch_job(batch, job, outcome, **kw)

    async def close(self) -> None:
        return None  # the contract fixture closes the real store
