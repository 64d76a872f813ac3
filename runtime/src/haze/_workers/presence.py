"""Which workers are alive: each ``haze queue:work`` process (and ``run_in_server``'s
worker) keeps a record in the queue store, renewed every few seconds, that the
dashboard's Workers page lists. Consumers that run in short invocations (the Lambda SQS
handler, a Cloudflare Worker's ``queue()``) keep one too, through :class:`Invocations`.

A worker holds one of ``SLOTS`` lease keys (``store.add`` with a TTL, renewed with the
owner-checked ``store.touch``) and writes its record beside it with the same TTL. A
worker that dies stops renewing, so its slot and record expire after ``LEASE`` seconds
and it drops off the list; nothing has to clean up after it. Listing is two
``get_many`` calls over the fixed slot range, on any store that every process shares
(redis or database); with a process-local store, or one that is not atomic (Cloudflare
KV), workers are not listed.

An invocation consumer is listed per execution environment (a warm Lambda container, a
Cloudflare isolate), not per invocation: its record is written when an invocation
starts and while it runs, at most once per ``BEAT_EVERY`` however many invocations
come, with the short ``SHORT_LEASE``. It is not removed when an invocation ends (that
would be a write per invocation): an environment that gets no more work drops off
after its lease. When the last record written listed running jobs, the end of the
invocation rewrites it without them, so a finished job is not shown running.

>>> slot_key(7)
'haze:workers:slot:7'
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import secrets
import socket
import time
import weakref
from collections.abc import AsyncIterator, Collection, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from haze._workers.delivery import Delivery
from haze.contracts.driver import Reserved
from haze.contracts.store import Store

if TYPE_CHECKING:
    from haze._engine.view import EngineApp

__all__ = [
    "BEAT_EVERY",
    "LEASE",
    "SHORT_LEASE",
    "SLOTS",
    "Consumer",
    "Invocations",
    "Presence",
    "invocations",
    "live_workers",
    "slot_key",
]

log = logging.getLogger("haze.worker")

#: How many workers can be listed at once (more still run; they are not shown).
SLOTS = 256
#: Seconds a worker's record outlives its last renewal.
LEASE = 30.0
#: Seconds between two renewals.
BEAT_EVERY = 5.0
#: Seconds the record of an invocation consumer (Lambda, Cloudflare) outlives its last
#: write: it has no process that renews it between invocations.
SHORT_LEASE = 15.0
#: Seconds the end of an invocation waits for a record write in flight.
_END_WAIT = 2.0
#: Running jobs kept in one record.
MAX_RUNNING = 50
_monotonic = time.monotonic


def _hostname() -> str:
    try:
        return socket.gethostname()
    except OSError:  # no name to give (a sandbox such as Pyodide's)
        return "unknown"


def _listable(store: Store) -> bool:
    """Whether workers can keep records in ``store``: every process must see it, and a
    slot is taken with an atomic add (Cloudflare KV has neither that nor TTLs under 60
    seconds: workers are not listed there)."""
    return store.shared and store.atomic


def slot_key(n: int) -> str:
    return f"haze:workers:slot:{n}"


def _record_key(worker_id: str) -> str:
    return f"haze:workers:record:{worker_id}"


class Consumer(Protocol):
    """What a presence record shows of the consumer it lists (a ``Worker`` is one)."""

    @property
    def app(self) -> EngineApp: ...
    @property
    def connection(self) -> str: ...
    @property
    def queues(self) -> Sequence[str] | None: ...
    @property
    def concurrency(self) -> int: ...
    @property
    def processed(self) -> int: ...
    @property
    def paused(self) -> Collection[str]: ...
    def running_jobs(self) -> list[Reserved]: ...


class Presence:
    """One consumer's record in the store. ``beat()`` and ``leave()`` never raise: the
    consumer's jobs matter more than its listing. ``kind`` says what runs the jobs
    (``worker``, ``lambda``, ``cloudflare``)."""

    def __init__(
        self, worker: Consumer, *, kind: str = "worker", lease: float | None = None
    ) -> None:
        self.worker = worker
        self.kind = kind
        #: Seconds the record outlives its last write (``LEASE`` unless given).
        self.lease = LEASE if lease is None else lease
        host = _hostname()
        self.id = f"{host}:{os.getpid()}:{secrets.token_hex(3)}"
        self.host = host
        self.started_at = time.time()
        self.slot: int | None = None
        self._last = -BEAT_EVERY
        #: Whether the last record written listed running jobs.
        self.listed_running = False

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
            "kind": self.kind,
            "lease": self.lease,
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
            if not _listable(store):
                return
            lease = self.lease
            if self.slot is None or not await store.touch(slot_key(self.slot), self.id, lease):
                self.slot = await self._claim()
            if self.slot is not None:
                record = self.record()
                await store.put(_record_key(self.id), record, lease)
                self.listed_running = bool(record["running"])
        except Exception as e:
            log.debug("haze worker: could not renew the worker record: %s", e)

    async def _claim(self) -> int | None:
        store = self.worker.app.queue_store
        start = random.randrange(SLOTS)
        for i in range(SLOTS):
            n = (start + i) % SLOTS
            if await store.add(slot_key(n), self.id, self.lease):
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


class Invocations:
    """The presence of a consumer that runs in invocations (a Lambda execution
    environment, a Cloudflare isolate): one record for all the invocations it serves
    (see the module doc).

    >>> # async with invocations(app, "sqs", "lambda").invocation(delivery, ["jobs"], 10):
    >>> #     ... run the delivered batch with ``delivery`` ...
    """

    def __init__(self, app: EngineApp, connection: str, kind: str) -> None:
        self.app = app
        self.connection = connection
        self.queues: list[str] | None = None
        self.concurrency = 1
        self.processed = 0
        self.paused: frozenset[str] = frozenset()
        self._deliveries: list[Delivery] = []
        self.presence = Presence(self, kind=kind, lease=SHORT_LEASE)

    def running_jobs(self) -> list[Reserved]:
        return [job for d in self._deliveries for job in d.running()]

    @contextlib.asynccontextmanager
    async def invocation(
        self, delivery: Delivery, queues: Sequence[str] | None, concurrency: int
    ) -> AsyncIterator[None]:
        """List this environment while ``delivery`` runs an invocation's jobs."""
        self.queues = sorted({*(self.queues or []), *queues}) if queues else self.queues
        self.concurrency = max(1, concurrency)
        self._deliveries.append(delivery)
        done = asyncio.Event()
        beats = asyncio.ensure_future(self._beats(done))
        try:
            yield
        finally:
            # Not cancelled at once: a write cut between the slot and the record would leave
            # this environment unlisted. The one in flight may end (a store round trip),
            # but a store that hangs does not hold the invocation up.
            done.set()
            await asyncio.wait({beats}, timeout=_END_WAIT)
            beats.cancel()
            self._deliveries.remove(delivery)
            self.processed += sum(delivery.outcomes.values())
            if self.presence.listed_running:
                await self.presence.beat(force=True)

    async def _beats(self, done: asyncio.Event) -> None:
        # One turn of the loop first: the invocation's first jobs are running by then.
        await asyncio.sleep(0)
        while True:
            await self.presence.beat()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(done.wait(), BEAT_EVERY)
            if done.is_set():
                return


#: One ``Invocations`` per app and connection (an environment serves many invocations).
_INVOCATIONS: weakref.WeakKeyDictionary[EngineApp, dict[str, Invocations]] = (
    weakref.WeakKeyDictionary()
)


def invocations(app: EngineApp, connection: str, kind: str) -> Invocations:
    """The presence of this environment's ``kind`` consumer of ``connection``."""
    per_app = _INVOCATIONS.setdefault(app, {})
    found = per_app.get(connection)
    if found is None:
        found = per_app[connection] = Invocations(app, connection, kind)
    return found


async def live_workers(app: EngineApp) -> list[dict[str, Any]] | None:
    """The records of the workers alive now (oldest first); None when the queue store is
    process-local, so no worker's record could be seen from here."""
    store = app.queue_store
    if not _listable(store):
        return None
    ids = [v for v in await store.get_many([slot_key(n) for n in range(SLOTS)]) if v]
    if not ids:
        return []
    records = await store.get_many([_record_key(str(i)) for i in ids])
    found = [r for r in records if isinstance(r, dict)]
    found.sort(key=lambda r: (float(r.get("started_at") or 0), str(r.get("id"))))
    return found
