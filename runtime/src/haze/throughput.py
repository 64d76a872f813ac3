"""Jobs finished per minute, per queue, counted by the workers in the queue store.

A worker of a remote connection (database, redis, sqs, cloudflare) counts each job it
finishes (done, failed, retried or released) in memory and adds the counts to per-minute
keys of the app's queue store at most every few seconds, so a job costs a dict update,
not a store write. ``haze queue:stats`` and ``queue:top`` read the last five minutes.
The store must be one every process shares (redis or database); with a process-local
store there is nothing to read, and the commands say so.

>>> minute_key("redis", "emails", 29_000_000)
'haze:throughput:redis:emails:29000000'
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .app import App

__all__ = ["FLUSH_EVERY", "WINDOW", "Tally", "minute_key", "per_minute"]

log = logging.getLogger("haze")

#: Seconds between two writes of a worker's counts.
FLUSH_EVERY = 5.0
#: Minutes ``per_minute`` averages over.
WINDOW = 5
_KEEP = 2 * 3600  # seconds a minute's key lives
_monotonic = time.monotonic


def minute_key(connection: str, queue: str, minute: int) -> str:
    return f"haze:throughput:{connection}:{queue}:{minute}"


class Tally:
    """One process's finished jobs not yet written to the store."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.counts: dict[tuple[str, str], int] = {}
        self.flushed = _monotonic()

    def add(self, connection: str, queue: str) -> bool:
        """Count one finished job; True when the counts are due to be written."""
        key = (connection, queue)
        self.counts[key] = self.counts.get(key, 0) + 1
        return _monotonic() - self.flushed >= FLUSH_EVERY

    async def flush(self) -> None:
        """Add the counts to this minute's keys. Never raises: a store that cannot be
        reached keeps the counts for the next flush."""
        self.flushed = _monotonic()
        if not self.counts:
            return
        store: Any = self.app.queue_store
        if not getattr(store, "shared", False):
            self.counts.clear()  # no other process could read them
            return
        minute = int(time.time() // 60)
        counts, self.counts = self.counts, {}
        for (connection, queue), n in counts.items():
            try:
                await store.increment(minute_key(connection, queue, minute), n, _KEEP)
            except Exception as e:
                log.debug("haze: could not record throughput of %s/%s: %s", connection, queue, e)
                key = (connection, queue)
                self.counts[key] = self.counts.get(key, 0) + n


async def per_minute(app: App, connection: str, queue: str) -> float | None:
    """Jobs finished per minute on ``queue`` over the last ``WINDOW`` minutes (the current
    one counted for the part that has passed); None when the queue store is process-local."""
    store: Any = app.queue_store
    if not getattr(store, "shared", False):
        return None
    now = time.time()
    minute = int(now // 60)
    total = 0
    for m in range(minute - WINDOW + 1, minute + 1):
        value = await store.get(minute_key(connection, queue, m))
        total += int(value or 0)
    elapsed = WINDOW - 1 + (now % 60) / 60
    return total / elapsed
