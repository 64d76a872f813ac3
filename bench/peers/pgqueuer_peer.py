"""PgQueuer (PostgreSQL, LISTEN/NOTIFY, batched dequeue) as a peer: enqueue | bulk |
latency | clean | worker.

Runs in its own venv (bench/.venvs/pgqueuer, ``bench/setup_peers.sh``), on asyncpg, the
driver of its own benchmark tool (``tools/benchmark.py``), with that tool's dequeue
batch size (10, also ``QueueManager.run``'s default; ``BENCH_PGQ_BATCH`` overrides) and
its default durability (logged tables, like every other row).
"""

import asyncio
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import asyncpg
from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager
from records import emit, record

DSN = os.environ["BENCH_PG_DSN"]
BATCH = int(os.environ.get("BENCH_PGQ_BATCH", "10"))


def _payload() -> bytes:
    return json.dumps({"t": time.time()}).encode()


async def _queries() -> tuple[asyncpg.Connection, Queries]:
    conn = await asyncpg.connect(DSN)
    return conn, Queries(AsyncpgDriver(conn))


def enqueue(n: str) -> None:
    async def go() -> None:
        conn, q = await _queries()
        t0 = time.perf_counter()
        for _ in range(int(n)):
            await q.enqueue("noop", _payload())
        dt = time.perf_counter() - t0
        await conn.close()
        emit(n=int(n), seconds=dt, rate=int(n) / dt)

    asyncio.run(go())


def bulk(n: str) -> None:
    async def go() -> None:
        conn, q = await _queries()
        t0 = time.perf_counter()
        for s in range(0, int(n), 1000):
            k = min(1000, int(n) - s)
            await q.enqueue(["noop"] * k, [_payload() for _ in range(k)], [0] * k)
        dt = time.perf_counter() - t0
        await conn.close()
        emit(n=int(n), seconds=dt, rate=int(n) / dt)

    asyncio.run(go())


def latency(n: str, rate: str) -> None:
    async def go() -> None:
        conn, q = await _queries()
        t0 = time.perf_counter()
        for i in range(int(n)):
            d = t0 + i / float(rate) - time.perf_counter()
            if d > 0:
                await asyncio.sleep(d)
            await q.enqueue("noop", _payload())
        await conn.close()
        emit(ok=True)

    asyncio.run(go())


def clean() -> None:
    async def go() -> None:
        conn, q = await _queries()
        if not await q.schema_is_installed():
            await q.install()
        await q.clear_queue()
        await q.clear_queue_log()
        await conn.close()

    asyncio.run(go())


def worker() -> None:
    async def go() -> None:
        conn = await asyncpg.connect(DSN)
        qm = QueueManager(Queries(AsyncpgDriver(conn)))

        @qm.entrypoint("noop")
        async def noop(job: Job) -> None:
            record(json.loads(job.payload or b"{}")["t"])

        await qm.run(batch_size=BATCH)

    asyncio.run(go())


def worker_cmd() -> list[str]:
    return [sys.executable, os.path.abspath(__file__), "worker"]


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])
