"""Batches: dispatch many jobs, track them as one, and run callbacks exactly once.

>>> # batch = await Queue.batch([import_csv.with_({"file": "a.csv"})]).name("import") \\
>>> #     .then(notify.with_({"user": 1})).dispatch()

State lives in ``batches.store`` (keys ``haze:batch:<id>…``, kept ``batches.ttl``):
a record, counters (total, pending, processed, failed) and once-markers.
A job is counted in one atomic store step (``Store.settle_batch_job``: its per-job
marker, processed/failed and the ``pending`` decrement together), so a redelivered job
is counted once; a failed job that is retried (``queue:retry``/``queue:retry-batch``)
and then succeeds moves from failed to processed, once. Any job that finds ``pending``
at zero, a redelivered one included, drives the finish: each callback is dispatched
with a claim key derived from the batch id and its kind, then marked dispatched, and
the ``finished`` marker comes last. A crash anywhere in between is completed by the
redelivery, and a second dispatch of a callback is a no-op: only the first message
to claim its key runs. So ``then``/``finally`` and ``catch`` run once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from haze._base.blocking import blocking_method
from haze._base.errors import BatchFinishedError, DispatchIncompleteError, HazeError
from haze._base.message import Message, check_queue_name, new_id
from haze._engine.hooks import Outcome, Run, Skip
from haze._engine.manager import QueueManager
from haze._jobs.definition import (
    DispatchResult,
    JobDefinition,
    PendingDispatch,
    get_job,
    link_to_pending,
)
from haze._orchestration import tails
from haze.contracts.app import use_app
from haze.contracts.driver import QueueNameRules
from haze.contracts.store import Store

__all__ = ["Batch", "BatchCount", "BatchGuard", "BatchJob", "PendingBatch"]

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


@dataclass
class Batch:
    """A snapshot of a batch's state; ``await fresh()`` reads it again."""

    id: str
    name: str | None = None
    total: int = 0
    pending: int = 0
    processed: int = 0
    failed: int = 0
    finished_at: float | None = None
    cancelled_at: float | None = None
    created_at: float = 0.0
    failed_job_ids: list[str] = field(default_factory=list)
    allows_failures: bool = False
    options: dict[str, Any] = field(default_factory=dict, repr=False)
    jobs: list[Any] = field(default_factory=list, repr=False)

    @property
    def progress(self) -> int:
        """Percent of jobs that have ended (0-100, rounded down)."""
        if self.total <= 0:
            return 100 if self.finished else 0
        return min(100, (self.total - self.pending) * 100 // self.total)

    @property
    def finished(self) -> bool:
        return self.finished_at is not None

    @property
    def cancelled(self) -> bool:
        return self.cancelled_at is not None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready state (for APIs and dashboards)."""
        return {
            "id": self.id,
            "name": self.name,
            "total": self.total,
            "pending": self.pending,
            "processed": self.processed,
            "failed": self.failed,
            "progress": self.progress,
            "finished": self.finished,
            "finished_at": self.finished_at,
            "cancelled": self.cancelled,
            "cancelled_at": self.cancelled_at,
            "created_at": self.created_at,
            "failed_job_ids": list(self.failed_job_ids),
        }

    async def fresh(self) -> Batch:
        """Read the batch again from the store."""
        b = await find(use_app().manager, self.id)
        return b if b is not None else self

    async def cancel(self) -> None:
        """Cancel: jobs that have not started are skipped (counted as processed)."""
        store = _store(use_app().manager)
        await store.add(_key(self.id, "cancelled"), time.time(), self.options.get("ttl"))
        if self.cancelled_at is None:
            self.cancelled_at = time.time()

    async def add(self, jobs: Sequence[Any]) -> Batch:
        """Add jobs to the batch; raises ``BatchFinishedError`` once it has finished."""
        manager: QueueManager = use_app().manager
        store = _store(manager)
        items = [_as_item(j, f"Batch.add[{i}]") for i, j in enumerate(jobs)]
        if await store.get(_key(self.id, "finished")) is not None:
            raise BatchFinishedError(
                f'batch "{self.id}" has finished; start a new batch instead of adding jobs'
            )
        n = sum(len(i) if isinstance(i, list) else 1 for i in items)
        _check_queues(manager, items, self.options)
        ttl = self.options.get("ttl")
        await store.increment(_key(self.id, "total"), n, ttl)
        await store.increment(_key(self.id, "pending"), n, ttl)
        await _dispatch_items(manager, self.id, items, self.options)
        return await self.fresh()

    fresh_blocking = blocking_method(fresh)
    cancel_blocking = blocking_method(cancel)
    add_blocking = blocking_method(add)


def _store(manager: QueueManager) -> Store:
    return manager.stores.batches()


class PendingBatch:
    """Built by ``Queue.batch([...])``; ``await .dispatch()`` returns the ``Batch``."""

    def __init__(self, jobs: Sequence[Any]) -> None:
        if not isinstance(jobs, (list, tuple)):
            raise ValueError(f"Queue.batch: expected a list of jobs, got {jobs!r}")
        self.jobs = [_as_item(j, f"Queue.batch[{i}]") for i, j in enumerate(jobs)]
        self._name: str | None = None
        self._allow_failures = False
        self._callbacks: dict[str, list[Any]] = {k: [] for k in _CALLBACKS}
        self._connection: str | None = None
        self._queue: str | None = None

    @property
    def batch_name(self) -> str | None:
        return self._name

    def name(self, name: str) -> PendingBatch:
        if not isinstance(name, str) or not name:
            raise ValueError(f"batch.name: expected a non-empty string, got {name!r}")
        self._name = name
        return self

    def allow_failures(self, callback: Any = None) -> PendingBatch:
        """Keep running after failures; ``callback(batch, error)`` runs for each one."""
        self._allow_failures = True
        if callback is not None:
            self._add("failure", callback, "batch.allow_failures")
        return self

    def _add(self, kind: str, cb: Any, where: str) -> PendingBatch:
        if not (callable(cb) or isinstance(cb, (PendingDispatch, JobDefinition))):
            raise ValueError(f"{where}: expected a job reference or a function, got {cb!r}")
        self._callbacks[kind].append(cb)
        return self

    def then(self, callback: Any) -> PendingBatch:
        """Once, when every job finished with no failure and the batch was not cancelled."""
        return self._add("then", callback, "batch.then")

    def catch(self, callback: Any) -> PendingBatch:
        """Once, on the first failure: ``callback(batch, error)`` or a job reference."""
        return self._add("catch", callback, "batch.catch")

    def finally_(self, callback: Any) -> PendingBatch:
        """Once, when every job has finished, whatever the outcome."""
        return self._add("finally", callback, "batch.finally_")

    def progress(self, callback: Any) -> PendingBatch:
        """After each job that completes successfully: ``callback(batch)``."""
        return self._add("progress", callback, "batch.progress")

    def on_connection(self, connection: str) -> PendingBatch:
        self._connection = connection
        return self

    def on_queue(self, queue: str) -> PendingBatch:
        self._queue = check_queue_name(queue, "batch on_queue")
        return self

    def to_spec(self, manager: QueueManager, connection: str | None = None) -> dict[str, Any]:
        """The JSON description of this batch (also how a batch travels inside a chain)."""
        spec = self._head(manager, connection)
        jobs: list[Any] = []
        for item in self.jobs:
            if isinstance(item, list):
                jobs.append({"chain": [p.to_link(manager.app) for p in item]})
            else:
                jobs.append(item.to_link(manager.app))
        spec["jobs"] = jobs
        return spec

    def _head(self, manager: QueueManager, connection: str | None = None) -> dict[str, Any]:
        """The batch's description without its jobs (checked as ``to_spec`` checks it)."""
        conn = manager.app.connection_name(self._connection or connection)
        check_function_callbacks(
            manager,
            [cb for v in self._callbacks.values() for cb in v],
            self.jobs,
            (conn,),
            "batch callback",
        )
        return {
            "name": self._name,
            "connection": conn,
            "queue": self._queue,
            "allow_failures": self._allow_failures,
            "callbacks": {
                k: [manager.callback_ref(cb, conn, f"batch.{k}") for cb in v]
                for k, v in self._callbacks.items()
                if v
            },
        }

    async def dispatch(self) -> Batch:
        manager: QueueManager = use_app().manager
        recorder = manager.app.recorder
        if recorder is not None:
            batch: Batch = recorder.record_batch(self, self.to_spec(manager))
            return batch
        # The jobs go out as they are, not through their JSON links and back: that
        # would hold two copies of a million-job batch before the first chunk is sent.
        return await start_batch(manager, self._head(manager), self.jobs)

    dispatch_blocking = blocking_method(dispatch)


async def dispatch_spec(
    manager: QueueManager, spec: dict[str, Any], chain: dict[str, Any] | None = None
) -> Batch:
    """Start the batch a JSON description (``to_spec``) holds, e.g. a chain's link."""
    items: list[PendingDispatch[Any] | list[PendingDispatch[Any]]] = []
    for j in spec["jobs"]:
        if "chain" in j:
            items.append([link_to_pending(x, manager.app) for x in j["chain"]])
        else:
            items.append(link_to_pending(j, manager.app))
    return await start_batch(manager, spec, items, chain)


async def start_batch(
    manager: QueueManager,
    spec: dict[str, Any],
    items: Sequence[PendingDispatch[Any] | list[PendingDispatch[Any]]],
    chain: dict[str, Any] | None = None,
) -> Batch:
    """Record a batch (``spec`` without its jobs is enough) and queue ``items``."""
    store = _store(manager)
    ttl = manager.app.queue_config.batches_ttl
    if manager.app.recorder is None:
        # A store this process alone sees beside a remote connection loses the callbacks.
        manager.stores.check(store, manager.app.driver(spec["connection"]), "batches")
    batch_id = new_id()
    now = time.time()
    total = sum(len(i) if isinstance(i, list) else 1 for i in items)
    options = {
        "connection": spec["connection"],
        "queue": spec.get("queue"),
        "allow_failures": bool(spec.get("allow_failures")),
        "ttl": ttl,
    }
    record = {
        "id": batch_id,
        "name": spec.get("name"),
        "created_at": now,
        "options": options,
        "callbacks": spec.get("callbacks") or {},
        "chain": chain,
    }
    _check_queues(manager, items, options)
    await store.put(_key(batch_id), record, ttl)
    await store.put(_key(batch_id, "total"), total, ttl)
    await store.put(_key(batch_id, "pending"), total, ttl)
    # The snapshot is read before the jobs are queued: a fast remote worker could
    # otherwise move it on. Inline (sync) runs and empty batches are read afterwards.
    queued = total > 0 and not manager.app.driver(spec["connection"]).inline
    b = await find(manager, batch_id) if queued else None
    try:
        await _dispatch_items(manager, batch_id, items, options)
    except DispatchIncompleteError:
        await _index(store, batch_id, ttl)  # listed: it runs what was queued, and ends
        raise
    if total == 0:
        await _finish(manager, batch_id, store)
    if b is None:
        b = await find(manager, batch_id)
    assert b is not None
    # Indexed last: the state above is read back before its TTL can run out.
    await _index(store, batch_id, ttl)
    return b


async def _dispatch_items(
    manager: QueueManager,
    batch_id: str,
    items: Sequence[PendingDispatch[Any] | list[PendingDispatch[Any]]],
    options: dict[str, Any],
) -> None:
    conn, queue = options.get("connection"), options.get("queue")
    first_error: BaseException | None = None
    # Runs of plain jobs for queue drivers go in one enqueue_many per connection (one
    # round trip, one sendBatch on Cloudflare) instead of a send per member.
    run: list[PendingDispatch[Any]] = []

    async def flush() -> None:
        nonlocal first_error
        if not run:
            return
        try:
            await manager.dispatcher.bulk(run, queue=queue, connection=conn, batch_id=batch_id)
        except DispatchIncompleteError as e:
            # The jobs not queued never run: counted as failed now, so the batch still
            # ends (and its catch/finally run) when the queued ones do.
            await _count_unsent(manager, batch_id, e)
            first_error = first_error or e
        finally:
            run.clear()

    for item in items:
        head = item[0] if isinstance(item, list) else item
        target = manager.dispatcher.resolve(head, queue=queue, connection=conn)[0]
        if not isinstance(item, list) and not manager.app.driver(target).inline:
            run.append(item)
            if len(run) >= DISPATCH_CHUNK:
                await flush()
            continue
        await flush()
        try:
            if isinstance(item, list):
                links = _chain_links(manager, item, queue, conn)
                await start_links(manager, links, new_id(), None, batch_id=batch_id)
            else:
                await manager.dispatcher.dispatch(
                    item, queue=queue, connection=conn, batch_id=batch_id
                )
        except Exception as e:
            # sync runs each job inside dispatch(): a failure is raised here. Dispatch
            # the rest so the batch still reaches its end (they are skipped once it is
            # cancelled), then raise the first failure to the caller.
            if not manager.app.driver(target).inline:
                raise
            if first_error is None:
                first_error = e
    await flush()
    if first_error is not None:
        raise first_error


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


async def _count_unsent(
    manager: QueueManager, batch_id: str, error: DispatchIncompleteError
) -> None:
    for job_id in error.failed:
        unsent = Message(id=job_id, job="", payload=None, batch_id=batch_id)
        await settle(manager, unsent, "failed", error)


async def find(manager: QueueManager, batch_id: str) -> Batch | None:
    """Read a batch from the store (None when unknown or expired)."""
    store = _store(manager)
    names = ("", "total", "pending", "processed", "failed", "finished", "cancelled", "recovered")
    values = await store.get_many([_key(batch_id, n) for n in names])
    record, total, pending, processed, failed, finished, cancelled, recovered = values
    if record is None:
        return None
    n_failed = int(failed or 0)
    ids: list[str] = []
    if n_failed:
        got = await store.get_many([_key(batch_id, f"failed:{i}") for i in range(1, n_failed + 1)])
        ids = [str(x) for x in got if x is not None]
    if recovered and ids:
        marks = await store.get_many([_key(batch_id, f"recovered:{i}") for i in ids])
        ids = [i for i, mark in zip(ids, marks, strict=True) if mark is None]
    n_failed = max(0, n_failed - int(recovered or 0))
    options = dict(record.get("options") or {})
    return Batch(
        id=batch_id,
        name=record.get("name"),
        total=int(total or 0),
        pending=max(0, int(pending or 0)),
        processed=int(processed or 0),
        failed=n_failed,
        finished_at=None if finished is None else float(finished),
        cancelled_at=None if cancelled is None else float(cancelled),
        created_at=float(record.get("created_at") or 0.0),
        failed_job_ids=ids,
        allows_failures=bool(options.get("allow_failures")),
        options=options,
    )


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


async def load_for_job(manager: QueueManager, batch_id: str) -> Batch | None:
    return await find(manager, batch_id)


async def settle(
    manager: QueueManager, message: Message, outcome: str, error: BaseException | None
) -> None:
    """Count one job of a batch as done, skipped or failed, then run due callbacks.

    Safe to run again for the same job (a redelivery after a crash): the count is one
    atomic store step, and the callbacks it is due are dispatched once each.
    """
    store = _store(manager)
    batch_id = message.batch_id
    assert batch_id is not None
    record = await store.get(_key(batch_id))
    if record is None:
        return  # expired or unknown batch: nothing to count
    ttl = record["options"].get("ttl")
    if outcome == "failed" and message.chain:
        # The rest of this job's chain will never run: counted as skipped, once.
        n = tails.chain_length(message.chain)
        await _count(manager, store, record, f"{message.id}:rest", "skipped", n)
    cancel = outcome == "failed" and not record["options"].get("allow_failures")
    settled = await store.settle_batch_job(
        _key(batch_id),
        message.id,
        outcome,
        cancel=cancel,
        now=time.time(),
        ttl=ttl,
        keep=KEEP_JOB_IDS,
    )
    callbacks = record.get("callbacks") or {}
    if outcome == "failed" and settled.outcome == "failed":
        # Also when this is a redelivery that finds the job counted: the crash that
        # caused it may have come before these were dispatched.
        if callbacks.get("failure"):
            kind = f"failure:{message.id}"
            await _dispatch_once(manager, record, kind, callbacks["failure"], error)
        if callbacks.get("catch"):
            await _dispatch_once(manager, record, "catch", callbacks["catch"], error)
    if outcome == "done" and settled.outcome == "done" and callbacks.get("progress"):
        # Also when a redelivery finds the job counted (the crash came after the count),
        # and once: a claim key and a mark per job, as for then/catch/finally.
        kind = f"progress:{message.id}"
        await _dispatch_once(manager, record, kind, callbacks["progress"], None)
    if settled.pending <= 0:
        await _finish(manager, batch_id, store, record)


async def settle_cancelled(manager: QueueManager, message: Message) -> None:
    """Count a job cancelled with ``Queue.cancel`` like the jobs a cancelled batch skips
    (processed, not failed; the batch goes on), and the rest of its chain with it."""
    if message.chain:
        store = _store(manager)
        assert message.batch_id is not None
        record = await store.get(_key(message.batch_id))
        if record is not None:
            n = tails.chain_length(message.chain)
            await _count(manager, store, record, f"{message.id}:rest", "skipped", n)
    await settle(manager, message, "skipped", None)


async def _count(
    manager: QueueManager, store: Store, record: dict[str, Any], job: str, outcome: str, n: int
) -> None:
    settled = await store.settle_batch_job(
        _key(record["id"]), job, outcome, count=n, ttl=record["options"].get("ttl")
    )
    if settled.pending <= 0:
        await _finish(manager, record["id"], store, record)


async def _finish(
    manager: QueueManager, batch_id: str, store: Store, record: dict[str, Any] | None = None
) -> None:
    """Dispatch what a finished batch is due (``then``/``finally``, the rest of its chain)
    and then set the ``finished`` marker.

    Any number of workers may run this for one batch (a job redelivered after a crash
    comes here again whenever ``pending`` is 0): each callback is dispatched once
    (``_dispatch_once``) and marked, so a run that died half-way is completed by the
    next one, and the marker is written last.
    """
    if record is None:
        record = await store.get(_key(batch_id))
        if record is None:
            return
    ttl = record["options"].get("ttl")
    if await store.get(_key(batch_id, "finished")) is not None:
        return  # everything was dispatched
    batch = await find(manager, batch_id)
    if batch is None:
        return
    # Decided once, by the first finisher: a later one must not take the other branch
    # (the batch cancelled, or a failed job retried, in between).
    now = "cancelled" if batch.cancelled else "ok" if batch.failed == 0 else "failed"
    await store.add(_key(batch_id, "outcome"), now, ttl)
    result = await store.get(_key(batch_id, "outcome")) or now
    finished_at = time.time()
    batch.finished_at = finished_at  # callbacks see a finished batch
    callbacks = record.get("callbacks") or {}
    if result == "ok" and callbacks.get("then"):
        await _dispatch_once(manager, record, "then", callbacks["then"], None, batch)
    if callbacks.get("finally"):
        await _dispatch_once(manager, record, "finally", callbacks["finally"], None, batch)
    chain = record.get("chain")
    if chain:
        await _continue_chain(manager, record, chain, result, batch)
    await store.add(_key(batch_id, "finished"), finished_at, ttl)
    for refs in callbacks.values():
        manager.forget_callbacks(refs)  # nothing of this batch can fire any more


async def _continue_chain(
    manager: QueueManager, record: dict[str, Any], chain: dict[str, Any], result: str, batch: Batch
) -> None:
    batch_id = record["id"]
    if result == "ok" or (result == "failed" and batch.allows_failures):
        links = chain.get("links")
        store = _store(manager)
        mark = _key(batch_id, "cb:chain")
        if links and await store.get(mark) is None:
            # A plain first link carries the once-claim; a batch as the next link is
            # created again if a crash comes before the mark (it has no claim).
            links = await tails.expand(manager, links, chain["chain_id"])
            if links:
                await start_links(
                    manager,
                    links,
                    chain["chain_id"],
                    chain.get("catch"),
                    batch_id=None,
                    meta={"once": _key(batch_id, "once:chain")},
                )
            await store.put(mark, time.time(), record["options"].get("ttl"))
    else:
        err = HazeError(f'batch "{batch_id}" in chain {chain["chain_id"]} failed')
        refs = chain.get("catch") or []
        if refs:
            await _dispatch_once(manager, record, "chain-catch", refs, None, args=(err,))


async def _dispatch_once(
    manager: QueueManager,
    record: dict[str, Any],
    kind: str,
    refs: list[dict[str, Any]],
    error: BaseException | None,
    batch: Batch | None = None,
    *,
    args: tuple[Any, ...] | None = None,
) -> None:
    """Dispatch the ``kind`` callbacks of a batch unless marked done; then mark them.

    Each callback gets a claim key derived from the batch id and ``kind``: a second
    dispatch (after a crash before the mark, or by a concurrent finisher) is a no-op,
    because only the first message that claims the key runs (``claim_once``).
    """
    store = _store(manager)
    batch_id = record["id"]
    ttl = record["options"].get("ttl")
    mark = _key(batch_id, f"cb:{kind}")
    if await store.get(mark) is not None:
        return
    if args is None:
        if batch is None:
            batch = await find(manager, batch_id)
        args = (batch,) if error is None else (batch, error)
    for i, ref in enumerate(refs):
        await manager.run_callback(
            ref,
            args,
            connection=record["options"]["connection"],
            once=_key(batch_id, f"once:{kind}:{i}"),
        )
    await store.put(mark, time.time(), ttl)


async def claim_once(manager: QueueManager, key: str, owner: str) -> bool:
    """True when ``owner`` (a message id) may run the callback claimed by ``key``.

    The first message to claim the key owns it; a redelivery of that message still
    owns it (it may have died mid-run), any other message is a duplicate dispatch.
    """
    return await manager.callbacks.claim_once(key, owner)


_PRUNE_CHUNK = 200


async def prune(
    manager: QueueManager,
    *,
    finished_before: float,
    unfinished_before: float | None = None,
    cancelled_before: float | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> int:
    """Delete batches (``haze queue:prune-batches``); returns how many were deleted.

    Deleted: finished batches that finished before ``finished_before`` (a timestamp);
    with ``unfinished_before``, unfinished ones created before it; with
    ``cancelled_before``, cancelled ones created before it. The record, counters and
    failed-job list go at once; per-job markers expire with ``batches.ttl``.
    ``progress(done, total)`` is called as index slots are walked.
    """
    store = _store(manager)
    count, floor, settled = (
        int(v or 0) for v in await store.get_many([_INDEX_COUNT, _INDEX_FLOOR, _INDEX_SETTLED])
    )
    floor = max(0, min(floor, count))
    total = count - floor
    pruned = walked = 0
    new_floor, advancing = floor, True
    for start in range(floor + 1, count + 1, _PRUNE_CHUNK):
        slots = list(range(start, min(count, start + _PRUNE_CHUNK - 1) + 1))
        ids = await store.get_many([_index_key(n) for n in slots])
        for n, value in zip(slots, ids, strict=True):
            gone = value is None
            if not gone:
                batch = await find(manager, str(value))
                if batch is None or _prunable(
                    batch, finished_before, unfinished_before, cancelled_before
                ):
                    if batch is not None:
                        await _delete(store, batch)
                        pruned += 1
                    await store.delete(_index_key(n))
                    gone = True
            # An empty slot allocated after the previous prune began may be a batch
            # whose slot is being written right now: the floor stops before it.
            if advancing and gone and (value is not None or n <= settled):
                new_floor = n
            else:
                advancing = False
        walked += len(slots)
        if progress is not None:
            progress(walked, total)
    if new_floor > floor:
        await store.put(_INDEX_FLOOR, new_floor)
    await store.put(_INDEX_SETTLED, count)
    return pruned


def _prunable(
    batch: Batch,
    finished_before: float,
    unfinished_before: float | None,
    cancelled_before: float | None,
) -> bool:
    if batch.finished_at is not None and batch.finished_at < finished_before:
        return True
    created = batch.created_at
    if unfinished_before is not None and not batch.finished and created < unfinished_before:
        return True
    return cancelled_before is not None and batch.cancelled and created < cancelled_before


async def _delete(store: Store, batch: Batch) -> None:
    # The record first: a job settling meanwhile then finds nothing to count.
    raw_failed = int(await store.get(_key(batch.id, "failed")) or 0)  # recovered ones too
    parts = ["", "total", "pending", "processed", "failed", "finished", "cancelled", "outcome"]
    parts += ["cb:then", "cb:finally", "cb:catch", "cb:chain", "cb:chain-catch"]
    parts += ["recovered", *(f"failed:{i}" for i in range(1, raw_failed + 1))]
    listed = min(int(await store.get(_key(batch.id, "jobs")) or 0), KEEP_JOB_IDS)
    parts += ["jobs", *(f"jobs:{i}" for i in range(1, listed + 1))]
    for part in parts:
        await store.delete(_key(batch.id, part))


# ====================================================================== links of a chain
# A chain's links may hold a batch and a batch may hold chains: the link runner lives
# here, below chains.py, so the two modules import one way only.


def _item_connections(item: Any, defaults: tuple[str | None, ...]) -> list[str | None]:
    """Connections the jobs of a chain/batch item run on (None: the config default)."""
    if isinstance(item, PendingBatch):
        out: list[str | None] = []
        for m in item.jobs:
            for p in m if isinstance(m, list) else [m]:
                out += _item_connections(p, (item._connection, *defaults))
        return out
    if isinstance(item, list):
        return [c for p in item for c in _item_connections(p, defaults)]
    return [next((c for c in (item._connection, *defaults, item.job.connection) if c), None)]


def check_function_callbacks(
    manager: QueueManager,
    callbacks: Sequence[Any],
    items: Sequence[Any],
    defaults: tuple[str | None, ...],
    where: str,
) -> None:
    """A plain-function callback needs every job of the chain/batch on a local connection
    (its settle may run the callback in the worker that ran the job)."""
    if not any(
        callable(cb) and not isinstance(cb, (PendingDispatch, JobDefinition)) for cb in callbacks
    ):
        return
    for item in items:
        for c in _item_connections(item, defaults):
            name = manager.app.connection_name(c)
            driver = manager.app.driver(name)
            if not driver.local_callbacks:
                raise ValueError(
                    f"{where}: a plain function cannot travel to the workers of connection "
                    f'"{name}" (driver {type(driver).__name__}); pass a job reference '
                    "such as cleanup.with_({...}) instead"
                )


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
            conn = link.get("connection") or connection or job.connection
            driver = manager.app.driver(manager.app.connection_name(conn))
            if isinstance(driver, QueueNameRules):
                driver.check_queue(link.get("queue") or queue or job.queue or "default")


async def start_links(
    manager: QueueManager,
    links: list[dict[str, Any]],
    chain_id: str,
    catch: list[dict[str, Any]] | None,
    *,
    batch_id: str | None,
    attempts: int = 0,
    id: str | None = None,
    meta: dict[str, Any] | None = None,
) -> DispatchResult:
    """Dispatch ``links[0]`` carrying the rest of the chain (as message ``id`` when given,
    with ``meta`` when it is a job)."""
    head, rest = links[0], links[1:]
    if "batch" in head and manager.app.recorder is not None:
        return _record_batch_link(manager, head["batch"], chain_id)
    if manager.app.recorder is None:
        connection = head["batch"]["connection"] if "batch" in head else head.get("connection")
        rest = await tails.spill(manager, rest, manager.app.connection_name(connection))
    if "batch" in head:
        batch = await dispatch_spec(
            manager, head["batch"], chain={"links": rest, "chain_id": chain_id, "catch": catch}
        )
        return DispatchResult(batch.id, chain_id=chain_id)
    pending = link_to_pending(head, manager.app)
    return await manager.dispatcher.dispatch(
        pending,
        chain=rest or None,
        chain_id=chain_id,
        chain_catch=catch,
        batch_id=batch_id,
        id=id,
        meta=meta,
    )


def _record_batch_link(
    manager: QueueManager, spec: dict[str, Any], chain_id: str
) -> DispatchResult:
    """Under ``Queue.fake()`` a batch link is recorded in ``fake.batches``, not run."""
    recorder = manager.app.recorder
    assert recorder is not None
    app = manager.app
    pb = PendingBatch(
        [
            [link_to_pending(x, app) for x in j["chain"]]
            if "chain" in j
            else link_to_pending(j, app)
            for j in spec["jobs"]
        ]
    )
    pb._name, pb._queue = spec.get("name"), spec.get("queue")
    pb._connection, pb._allow_failures = spec.get("connection"), bool(spec.get("allow_failures"))
    batch = recorder.record_batch(pb, spec)
    return DispatchResult(batch.id, chain_id=chain_id)


# ====================================================================== outcome hooks


class BatchGuard:
    """Run guard: a job of a cancelled batch is skipped (and every job of a batch sees
    its batch, read before the attempt, as ``job.batch()``)."""

    def __init__(self, manager: QueueManager) -> None:
        self.manager = manager

    def wants(self, run: Run) -> bool:
        return run.message.batch_id is not None

    async def admit(self, run: Run) -> Skip | None:
        batch_id = run.message.batch_id
        if batch_id is None:
            return None
        batch = await load_for_job(self.manager, batch_id)
        run.ctx._batch = batch
        if batch is not None and batch.cancelled:
            return Skip("its batch was cancelled")
        return None


class BatchCount:
    """Outcome hook: a job of a batch is counted, and the callbacks it makes due run,
    before the queue records its outcome (a redelivery after a crash counts it once)."""

    def __init__(self, manager: QueueManager) -> None:
        self.manager = manager

    def wants(self, run: Run) -> bool:
        return run.message.batch_id is not None

    async def settling(self, run: Run) -> None:
        message = run.message
        if message.batch_id is None:
            return
        outcome = run.outcome
        if outcome == Outcome.SUCCESS:
            await settle(self.manager, message, "done", None)
        elif outcome == Outcome.FAILED:
            await settle(self.manager, message, "failed", run.error)
        elif outcome == Outcome.CANCELLED:
            await settle_cancelled(self.manager, message)
        elif outcome == Outcome.SKIPPED and run.ctx._batch is not None and run.ctx._batch.cancelled:
            await settle(self.manager, message, "skipped", None)

    async def settled(self, run: Run) -> None:
        return None
