"""A batch's state in the store: its keys, the batch index, the checks made before a
batch is recorded, and the lists the dashboard reads (``jobs``, ``recent_ids``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from haze._engine.manager import QueueManager
from haze._jobs.definition import JobDefinition, PendingDispatch, get_job
from haze.contracts.driver import QueueNameRules
from haze.contracts.store import Store

_CALLBACKS = ("then", "catch", "finally", "progress", "failure")
#: Jobs of a batch encoded and queued at a time: a batch of a million jobs holds this
#: many messages in the dispatching process, not a million.
DISPATCH_CHUNK = 1000
#: Jobs of one batch whose ids are kept, in the order they ended (``jobs``): the first
#: ones only, so a batch of a million jobs costs no more than one of a thousand.
KEEP_JOB_IDS = 1000


def _key(batch_id: str, part: str = "") -> str:
    return f"haze:batch:{batch_id}{':' + part if part else ''}"


# The batch index: slot n (from an ever-growing counter) names the n-th batch created,
# so ``prune`` can enumerate batches in any store. Slots expire with the batch; the
# floor is the highest slot below which every slot is known to be gone.
_INDEX_COUNT = "haze:batches:count"
_INDEX_FLOOR = "haze:batches:floor"
_INDEX_SETTLED = "haze:batches:settled"


def _index_key(n: int) -> str:
    return f"haze:batches:index:{n}"


async def _index(store: Store, batch_id: str, ttl: float | None) -> None:
    n = await store.increment(_INDEX_COUNT)
    await store.put(_index_key(n), batch_id, ttl)


def _as_item(item: object, where: str) -> PendingDispatch[Any] | list[PendingDispatch[Any]]:
    if isinstance(item, PendingDispatch):
        return item
    if isinstance(item, JobDefinition):
        return PendingDispatch(item, None)
    if isinstance(item, (list, tuple)):
        if not item:
            raise ValueError(f"{where}: a chain inside a batch needs at least one job")
        out: list[PendingDispatch[Any]] = []
        for i, x in enumerate(item):
            p = _as_item(x, f"{where}[{i}]")
            if isinstance(p, list):
                raise ValueError(f"{where}[{i}]: chains cannot nest inside a chain in a batch")
            out.append(p)
        return out
    raise TypeError(
        f"{where}: expected job.with_(payload), a job or a list (a chain), got {item!r}"
    )


def _store(manager: QueueManager) -> Store:
    return manager.stores.batches()


def _check_queues(
    manager: QueueManager,
    items: Sequence[PendingDispatch[Any] | list[PendingDispatch[Any]]],
    options: dict[str, Any],
) -> None:
    """Every queue name the batch's jobs and chains will use, checked before the batch
    is recorded or any job queued (as ``check_link_queues`` checks a chain's links)."""
    queue, conn = options.get("queue"), options.get("connection")
    for item in items:
        for pending in item if isinstance(item, list) else (item,):
            target, name = manager.dispatcher.resolve(pending, queue=queue, connection=conn)
            driver = manager.app.driver(target)
            if isinstance(driver, QueueNameRules):
                driver.check_queue(name)


def _chain_links(
    manager: QueueManager, item: list[PendingDispatch[Any]], queue: Any, conn: Any
) -> list[dict[str, Any]]:
    """A chain inside a batch as links, on the batch's queue and connection unless a
    link names its own."""
    links = []
    for p in item:
        link = p.to_link(manager.app)
        if queue and "queue" not in link:
            link["queue"] = queue
        if conn and "connection" not in link:
            link["connection"] = conn
        links.append(link)
    return links


@dataclass
class BatchJob:
    """One job of a batch that has ended, as ``jobs`` lists it."""

    id: str
    #: ``done``, ``failed``, ``skipped`` (its batch was cancelled, or it was cancelled),
    #: or ``retried`` (failed, then retried from the failed jobs and done).
    state: str


async def jobs(manager: QueueManager, batch_id: str) -> tuple[list[BatchJob], int]:
    """The jobs of a batch that have ended, in the order they ended, and how many have
    ended in all: only the first ``KEEP_JOB_IDS`` are listed (the dashboard's batch page;
    jobs still pending are only counted)."""
    store = _store(manager)
    ended = int(await store.get(_key(batch_id, "jobs")) or 0)
    if not ended:
        return [], 0
    slots = [_key(batch_id, f"jobs:{n}") for n in range(1, min(ended, KEEP_JOB_IDS) + 1)]
    ids = [str(v) for v in await store.get_many(slots) if v is not None]
    marks = await store.get_many(
        [_key(batch_id, f"{part}:{i}") for i in ids for part in ("done", "recovered")]
    )
    out = []
    for i, job_id in enumerate(ids):
        state, recovered = marks[2 * i], marks[2 * i + 1]
        out.append(BatchJob(job_id, "retried" if recovered is not None else str(state or "")))
    return out, ended


async def recent_ids(manager: QueueManager, limit: int = 50) -> list[str]:
    """Ids of the newest batches in the index (newest first, at most ``limit``; the
    dashboard's batch list). Slots of pruned or expired batches are skipped."""
    store = _store(manager)
    count, floor = (int(v or 0) for v in await store.get_many([_INDEX_COUNT, _INDEX_FLOOR]))
    ids: list[str] = []
    top = count
    while top > floor and len(ids) < limit:
        slots = list(range(top, max(floor, top - _PRUNE_CHUNK), -1))
        values = await store.get_many([_index_key(n) for n in slots])
        ids.extend(str(v) for v in values if v is not None)
        top = slots[-1] - 1
    return ids[:limit]


async def claim_once(manager: QueueManager, key: str, owner: str) -> bool:
    """True when ``owner`` (a message id) may run the callback claimed by ``key``.

    The first message to claim the key owns it; a redelivery of that message still
    owns it (it may have died mid-run), any other message is a duplicate dispatch.
    """
    return await manager.callbacks.claim_once(key, owner)


_PRUNE_CHUNK = 200


def check_link_queues(
    manager: QueueManager,
    links: Sequence[dict[str, Any]],
    queue: str | None = None,
    connection: str | None = None,
) -> None:
    """Ask the driver of each job that ``links`` will queue later (a chain's next links,
    a batch's jobs) whether it takes the job's queue name (``QueueNameRules``): a name it
    refuses then fails the dispatch instead of the link before it, which would lose the
    rest of the chain."""
    for link in links:
        if "batch" in link:
            spec = link["batch"]
            check_link_queues(manager, spec["jobs"], spec.get("queue"), spec.get("connection"))
        elif "chain" in link:
            check_link_queues(manager, link["chain"], queue, connection)
        else:
            job = get_job(link["job"])
            routes = manager.app.queue_config.routes
            conn = link.get("connection") or connection
            conn = conn or routes.connection_for(job.name, job.connection)
            driver = manager.app.driver(manager.app.connection_name(conn))
            if isinstance(driver, QueueNameRules):
                q = link.get("queue") or queue or routes.queue_for(job.name, job.queue)
                driver.check_queue(q or "default")


class BatchView(Protocol):
    """What settling and pruning read of a ``Batch``: the class lives in batches.py,
    above these modules, and hands its ``find`` down."""

    id: str
    failed: int
    finished_at: float | None
    created_at: float
    allows_failures: bool

    @property
    def finished(self) -> bool: ...

    @property
    def cancelled(self) -> bool: ...


#: ``batches.find``: reads a batch from the store (None when unknown or expired).
FindBatch = Callable[[QueueManager, str], Awaitable[BatchView | None]]
