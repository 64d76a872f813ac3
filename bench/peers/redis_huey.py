"""Huey (RedisHuey) as a peer. Worker: ``huey_consumer redis_huey.huey`` (its default:
one process, one worker thread). No bulk API."""

from __future__ import annotations

import time

from huey import RedisHuey
from records import emit, paced, record
from redis_common import QUEUE, REDIS_URL, clean, main, timed_rate

huey = RedisHuey(QUEUE, url=REDIS_URL)


@huey.task(name="noop")  # a fixed name: the producer runs this file as __main__
def noop(t: float) -> None:
    record(t)


def enqueue(n: str) -> None:
    huey.storage.conn.ping()
    count = int(n)
    t0 = time.perf_counter()
    for _ in range(count):
        noop(time.time())
    emit(**timed_rate(count, time.perf_counter() - t0))


def latency(n: str, rate: str) -> None:
    huey.storage.conn.ping()
    for _ in paced(int(n), float(rate)):
        noop(time.time())
    emit(ok=True)


def info() -> None:
    import importlib.metadata as m

    emit(version=f"huey {m.version('huey')} (redis-py {m.version('redis')})")


if __name__ == "__main__":
    # The consumer imports redis_huey; the producer must register the same task object.
    import redis_huey

    main(
        {
            "enqueue": redis_huey.enqueue,
            "latency": redis_huey.latency,
            "clean": clean,
            "info": redis_huey.info,
        }
    )
