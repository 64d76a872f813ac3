"""Procrastinate (PostgreSQL, LISTEN/NOTIFY) as a peer: enqueue | bulk | latency | clean.

Runs in its own venv (bench/.venvs/procrastinate); worker: `procrastinate worker`
(one process, its default concurrency 1).
"""

import asyncio
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import procrastinate
from records import emit, record

DSN = os.environ["BENCH_PG_DSN"]
app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=DSN))


@app.task(name="noop", queue="bench")
async def noop(t: float) -> None:
    record(t)


def enqueue(n: str) -> None:
    async def go() -> None:
        async with app.open_async():
            t0 = time.perf_counter()
            for _ in range(int(n)):
                await noop.defer_async(t=time.time())
            dt = time.perf_counter() - t0
        emit(n=int(n), seconds=dt, rate=int(n) / dt)

    asyncio.run(go())


def bulk(n: str) -> None:
    async def go() -> None:
        async with app.open_async():
            t0 = time.perf_counter()
            for s in range(0, int(n), 1000):
                await noop.batch_defer_async(
                    *({"t": time.time()} for _ in range(min(1000, int(n) - s)))
                )
            dt = time.perf_counter() - t0
        emit(n=int(n), seconds=dt, rate=int(n) / dt)

    asyncio.run(go())


def latency(n: str, rate: str) -> None:
    async def go() -> None:
        async with app.open_async():
            t0 = time.perf_counter()
            for i in range(int(n)):
                d = t0 + i / float(rate) - time.perf_counter()
                if d > 0:
                    await asyncio.sleep(d)
                await noop.defer_async(t=time.time())
        emit(ok=True)

    asyncio.run(go())


def clean() -> None:
    import psycopg

    with psycopg.connect(DSN, autocommit=True) as c:
        if c.execute("select to_regclass('procrastinate_jobs')").fetchone()[0] is None:
            import subprocess

            subprocess.check_call(
                [
                    os.path.join(os.path.dirname(sys.executable), "procrastinate"),
                    "--app=procrastinate_peer.app",
                    "schema",
                    "--apply",
                ],
                cwd=os.path.dirname(os.path.abspath(__file__)),
            )
        else:
            c.execute("TRUNCATE procrastinate_jobs CASCADE")


def worker_cmd() -> list[str]:
    return [
        os.path.join(os.path.dirname(sys.executable), "procrastinate"),
        "--app=procrastinate_peer.app",
        "worker",
        "--queues",
        "bench",
    ]


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])
