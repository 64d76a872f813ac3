"""Settling a batch: each job counted once, and the callbacks and chain links it makes
due dispatched once each, whichever worker dies where (see batches.py).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from haze._base.errors import HazeError
from haze._base.message import Message
from haze._engine.manager import QueueManager
from haze._jobs.definition import DispatchResult
from haze._orchestration import tails
from haze._orchestration.batch_records import KEEP_JOB_IDS, BatchView, FindBatch, _key, _store
from haze.contracts.store import Store

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
