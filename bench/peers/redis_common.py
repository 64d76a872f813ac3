"""Shared by the Redis peer scripts (``redis_<peer>.py``), in whichever venv they run.

The benchmark owns one Redis database (``BENCH_REDIS_URL``, default db 9) and flushes
only that one: other processes (test suites) use db 0 of the same server at the same
time, so a URL naming db 0 is refused.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator, Callable
from urllib.parse import urlsplit

REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/9")
QUEUE = "bench"
CHUNK = 1000


def _db(url: str) -> int:
    path = urlsplit(url).path.strip("/")
    return int(path) if path else 0


if _db(REDIS_URL) == 0:
    raise SystemExit(
        f"BENCH_REDIS_URL={REDIS_URL} names db 0, which the benchmark would FLUSHDB while "
        "test suites use it; point it at a database of its own (e.g. redis://127.0.0.1:6379/9)"
    )


def clean() -> None:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.flushdb()
    finally:
        client.close()


async def apaced(n: int, rate: float) -> AsyncIterator[int]:
    """0..n-1 at ``rate`` per second on an absolute schedule (a late step does not drift)."""
    t0 = time.perf_counter()
    for i in range(n):
        d = t0 + i / rate - time.perf_counter()
        if d > 0:
            await asyncio.sleep(d)
        yield i


def timed_rate(n: int, seconds: float, **extra: object) -> dict[str, object]:
    return {"n": n, "seconds": seconds, "rate": n / seconds, **extra}


def main(commands: dict[str, Callable[..., None]]) -> None:
    """``script COMMAND [ARGS...]``: enqueue N | bulk N | latency N RATE | worker | clean | info."""
    cmd, *args = sys.argv[1:]
    if cmd not in commands:
        raise SystemExit(f"{sys.argv[0]}: unknown command {cmd!r} (known: {', '.join(commands)})")
    commands[cmd](*args)
