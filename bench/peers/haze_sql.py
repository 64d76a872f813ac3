"""haze's database driver as a benchmark peer: enqueue | bulk | worker | latency | clean.

``BENCH_LOOP=uvloop`` runs the producer and the worker (``queue:work --loop uvloop``) on
uvloop; otherwise both run on asyncio's own loop (``--loop asyncio``)."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from haze import App, Queue  # noqa: E402
from haze.connectors.migrations import ensure_queue_tables  # noqa: E402
from haze_loop import run  # noqa: E402
from records import emit  # noqa: E402


async def _app() -> App:
    app = App(root=HERE / "app")
    await app.__aenter__()
    await ensure_queue_tables(app)
    return app


def enqueue(n: str) -> None:
    async def go() -> None:
        app = await _app()
        from app.job.noop import noop

        t0 = time.perf_counter()
        for _ in range(int(n)):
            await noop.dispatch({"t": time.time()})
        dt = time.perf_counter() - t0
        await app.__aexit__(None, None, None)
        emit(n=int(n), seconds=dt, rate=int(n) / dt)

    run(go())


def bulk(n: str) -> None:
    async def go() -> None:
        app = await _app()
        from app.job.noop import noop

        t0 = time.perf_counter()
        for s in range(0, int(n), 1000):
            await Queue.bulk([noop.with_({"t": time.time()}) for _ in range(min(1000, int(n) - s))])
        dt = time.perf_counter() - t0
        await app.__aexit__(None, None, None)
        emit(n=int(n), seconds=dt, rate=int(n) / dt)

    run(go())


def latency(n: str, rate: str) -> None:
    async def go() -> None:
        app = await _app()
        from app.job.noop import noop

        t0 = time.perf_counter()
        for i in range(int(n)):
            d = t0 + i / float(rate) - time.perf_counter()
            if d > 0:
                await asyncio.sleep(d)
            await noop.dispatch({"t": time.time()})
        await app.__aexit__(None, None, None)
        emit(ok=True)

    run(go())


def clean() -> None:
    async def go() -> None:
        app = await _app()
        db = app.database()
        # TRUNCATE where there is one, as raw_pg.py cleans: a DELETE leaves every row dead
        # behind it, and with autovacuum off (this machine's server) later steps would
        # claim through them.
        empty = "DELETE FROM" if db.dialect == "sqlite" else "TRUNCATE TABLE"
        await db.execute(f"{empty} jobs")
        await db.execute(f"{empty} failed_jobs")
        await app.__aexit__(None, None, None)

    run(go())


def worker_cmd() -> list[str]:
    return [
        sys.executable,
        "-m",
        "haze.cli",
        "--root",
        str(HERE / "app"),
        "queue:work",
        "--connection",
        "db",
        "--queue",
        "bench",
        "--loop",
        os.environ.get("BENCH_LOOP", "asyncio"),
    ]


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])
