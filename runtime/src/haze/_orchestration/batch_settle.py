"""Settling a batch: each job counted once, and the callbacks and chain links it makes
due dispatched once each, whichever worker dies where (see batches.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from haze._base.errors import DispatchOutcomeUnknownError, HazeError
from haze._base.message import Message, new_id
from haze._engine.manager import QueueManager
from haze._jobs.definition import DispatchResult
from haze._orchestration import batch_unknown, tails
from haze._orchestration.batch_records import KEEP_JOB_IDS, BatchView, FindBatch, _key, _store
from haze.contracts.driver import KnowsQueued
from haze.contracts.store import Store

log = logging.getLogger("haze")

#: seconds between two lookups of a batch's jobs that may be queued, while a lookup
#: gets no answer (their connection's backend is down)
LOOKUP_RETRY_SECONDS = 5.0

#: batch id -> the task asking again, one per batch and process, with its app's manager
_asking: dict[str, tuple[QueueManager, asyncio.Task[None]]] = {}

#: ``batches.start_links``: dispatches the next links of a chain.
StartLinks = Callable[..., Awaitable[DispatchResult]]


@dataclass(frozen=True)
class BatchCalls:
    """What settling calls back in batches.py (which imports this module): reading a
    batch, and starting the rest of the chain a batch belongs to."""

    find: FindBatch
    start_links: StartLinks


async def settle(
    calls: BatchCalls,
    manager: QueueManager,
    message: Message,
    outcome: str,
    error: BaseException | None,
    *,
    voiding: bool = False,
) -> None:
    """Count one job of a batch as done, skipped or failed, then run due callbacks.

    Safe to run again for the same job (a redelivery after a crash): the count is one
    atomic store step, and the callbacks it is due are dispatched once each.
    """
    store = _store(manager)
    batch_id = message.batch_id
    assert batch_id is not None
    record, unknown = await store.get_many([_key(batch_id), _key(batch_id, "unknown")])
    if record is None:
        return  # expired or unknown batch: nothing to count
    ttl = record["options"].get("ttl")
    if outcome == "failed" and message.chain:
        # The rest of this job's chain will never run: counted as skipped, once.
        n = tails.chain_length(message.chain)
        await _count(calls, manager, store, record, f"{message.id}:rest", "skipped", n)
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
            await _dispatch_once(calls, manager, record, kind, callbacks["failure"], error)
        if callbacks.get("catch"):
            await _dispatch_once(calls, manager, record, "catch", callbacks["catch"], error)
    if outcome == "done" and settled.outcome == "done" and callbacks.get("progress"):
        # Also when a redelivery finds the job counted (the crash came after the count),
        # and once: a claim key and a mark per job, as for then/catch/finally.
        kind = f"progress:{message.id}"
        await _dispatch_once(calls, manager, record, kind, callbacks["progress"], None)
    if settled.pending <= 0:
        await finish(calls, manager, batch_id, store, record)
    elif unknown and not voiding:
        await settle_unknown(calls, manager, batch_id)


async def settle_unknown(calls: BatchCalls, manager: QueueManager, batch_id: str) -> None:
    """When nothing but jobs that may be queued (their send lost its reply) and have not
    started is pending, look each up on its connection: found, it stays pending (it
    runs and settles); not found, it counts as failed, and is skipped should it come
    later (``batch_unknown``). A lookup that gets no answer is asked again in the
    background, every ``LOOKUP_RETRY_SECONDS``, until it answers or the batch expires:
    no job of the batch may settle again to ask (one never queued never will)."""
    error = await _settle_unknown(calls, manager, batch_id)
    if error is None or batch_id in _asking:
        return
    log.warning(
        'batch "%s": could not tell whether its jobs whose send lost its reply are queued '
        "(%s); asking again every %gs, the batch stays pending until then",
        batch_id,
        error,
        LOOKUP_RETRY_SECONDS,
    )
    task = asyncio.get_running_loop().create_task(
        _ask_again(calls, manager, batch_id), name=f"haze-batch-lookup-{batch_id}"
    )
    _asking[batch_id] = (manager, task)
    task.add_done_callback(lambda _: _asking.pop(batch_id, None))


def stop_asking(manager: QueueManager) -> None:
    """At the app's stop: end its lookups still being asked again, naming each batch
    (it stays pending: a job of it that settles later asks again, else it expires with
    ``batches.ttl``)."""
    for batch_id, (owner, task) in list(_asking.items()):
        if owner is manager:
            task.cancel()
            log.warning(
                'batch "%s": the app stopped before it could tell whether its jobs whose '
                "send lost its reply are queued; the batch stays pending until one of its "
                "jobs settles or batches.ttl passes",
                batch_id,
            )


async def _ask_again(calls: BatchCalls, manager: QueueManager, batch_id: str) -> None:
    # bounded by the batch's own lifetime: a store that stays down (or an app stopped
    # under the task) must not keep it asking for ever
    ttl = manager.app.queue_config.batches_ttl
    end = asyncio.get_running_loop().time() + (ttl or 86400.0)
    while asyncio.get_running_loop().time() < end:
        await asyncio.sleep(LOOKUP_RETRY_SECONDS)
        try:
            if await _settle_unknown(calls, manager, batch_id) is None:
                return
        except Exception:  # the store is down too: asked again all the same
            continue
    log.warning(
        'batch "%s": gave up asking whether its jobs whose send lost its reply are queued '
        "(batches.ttl passed); it stays unfinished unless one of them runs",
        batch_id,
    )


async def _settle_unknown(
    calls: BatchCalls, manager: QueueManager, batch_id: str
) -> Exception | None:
    """``settle_unknown`` once; the first lookup that got no answer (its job stays
    pending)."""
    store = _store(manager)
    if not await batch_unknown.due(store, batch_id):
        return None
    record = await store.get(_key(batch_id))
    if record is None:
        return None

    async def held(job_id: str, connections: Sequence[str]) -> bool:
        for name in connections:
            driver = manager.app.driver(name)
            if isinstance(driver, KnowsQueued) and await driver.holds_job(job_id):
                return True
        return False  # a connection without the lookup: counted failed, as before it

    ttl = record["options"].get("ttl")
    voided, error = await batch_unknown.void(store, batch_id, ttl, held)
    for job_id in voided:
        failure = DispatchOutcomeUnknownError(
            f'job {job_id} of batch "{batch_id}": its send lost its reply and it was not '
            "found queued (or its connection cannot look jobs up) when the batch's other "
            "jobs ended, so it counts as failed and is skipped if it is queued after all; "
            "dispatch it again if it must run",
            job_ids=(job_id,),
        )
        voided_job = Message(id=job_id, job="", payload=None, batch_id=batch_id)
        await settle(calls, manager, voided_job, "failed", failure, voiding=True)
    return error


async def settle_unsent(
    calls: BatchCalls, manager: QueueManager, batch_id: str, n: int, error: BaseException
) -> None:
    """Count ``n`` jobs of a batch that were never sent (they have no id) as failed.

    Their number goes to the ``unsent`` counter, which ``find`` adds to the failed jobs,
    not to the failed slots it reads one by one (a million jobs not sent would cost
    every later job of the batch a million reads). Then what a failure does: the batch
    cancelled unless it allows failures, ``failure`` and ``catch`` once; then they are
    counted off ``pending`` in one step, which finishes the batch when nothing else is
    pending. Run once, by the process dispatching the batch (a crash in it leaves the
    batch unfinished, as a crash between two of its chunks does).
    """
    store = _store(manager)
    record = await store.get(_key(batch_id))
    if record is None:
        return
    ttl = record["options"].get("ttl")
    group = f"unsent-{new_id()}"
    await store.increment(_key(batch_id, "unsent"), n, ttl)
    if not record["options"].get("allow_failures"):
        await store.add(_key(batch_id, "cancelled"), time.time(), ttl)
    callbacks = record.get("callbacks") or {}
    if callbacks.get("failure"):
        await _dispatch_once(
            calls, manager, record, f"failure:{group}", callbacks["failure"], error
        )
    if callbacks.get("catch"):
        await _dispatch_once(calls, manager, record, "catch", callbacks["catch"], error)
    await _count(calls, manager, store, record, group, "unsent", n)


async def settle_cancelled(calls: BatchCalls, manager: QueueManager, message: Message) -> None:
    """Count a job cancelled with ``Queue.cancel`` like the jobs a cancelled batch skips
    (processed, not failed; the batch goes on), and the rest of its chain with it."""
    if message.chain:
        store = _store(manager)
        assert message.batch_id is not None
        record = await store.get(_key(message.batch_id))
        if record is not None:
            n = tails.chain_length(message.chain)
            await _count(calls, manager, store, record, f"{message.id}:rest", "skipped", n)
    await settle(calls, manager, message, "skipped", None)


async def _count(
    calls: BatchCalls,
    manager: QueueManager,
    store: Store,
    record: dict[str, Any],
    job: str,
    outcome: str,
    n: int,
) -> None:
    settled = await store.settle_batch_job(
        _key(record["id"]), job, outcome, count=n, ttl=record["options"].get("ttl")
    )
    if settled.pending <= 0:
        await finish(calls, manager, record["id"], store, record)


async def finish(
    calls: BatchCalls,
    manager: QueueManager,
    batch_id: str,
    store: Store,
    record: dict[str, Any] | None = None,
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
    batch = await calls.find(manager, batch_id)
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
        await _dispatch_once(calls, manager, record, "then", callbacks["then"], None, batch)
    if callbacks.get("finally"):
        await _dispatch_once(calls, manager, record, "finally", callbacks["finally"], None, batch)
    chain = record.get("chain")
    if chain:
        await _continue_chain(calls, manager, record, chain, result, batch)
    await store.add(_key(batch_id, "finished"), finished_at, ttl)
    for refs in callbacks.values():
        manager.forget_callbacks(refs)  # nothing of this batch can fire any more


async def _continue_chain(
    calls: BatchCalls,
    manager: QueueManager,
    record: dict[str, Any],
    chain: dict[str, Any],
    result: str,
    batch: BatchView,
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
                await calls.start_links(
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
            await _dispatch_once(calls, manager, record, "chain-catch", refs, None, args=(err,))


async def _dispatch_once(
    calls: BatchCalls,
    manager: QueueManager,
    record: dict[str, Any],
    kind: str,
    refs: list[dict[str, Any]],
    error: BaseException | None,
    batch: BatchView | None = None,
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
            batch = await calls.find(manager, batch_id)
        args = (batch,) if error is None else (batch, error)
    for i, ref in enumerate(refs):
        await manager.run_callback(
            ref,
            args,
            connection=record["options"]["connection"],
            once=_key(batch_id, f"once:{kind}:{i}"),
        )
    await store.put(mark, time.time(), ttl)
