"""The ceiling: redis-py LPUSH (single, and pipelined for bulk) and one BRPOP loop.

``worker``: one process taking one item at a time until SIGTERM. No framework, no
acknowledgement, no retry: what any queue on Redis pays at least.
"""

from __future__ import annotations

import signal
import time
from typing import Any

import redis
from records import emit, paced, record
from redis_common import CHUNK, REDIS_URL, clean, main, timed_rate

KEY = "bench:raw"


def _client() -> Any:
    r = redis.Redis.from_url(REDIS_URL)
    r.ping()
    return r


def enqueue(n: str) -> None:
    r = _client()
    count = int(n)
    t0 = time.perf_counter()
    for _ in range(count):
        r.lpush(KEY, repr(time.time()))
    emit(**timed_rate(count, time.perf_counter() - t0))


def bulk(n: str) -> None:
    r = _client()
    count = int(n)
    t0 = time.perf_counter()
    for s in range(0, count, CHUNK):
        pipe = r.pipeline(transaction=False)
        for _ in range(min(CHUNK, count - s)):
            pipe.lpush(KEY, repr(time.time()))
        pipe.execute()
    emit(**timed_rate(count, time.perf_counter() - t0, chunk=CHUNK))


def latency(n: str, rate: str) -> None:
    r = _client()
    for _ in paced(int(n), float(rate)):
        r.lpush(KEY, repr(time.time()))
    emit(ok=True)


def worker() -> None:
    r = _client()
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    while not stop:
        item = r.brpop([KEY], timeout=1)
        if item is not None:
            record(float(item[1]))


def info() -> None:
    emit(version=f"redis-py {redis.__version__} (server {_client().info()['redis_version']})")


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
