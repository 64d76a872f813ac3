"""arq as a peer. Worker: ``arq redis_arq.WorkerSettings`` (its defaults: max_jobs 10,
poll_delay 0.5 s). No bulk API."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from arq.connections import RedisSettings, create_pool
from records import emit, record
from redis_common import QUEUE, REDIS_URL, apaced, clean, main, timed_rate

QUEUE_NAME = f"arq:{QUEUE}"


async def noop(ctx: Any, t: float) -> None:
    record(t)


class WorkerSettings:
    functions = [noop]  # noqa: RUF012
    queue_name = QUEUE_NAME
    redis_settings = RedisSettings.from_dsn(REDIS_URL)


async def _pool() -> Any:
    pool = await create_pool(RedisSettings.from_dsn(REDIS_URL), default_queue_name=QUEUE_NAME)
    await pool.ping()
    return pool


def enqueue(n: str) -> None:
    async def go() -> None:
        pool = await _pool()
        count = int(n)
        t0 = time.perf_counter()
        for _ in range(count):
            await pool.enqueue_job("noop", time.time())
        dt = time.perf_counter() - t0
        await pool.aclose()
        emit(**timed_rate(count, dt))

    asyncio.run(go())


def latency(n: str, rate: str) -> None:
    async def go() -> None:
        pool = await _pool()
        async for _ in apaced(int(n), float(rate)):
            await pool.enqueue_job("noop", time.time())
        await pool.aclose()
        emit(ok=True)

    asyncio.run(go())


def info() -> None:
    import importlib.metadata as m

    emit(version=f"arq {m.version('arq')} (redis-py {m.version('redis')})")


if __name__ == "__main__":
    main({"enqueue": enqueue, "latency": latency, "clean": clean, "info": info})
