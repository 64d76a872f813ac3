"""SAQ as a peer. Worker: ``saq redis_saq.settings`` (one process, its default
concurrency 10). No bulk API (``gather`` = 100 concurrent enqueues, shown apart)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from records import emit, record
from redis_common import QUEUE, REDIS_URL, apaced, clean, main, timed_rate
from saq import Queue

queue = Queue.from_url(REDIS_URL, name=QUEUE)


async def noop(ctx: Any, *, t: float) -> None:
    record(t)


settings = {"queue": queue, "functions": [noop]}


async def _connected() -> Queue:
    await queue.connect()
    await queue.redis.ping()
    return queue


def enqueue(n: str) -> None:
    async def go() -> None:
        q = await _connected()
        count = int(n)
        t0 = time.perf_counter()
        for _ in range(count):
            await q.enqueue("noop", t=time.time())
        dt = time.perf_counter() - t0
        await q.disconnect()
        emit(**timed_rate(count, dt))

    asyncio.run(go())


def latency(n: str, rate: str) -> None:
    async def go() -> None:
        q = await _connected()
        async for _ in apaced(int(n), float(rate)):
            await q.enqueue("noop", t=time.time())
        await q.disconnect()
        emit(ok=True)

    asyncio.run(go())


def info() -> None:
    import importlib.metadata as m

    emit(version=f"saq {m.version('saq')} (redis-py {m.version('redis')})")


if __name__ == "__main__":
    main({"enqueue": enqueue, "latency": latency, "clean": clean, "info": info})
