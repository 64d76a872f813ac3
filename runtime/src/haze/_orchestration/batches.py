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

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from haze._base.blocking import blocking_method
from haze._base.errors import BatchFinishedError, DispatchIncompleteError
from haze._base.message import Message, check_queue_name, new_id
from haze._engine.hooks import Outcome, Run, Skip
from haze._engine.manager import QueueManager
from haze._jobs.definition import DispatchResult, JobDefinition, PendingDispatch, link_to_pending
from haze._orchestration import batch_dispatch, batch_prune, batch_settle, batch_unknown, tails
from haze._orchestration.batch_records import (
    _CALLBACKS,
    BatchJob,
    _as_item,
    _check_queues,
    _index,
    _key,
    _store,
)
from haze._orchestration.batch_records import _INDEX_COUNT as _INDEX_COUNT
from haze._orchestration.batch_records import DISPATCH_CHUNK as DISPATCH_CHUNK
from haze._orchestration.batch_records import KEEP_JOB_IDS as KEEP_JOB_IDS
from haze._orchestration.batch_records import _index_key as _index_key
from haze._orchestration.batch_records import check_link_queues as check_link_queues
from haze._orchestration.batch_records import claim_once as claim_once
from haze._orchestration.batch_records import jobs as jobs
from haze._orchestration.batch_records import recent_ids as recent_ids
from haze.contracts.app import use_app

__all__ = ["Batch", "BatchCount", "BatchGuard", "BatchJob", "PendingBatch"]


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
    #: jobs whose send lost its reply: pending until they start, or voided (failed)
    unknown: int = 0

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
        n = sum(batch_dispatch.size(i) for i in items)
        _check_queues(manager, items, self.options)
        batch_dispatch.check_items(manager, self.id, items, self.options)
        ttl = self.options.get("ttl")

        counted: list[str] = []  # the counts raised so far, taken back if nothing is queued

        async def count() -> None:
            for part in ("total", "pending"):
                await store.increment(_key(self.id, part), n, ttl)
                counted.append(part)

        try:
            # A cancel waits for both counts: cut between them, they would disagree.
            counting = asyncio.ensure_future(count())
            if await batch_dispatch.finish(counting):
                raise asyncio.CancelledError
            counting.result()
            state = await batch_dispatch.dispatch_items(
                _CALLS, manager, self.id, items, self.options
            )
        except BaseException:  # a cancelled caller too
            # Nothing was queued: the jobs are taken back. Pending first, and the batch
            # finished here when its other jobs ended meanwhile (none of them could).
            pending = "pending" in counted
            if pending and await store.increment(_key(self.id, "pending"), -n, ttl) <= 0:
                await batch_settle.finish(_CALLS, manager, self.id, store)
            if "total" in counted:
                await store.increment(_key(self.id, "total"), -n, ttl)
            raise
        _raise_for(state, self.id)
        return await self.fresh()

    fresh_blocking = blocking_method(fresh)
    cancel_blocking = blocking_method(cancel)
    add_blocking = blocking_method(add)


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
    _check_queues(manager, items, options)  # before any callback is offloaded
    batch_dispatch.check_items(manager, batch_id, items, options)
    callbacks = await tails.offloaded_callbacks(manager, spec)
    record = {"id": batch_id, "name": spec.get("name"), "created_at": now}
    record |= {"options": options, "callbacks": callbacks, "chain": chain}
    # The snapshot is read before the jobs are queued: a fast remote worker could
    # otherwise move it on. Inline (sync) runs and empty batches are read afterwards.
    queued = total > 0 and not manager.app.driver(spec["connection"]).inline
    try:
        await store.put(_key(batch_id), record, ttl)
        await store.put(_key(batch_id, "total"), total, ttl)
        await store.put(_key(batch_id, "pending"), total, ttl)
        b = await find(manager, batch_id) if queued else None
        state = await batch_dispatch.dispatch_items(_CALLS, manager, batch_id, items, options)
    except BaseException:  # a cancelled caller too
        # Nothing of it was queued or counted: no job will ever settle it.
        await tails.discard_callbacks(manager, callbacks)
        for part in ("", "total", "pending"):
            await store.delete(_key(batch_id, part))
        raise
    if state.touched and (state.error or state.job_error or state.cancelled):
        await _index(store, batch_id, ttl)  # listed: it runs what was queued, and ends
        _raise_for(state, batch_id)
    if total == 0:
        await batch_settle.finish(_CALLS, manager, batch_id, store)
    if b is None:
        b = await find(manager, batch_id)
    assert b is not None
    # Indexed last: the state above is read back before its TTL can run out.
    await _index(store, batch_id, ttl)
    return b


def _raise_for(state: batch_dispatch.Sending, batch_id: str) -> None:
    """What the caller of a batch's dispatch that went wrong part of the way sees."""
    if state.cancelled:
        raise asyncio.CancelledError
    if state.error is not None:
        raise state.incomplete(batch_id)
    if state.job_error is not None:
        raise state.job_error


async def find(manager: QueueManager, batch_id: str) -> Batch | None:
    """Read a batch from the store (None when unknown or expired)."""
    store = _store(manager)
    names = ("", "total", "pending", "processed", "failed", "finished", "cancelled", "recovered")
    values = await store.get_many([_key(batch_id, n) for n in (*names, "unsent", "unknown")])
    record, total, pending, processed, failed, finished, cancelled, recovered, *more = values
    unsent, unknown = more
    if record is None:
        return None
    # jobs never sent (batch_settle.settle_unsent): counted off pending as processed,
    # they are failed jobs with no id
    unsent = int(unsent or 0)
    n_failed = int(failed or 0)
    ids: list[str] = []
    if n_failed:
        got = await store.get_many([_key(batch_id, f"failed:{i}") for i in range(1, n_failed + 1)])
        ids = [str(x) for x in got if x is not None]
    if recovered and ids:
        marks = await store.get_many([_key(batch_id, f"recovered:{i}") for i in ids])
        ids = [i for i, mark in zip(ids, marks, strict=True) if mark is None]
    n_failed = max(0, n_failed - int(recovered or 0)) + unsent
    options = dict(record.get("options") or {})
    return Batch(
        id=batch_id,
        name=record.get("name"),
        total=int(total or 0),
        pending=max(0, int(pending or 0)),
        processed=max(0, int(processed or 0) - unsent),
        failed=n_failed,
        finished_at=None if finished is None else float(finished),
        cancelled_at=None if cancelled is None else float(cancelled),
        created_at=float(record.get("created_at") or 0.0),
        failed_job_ids=ids,
        allows_failures=bool(options.get("allow_failures")),
        options=options,
        unknown=int(unknown or 0),
    )


async def load_for_job(manager: QueueManager, batch_id: str) -> Batch | None:
    return await find(manager, batch_id)


# A chain's links may hold a batch and a batch may hold chains: the link runner lives
# here, below chains.py, so the two modules import one way only.


def _item_connections(item: Any, defaults: tuple[str | None, ...], app: Any) -> list[str | None]:
    """Connections the jobs of a chain/batch item run on (None: the config default)."""
    if isinstance(item, PendingBatch):
        out: list[str | None] = []
        for m in item.jobs:
            for p in m if isinstance(m, list) else [m]:
                out += _item_connections(p, (item._connection, *defaults), app)
        return out
    if isinstance(item, list):
        return [c for p in item for c in _item_connections(p, defaults, app)]
    own = app.queue_config.routes.connection_for(item.job.name, item.job.connection)
    return [next((c for c in (item._connection, *defaults, own) if c), None)]


def check_function_callbacks(
    manager: QueueManager,
    callbacks: Sequence[Any],
    items: Sequence[Any],
    defaults: tuple[str | None, ...],
    where: str,
) -> None:
    """A plain-function callback needs every job on a local connection (it may run there)."""
    if not any(
        callable(cb) and not isinstance(cb, (PendingDispatch, JobDefinition)) for cb in callbacks
    ):
        return
    for item in items:
        for c in _item_connections(item, defaults, manager.app):
            name = manager.app.connection_name(c)
            driver = manager.app.driver(name)
            if not driver.local_callbacks:
                raise ValueError(
                    f"{where}: a plain function cannot travel to the workers of connection "
                    f'"{name}" (driver {type(driver).__name__}); pass a job reference '
                    "such as cleanup.with_({...}) instead"
                )


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
    written: list[dict[str, Any]] = []
    if manager.app.recorder is None:
        head, rest, written = await tails.prepared(manager, head, rest)
    try:
        if "batch" in head:
            chain = {"links": rest, "chain_id": chain_id, "catch": catch}
            batch = await dispatch_spec(manager, head["batch"], chain=chain)
            return DispatchResult(batch.id, chain_id=chain_id)
        pending = link_to_pending(head, manager.app)
        opts: dict[str, Any] = {"chain": rest or None, "chain_id": chain_id, "chain_catch": catch}
        result = await manager.dispatcher.dispatch(
            pending, **opts, batch_id=batch_id, id=id, meta=meta
        )
    except DispatchIncompleteError:
        raise  # a batch as the link: part of it was queued, and reads these links
    except Exception:
        if not _inline(manager, head):  # sync ran it, and what came after: they were read
            await tails.discard(manager, written)  # not sent: nothing will read them
        raise
    await manager.offload.discard_link(links[0])  # its message has an object of its own
    return result


def _inline(manager: QueueManager, link: dict[str, Any]) -> bool:
    """Whether ``link`` runs inside its dispatch (its connection's driver is ``sync``)."""
    try:
        if "batch" in link:
            connection = manager.app.connection_name(link["batch"]["connection"])
        else:
            connection = manager.dispatcher.resolve(link_to_pending(link, manager.app))[0]
        return manager.app.driver(connection).inline
    except Exception:  # a link that cannot even be read was not sent
        return False


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


# ============================================ settle and prune (below: handed ``find``)


async def settle(
    manager: QueueManager, message: Message, outcome: str, error: BaseException | None
) -> None:
    """Count one job of a batch, then run due callbacks (:func:`batch_settle.settle`)."""
    await batch_settle.settle(_CALLS, manager, message, outcome, error)


async def settle_cancelled(manager: QueueManager, message: Message) -> None:
    """Count a job cancelled with ``Queue.cancel`` (:func:`batch_settle.settle_cancelled`)."""
    await batch_settle.settle_cancelled(_CALLS, manager, message)


async def prune(
    manager: QueueManager,
    *,
    finished_before: float,
    unfinished_before: float | None = None,
    cancelled_before: float | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> int:
    """Delete old batches; returns how many were deleted (:func:`batch_prune.prune`)."""
    return await batch_prune.prune(
        find,
        manager,
        finished_before=finished_before,
        unfinished_before=unfinished_before,
        cancelled_before=cancelled_before,
        progress=progress,
    )


class BatchGuard:
    """Run guard: skips a cancelled batch's jobs; reads the batch for ``job.batch()``."""

    plain_quiet = True  # wants() is False for a plain success (PlainQuiet)

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
        if batch is not None and batch.unknown:
            store, ttl = _store(self.manager), batch.options.get("ttl")
            if not await batch_unknown.claim_run(store, batch_id, run.message.id, ttl):
                return Skip("its send lost its reply and its batch has counted it as failed")
        if batch is not None and batch.cancelled:
            return Skip("its batch was cancelled")
        return None


class BatchCount:
    """Outcome hook: a job of a batch is counted, and the callbacks it makes due run,
    before the queue records its outcome (a redelivery after a crash counts it once)."""

    plain_quiet = True  # wants() is False for a plain success (PlainQuiet)

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


_CALLS = batch_settle.BatchCalls(find=find, start_links=start_links)
