"""haze's ``redis`` driver (BullMQ data model) as a benchmark peer.

enqueue N | bulk N | latency N RATE | clean | info. The worker is ``haze queue:work``
(``python -m haze.cli --root redis_app queue:work``), started by bench/redis.py. Runs
from bench/.venvs/haze (this tree's runtime, editable, with hiredis and uvloop) when it
exists. ``BENCH_LOOP=uvloop`` runs the producer on uvloop (the haze-uvloop rows).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from haze import App, Queue  # noqa: E402
from haze_loop import run  # noqa: E402
from records import emit  # noqa: E402
from redis_common import CHUNK, apaced, clean, main, timed_rate  # noqa: E402

ROOT = HERE / "redis_app"


async def _app() -> App:
    app = App(root=ROOT)
    await app.__aenter__()
    # Connect before the clock starts, as every peer does.
    await Queue.size("bench")
    return app


def enqueue(n: str) -> None:
    async def go() -> None:
        app = await _app()
        from app.job.noop import noop

        count = int(n)
        t0 = time.perf_counter()
        for _ in range(count):
            await noop.dispatch({"t": time.time()})
        dt = time.perf_counter() - t0
        await app.__aexit__(None, None, None)
        emit(**timed_rate(count, dt))

    run(go())


def bulk(n: str) -> None:
    async def go() -> None:
        app = await _app()
        from app.job.noop import noop

        count = int(n)
        t0 = time.perf_counter()
        for s in range(0, count, CHUNK):
            await Queue.bulk([noop.with_({"t": time.time()}) for _ in range(min(CHUNK, count - s))])
        dt = time.perf_counter() - t0
        await app.__aexit__(None, None, None)
        emit(**timed_rate(count, dt, chunk=CHUNK))

    run(go())


def latency(n: str, rate: str) -> None:
    async def go() -> None:
        app = await _app()
        from app.job.noop import noop

        async for _ in apaced(int(n), float(rate)):
            await noop.dispatch({"t": time.time()})
        await app.__aexit__(None, None, None)
        emit(ok=True)

    run(go())


def info() -> None:
    import importlib.metadata as m

    try:
        m.version("hiredis")
        parser = "hiredis"
    except m.PackageNotFoundError:
        parser = "no hiredis"
    loop = os.environ.get("BENCH_LOOP", "asyncio")
    if loop == "uvloop":
        loop = f"uvloop {m.version('uvloop')}"
    emit(
        version=f"haze {m.version('haze-jobs')} (bullmq {m.version('bullmq')}, "
        f"redis-py {m.version('redis')}, {parser}, {loop})"
    )


if __name__ == "__main__":
    main({"enqueue": enqueue, "bulk": bulk, "latency": latency, "clean": clean, "info": info})
