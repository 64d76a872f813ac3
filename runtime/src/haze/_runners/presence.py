"""Which workers are alive: each ``haze queue:work`` process keeps a record in the queue
store, renewed every few seconds, that the dashboard's Workers page lists.

A worker holds one of ``SLOTS`` lease keys (``store.add`` with a TTL, renewed with the
owner-checked ``store.touch``) and writes its record beside it with the same TTL. A
worker that dies stops renewing, so its slot and record expire after ``LEASE`` seconds
and it drops off the list; nothing has to clean up after it. Listing is two
``get_many`` calls over the fixed slot range, on any store that every process shares
(redis or database); with a process-local store, workers are not listed.

>>> slot_key(7)
'haze:workers:slot:7'
"""

from __future__ import annotations

import logging
import os
import random
import secrets
import socket
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from haze._app.app import App
    from haze._runners.worker import Worker

__all__ = ["BEAT_EVERY", "LEASE", "SLOTS", "Presence", "live_workers", "slot_key"]

log = logging.getLogger("haze.worker")

#: How many workers can be listed at once (more still run; they are not shown).
SLOTS = 256
#: Seconds a worker's record outlives its last renewal.
LEASE = 30.0
#: Seconds between two renewals.
BEAT_EVERY = 5.0
#: Running jobs kept in one record.
MAX_RUNNING = 50
_monotonic = time.monotonic


def slot_key(n: int) -> str:
    return f"haze:workers:slot:{n}"


def _record_key(worker_id: str) -> str:
    return f"haze:workers:record:{worker_id}"


class Presence:
    """One worker's record in the store. ``beat()`` and ``leave()`` never raise: the
    worker's jobs matter more than its listing."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        host = socket.gethostname()
        self.id = f"{host}:{os.getpid()}:{secrets.token_hex(3)}"
        self.host = host
        self.started_at = time.time()
        self.slot: int | None = None
        self._last = -BEAT_EVERY

    def record(self) -> dict[str, Any]:
        w = self.worker
        running = []
        for job in w.running_jobs()[:MAX_RUNNING]:
            m = job.message
            running.append(
                {
                    "id": m.id if m else "",
                    "name": m.job if m else "(undecodable)",
                    "queue": job.queue,
                    "attempt": job.attempt,
                }
            )
        return {
            "id": self.id,
            "host": self.host,
            "pid": os.getpid(),
            "connection": w.connection,
            "queues": list(w.queues) if w.queues else None,
            "concurrency": w.concurrency,
            "started_at": self.started_at,
            "beat_at": time.time(),
            "processed": w.processed,
            "paused": sorted(w.paused),
            "running": running,
        }

    async def beat(self, *, force: bool = False) -> None:
        """Renew the slot and rewrite the record (at most every ``BEAT_EVERY`` seconds)."""
        now = _monotonic()
        if not force and now - self._last < BEAT_EVERY:
            return
        self._last = now
        try:
            store = self.worker.app.queue_store
            if not store.shared:
                return
            if self.slot is None or not await store.touch(slot_key(self.slot), self.id, LEASE):
                self.slot = await self._claim()
            if self.slot is not None:
                await store.put(_record_key(self.id), self.record(), LEASE)
        except Exception as e:
            log.debug("haze worker: could not renew the worker record: %s", e)

    async def _claim(self) -> int | None:
        store = self.worker.app.queue_store
        start = random.randrange(SLOTS)
        for i in range(SLOTS):
            n = (start + i) % SLOTS
            if await store.add(slot_key(n), self.id, LEASE):
                return n
        log.debug("haze worker: all %d worker slots are taken; this worker is not listed", SLOTS)
        return None

    async def leave(self) -> None:
        """Remove the record now (a clean stop); a crash leaves it to expire."""
        try:
            store = self.worker.app.queue_store
            if self.slot is not None and store.shared:
                await store.delete(_record_key(self.id))
                await store.delete(slot_key(self.slot), self.id)
        except Exception as e:
            log.debug("haze worker: could not remove the worker record: %s", e)
        self.slot = None


async def live_workers(app: App) -> list[dict[str, Any]] | None:
    """The records of the workers alive now (oldest first); None when the queue store is
    process-local, so no worker's record could be seen from here."""
    store = app.queue_store
    if not store.shared:
        return None
    ids = [v for v in await store.get_many([slot_key(n) for n in range(SLOTS)]) if v]
    if not ids:
        return []
    records = await store.get_many([_record_key(str(i)) for i in ids])
    found = [r for r in records if isinstance(r, dict)]
    found.sort(key=lambda r: (float(r.get("started_at") or 0), str(r.get("id"))))
    return found
