"""Bare ``bullmq`` (the Python package, 3.x) as a peer: Queue.add / addBulk and a Worker.

bullmq has no worker CLI: ``worker [CONCURRENCY]`` runs one ``Worker`` in this process
(concurrency 0 = the library's default, 1) until SIGTERM.
"""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

from bullmq import Queue, Worker
from records import emit, record
from redis_common import CHUNK, QUEUE, REDIS_URL, apaced, clean, main, timed_rate


async def _queue() -> Any:
    q = Queue(QUEUE, {"connection": REDIS_URL})
    await q.client.ping()
    return q


def enqueue(n: str) -> None:
    async def go() -> None:
        q = await _queue()
        count = int(n)
        t0 = time.perf_counter()
        for _ in range(count):
            await q.add("noop", {"t": time.time()})
        dt = time.perf_counter() - t0
        await q.close()
        emit(**timed_rate(count, dt))

    asyncio.run(go())


def bulk(n: str) -> None:
    async def go() -> None:
        q = await _queue()
        count = int(n)
        t0 = time.perf_counter()
        for s in range(0, count, CHUNK):
            jobs = [
                {"name": "noop", "data": {"t": time.time()}} for _ in range(min(CHUNK, count - s))
            ]
            await q.addBulk(jobs)
        dt = time.perf_counter() - t0
        await q.close()
        emit(**timed_rate(count, dt, chunk=CHUNK))

    asyncio.run(go())


def latency(n: str, rate: str) -> None:
    async def go() -> None:
        q = await _queue()
        async for _ in apaced(int(n), float(rate)):
            await q.add("noop", {"t": time.time()})
        await q.close()
        emit(ok=True)

    asyncio.run(go())


def worker(concurrency: str = "0") -> None:
    async def process(job: Any, token: str) -> None:
        record(job.data["t"])

    async def go() -> None:
        opts: dict[str, Any] = {"connection": REDIS_URL}
        if int(concurrency) > 0:
            opts["concurrency"] = int(concurrency)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        w = Worker(QUEUE, process, opts)
        await stop.wait()
        await w.close()

    asyncio.run(go())


def info() -> None:
    import importlib.metadata as m

    emit(version=f"bullmq {m.version('bullmq')} (redis-py {m.version('redis')})")


if __name__ == "__main__":
    main(
        {
            "enqueue": enqueue,
            "bulk": bulk,
            "latency": latency,
            "worker": worker,
            "clean": clean,
            "info": info,
        }
    )
