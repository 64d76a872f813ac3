"""Dramatiq (RedisBroker) as a peer. Worker: ``dramatiq -p 1 redis_dramatiq``: one
process (its default is one per CPU) with its default 8 threads. No bulk API."""

from __future__ import annotations

import time

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from records import emit, paced, record
from redis_common import QUEUE, REDIS_URL, clean, main, timed_rate

broker = RedisBroker(url=REDIS_URL)
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name=QUEUE, actor_name="noop")
def noop(t: float) -> None:
    record(t)


def enqueue(n: str) -> None:
    broker.client.ping()
    count = int(n)
    t0 = time.perf_counter()
    for _ in range(count):
        noop.send(time.time())
    emit(**timed_rate(count, time.perf_counter() - t0))


def latency(n: str, rate: str) -> None:
    broker.client.ping()
    for _ in paced(int(n), float(rate)):
        noop.send(time.time())
    emit(ok=True)


def info() -> None:
    import importlib.metadata as m

    emit(version=f"dramatiq {m.version('dramatiq')} (redis-py {m.version('redis')})")


if __name__ == "__main__":
    main({"enqueue": enqueue, "latency": latency, "clean": clean, "info": info})
