"""Enqueue and drain per second on Vercel Queues' local service: haze's ``vercel`` driver
beside the SDK's own bare send / poll-and-acknowledge loop (the ceiling).

    .venv/bin/python bench/vercel_queues.py [N]

The service is the SDK's ``vercel.queue.devserver`` (uvicorn on a loopback port, in this
process's thread). Both sides send N messages 20 at a time and drain them with 8
consumers; the haze side dispatches a no-op job and drains it with an in-process
``Worker`` (concurrency 8). One line per side and the ratios, from one run.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from typing import Any

from haze import App, define_job, define_queue_config
from haze._workers.worker import Worker
from vercel.queue import ALL_DEPLOYMENTS, QueueClient
from vercel.queue.devserver import embedded_queue_dev_server

CHUNK, CONSUMERS = 20, 8


@define_job(name="bench_vercel_noop")
async def bench_vercel_noop(payload: dict[str, Any]) -> None:
    pass


async def bare(base_url: str, n: int) -> tuple[float, float]:
    client = QueueClient(
        token="local-token", region="iad1", base_url=base_url, deployment=ALL_DEPLOYMENTS
    )
    topic = f"bare{uuid.uuid4().hex[:8]}"
    began = time.perf_counter()
    for at in range(0, n, CHUNK):
        await asyncio.gather(
            *(client.send(topic, {"job": "noop", "i": i}) for i in range(at, min(n, at + CHUNK)))
        )
    enqueue = n / (time.perf_counter() - began)
    left = n

    async def consume() -> None:
        nonlocal left
        while left > 0:
            got = 0
            async for delivery in client.poll(topic, "bench", limit=1, lease_duration=60):
                await client.acknowledge(delivery.accept())
                got += 1
            left -= got
            if not got:
                await asyncio.sleep(0.01)

    began = time.perf_counter()
    await asyncio.gather(*(consume() for _ in range(CONSUMERS)))
    return enqueue, n / (time.perf_counter() - began)


async def haze(base_url: str, n: int) -> tuple[float, float]:
    connection = {
        "driver": "vercel",
        "topic": f"hz{uuid.uuid4().hex[:8]}-{{queue}}",
        "base_url": base_url,
        "token": "local-token",
        "region": "iad1",
    }
    app = App(queue=define_queue_config(default="v", connections={"v": connection}, store="memory"))
    async with app:
        began = time.perf_counter()
        for at in range(0, n, CHUNK):
            await asyncio.gather(
                *(bench_vercel_noop.dispatch({"i": i}) for i in range(at, min(n, at + CHUNK)))
            )
        enqueue = n / (time.perf_counter() - began)
        worker = Worker(app, "v", None, CONSUMERS, sleep=0.01, max_sleep=0.05)
        began = time.perf_counter()
        worker.start()
        while worker.processed < n:
            await asyncio.sleep(0.005)
        drain = n / (time.perf_counter() - began)
        await worker.stop()
    return enqueue, drain


async def main(n: int) -> None:
    with embedded_queue_dev_server(manual_clock=False) as server:
        b_enq, b_drain = await bare(server.base_url, n)
        h_enq, h_drain = await haze(server.base_url, n)
    print(f"| sdk-bare | {n} | {b_enq:.0f} | {b_drain:.0f} | 1.00 | 1.00 |")
    ratios = f"{h_enq / b_enq:.2f} | {h_drain / b_drain:.2f}"
    print(f"| haze-vercel | {n} | {h_enq:.0f} | {h_drain:.0f} | {ratios} |")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 500))
