"""Pruning batches (``haze queue:prune-batches``): the batch index walked slot by slot,
old batches deleted.
"""

from __future__ import annotations

from collections.abc import Callable

from haze._engine.manager import QueueManager
from haze._orchestration import batch_unknown
from haze._orchestration.batch_records import (
    _INDEX_COUNT,
    _INDEX_FLOOR,
    _INDEX_SETTLED,
    _PRUNE_CHUNK,
    KEEP_JOB_IDS,
    BatchView,
    FindBatch,
    _index_key,
    _key,
    _store,
)
from haze.contracts.store import Store


async def prune(
    find: FindBatch,
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
    batch: BatchView,
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


async def _delete(store: Store, batch: BatchView) -> None:
    # The record first: a job settling meanwhile then finds nothing to count.
    raw_failed = int(await store.get(_key(batch.id, "failed")) or 0)  # recovered ones too
    parts = ["", "total", "pending", "processed", "failed", "finished", "cancelled", "outcome"]
    parts += ["cb:then", "cb:finally", "cb:catch", "cb:chain", "cb:chain-catch"]
    parts += ["recovered", "unsent", *(f"failed:{i}" for i in range(1, raw_failed + 1))]
    listed = min(int(await store.get(_key(batch.id, "jobs")) or 0), KEEP_JOB_IDS)
    parts += ["jobs", *(f"jobs:{i}" for i in range(1, listed + 1))]
    parts += await batch_unknown.parts(store, batch.id)
    for part in parts:
        await store.delete(_key(batch.id, part))


# ====================================================================== links of a chain
