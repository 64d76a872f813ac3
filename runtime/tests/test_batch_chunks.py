"""A large batch is queued in bounded chunks: the dispatching process never holds more
than ``DISPATCH_CHUNK`` encoded messages of it at once, whatever the batch's size."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from haze import App, Queue, define_job, define_queue_config
from haze._orchestration.batches import DISPATCH_CHUNK

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
