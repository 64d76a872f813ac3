"""Celery (Redis broker, no result backend) as a peer. Worker: ``celery -A redis_celery
worker``: its default prefork pool, one child per CPU (2 here). Bulk: ``group(...)
.apply_async()``, which publishes one message per task."""

from __future__ import annotations

import time

from celery import Celery, group
from records import emit, paced, record
from redis_common import CHUNK, QUEUE, REDIS_URL, clean, main, timed_rate

app = Celery("redis_celery", broker=REDIS_URL)
app.conf.task_ignore_result = True
app.conf.task_default_queue = QUEUE
app.conf.worker_hijack_root_logger = False


@app.task(name="noop")
def noop(t: float) -> None:
    record(t)


def _connect() -> None:
    # Open the producer connection before the clock starts (as every peer does), with a
    # message on a queue no worker reads.
    noop.apply_async((time.time(),), queue="bench_warm")


def enqueue(n: str) -> None:
    _connect()
    count = int(n)
    t0 = time.perf_counter()
    for _ in range(count):
        noop.delay(time.time())
    emit(**timed_rate(count, time.perf_counter() - t0))


def bulk(n: str) -> None:
    _connect()
    count = int(n)
    t0 = time.perf_counter()
    for s in range(0, count, CHUNK):
        group(noop.s(time.time()) for _ in range(min(CHUNK, count - s))).apply_async()
    emit(**timed_rate(count, time.perf_counter() - t0, chunk=CHUNK))


def latency(n: str, rate: str) -> None:
    _connect()
    for _ in paced(int(n), float(rate)):
        noop.delay(time.time())
    emit(ok=True)


def info() -> None:
    import importlib.metadata as m

    emit(
        version=f"celery {m.version('celery')} (kombu {m.version('kombu')}, "
        f"redis-py {m.version('redis')})"
    )


if __name__ == "__main__":
    main({"enqueue": enqueue, "bulk": bulk, "latency": latency, "clean": clean, "info": info})
