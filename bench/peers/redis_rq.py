"""RQ as a peer. Worker: ``rq worker bench`` (its default Worker forks a work-horse per
job). Bulk: ``Queue.enqueue_many``."""

from __future__ import annotations

import importlib
import time
from typing import Any

from records import emit, paced, record
from redis_common import CHUNK, QUEUE, REDIS_URL, clean, main, timed_rate


def noop(t: float) -> None:
    record(t)


def _target() -> Any:
    # RQ will not run a function from __main__: name the importable module's one.
    return importlib.import_module("redis_rq").noop


def _queue() -> Any:
    from redis import Redis
    from rq import Queue

    conn = Redis.from_url(REDIS_URL)
    conn.ping()
    return Queue(QUEUE, connection=conn)


def enqueue(n: str) -> None:
    q, f = _queue(), _target()
    count = int(n)
    t0 = time.perf_counter()
    for _ in range(count):
        q.enqueue(f, time.time())
    emit(**timed_rate(count, time.perf_counter() - t0))


def bulk(n: str) -> None:
    from rq import Queue

    q, f = _queue(), _target()
    count = int(n)
    t0 = time.perf_counter()
    for s in range(0, count, CHUNK):
        q.enqueue_many(
            [Queue.prepare_data(f, (time.time(),)) for _ in range(min(CHUNK, count - s))]
        )
    emit(**timed_rate(count, time.perf_counter() - t0, chunk=CHUNK))


def latency(n: str, rate: str) -> None:
    q, f = _queue(), _target()
    for _ in paced(int(n), float(rate)):
        q.enqueue(f, time.time())
    emit(ok=True)


def info() -> None:
    import importlib.metadata as m

    emit(version=f"rq {m.version('rq')} (redis-py {m.version('redis')})")


if __name__ == "__main__":
    main({"enqueue": enqueue, "bulk": bulk, "latency": latency, "clean": clean, "info": info})
