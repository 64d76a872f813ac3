"""A large batch is queued in bounded chunks: the dispatching process never holds more
than ``DISPATCH_CHUNK`` encoded messages of it at once, whatever the batch's size."""

from __future__ import annotations

import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from haze import App, Queue, define_database_config, define_job, define_queue_config
from haze._orchestration.batches import DISPATCH_CHUNK
from haze.connectors.migrations import ensure_queue_tables

RAN: list[int] = []


@define_job(name="bc_count")
async def bc_count(payload: dict[str, int]) -> None:
    RAN.append(payload["i"])


async def test_a_big_batch_is_enqueued_in_bounded_chunks() -> None:
    RAN.clear()
    app = App(queue=define_queue_config(default="m", connections={"m": {"driver": "memory"}}))
    async with app:
        driver: Any = app.driver("m")
        sizes: list[int] = []
        real = driver.enqueue_many

        async def counted(items: Sequence[Any]) -> None:  # the real enqueue, measured
            sizes.append(len(items))
            await real(items)

        driver.enqueue_many = counted
        n = 2 * DISPATCH_CHUNK + 7
        batch = await Queue.batch([bc_count.with_({"i": i}) for i in range(n)]).dispatch()
        await Queue.idle()
        assert sorted(RAN) == list(range(n))
        assert sizes == [DISPATCH_CHUNK, DISPATCH_CHUNK, 7]
        done = await batch.fresh()
        assert done.total == n and done.processed == n and done.finished_at is not None
        # Batch.add too (on a batch kept open by a job delayed past the test).
        RAN.clear()
        open_batch = await Queue.batch([bc_count.with_({"i": -1}).delay(3600)]).dispatch()
        del sizes[:]
        await open_batch.add([bc_count.with_({"i": i}) for i in range(DISPATCH_CHUNK + 1)])
        assert sizes == [DISPATCH_CHUNK, 1]


async def _dispatch_peak(app: App, n: int) -> int:
    """Bytes the dispatching process allocated at its peak while queueing a batch of
    ``n`` jobs, beyond the list the caller built (measured on a SQLite file, whose rows
    live outside Python)."""
    jobs = [bc_count.with_({"i": i}) for i in range(n)]
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        await Queue.batch(jobs).dispatch()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


async def test_a_big_batch_holds_no_copy_of_its_jobs_while_it_is_queued(tmp_path: Path) -> None:
    # The batch went through its JSON description (one link dict per job) and back (one
    # pending dispatch per job) before the first chunk was sent: memory grew with the
    # batch, about 300 MB for a million jobs.
    app = App(
        queue=define_queue_config(default="db", connections={"db": {"driver": "database"}}),
        database=define_database_config(
            default="main", connections={"main": {"url": f"sqlite:///{tmp_path}/q.db"}}
        ),
    )
    async with app:
        await ensure_queue_tables(app)
        await _dispatch_peak(app, DISPATCH_CHUNK)  # warm caches and statements
        small = await _dispatch_peak(app, 2 * DISPATCH_CHUNK)
        big = await _dispatch_peak(app, 8 * DISPATCH_CHUNK)
    # A list of references to the caller's jobs (8 bytes each) may grow with the batch,
    # nothing per job beyond that.
    assert big - small < 100 * 6 * DISPATCH_CHUNK, (small, big)
