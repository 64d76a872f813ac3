"""The ceiling: a bare SKIP LOCKED loop on one table with psycopg (enqueue | bulk | latency |
clean | worker). No framework, one connection, autocommit claim + delete."""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import psycopg
from records import emit, record

DSN = os.environ["BENCH_PG_DSN"]


def _conn() -> psycopg.Connection:
    return psycopg.connect(DSN, autocommit=True)


def clean() -> None:
    with _conn() as c:
        c.execute(
            "CREATE TABLE IF NOT EXISTS raw_jobs (id BIGSERIAL PRIMARY KEY, body TEXT NOT NULL)"
        )
        c.execute("TRUNCATE raw_jobs")


#: ``BENCH_RAW_NOTIFY=1``: every enqueue wakes the workers in the same statement, as
#: haze's PostgreSQL enqueue does (the like-for-like ceiling of a single dispatch).
NOTIFY = os.environ.get("BENCH_RAW_NOTIFY") == "1"
INSERT = "INSERT INTO raw_jobs (body) VALUES (%s)"
INSERT_NOTIFY = (
    "WITH j AS (INSERT INTO raw_jobs (body) VALUES (%s) RETURNING id) "
    "SELECT pg_notify('raw_jobs', '') FROM j"
)


#: ``BENCH_RAW_ASYNC=1``: the same loop on psycopg's async connection on asyncio, as an
#: asyncio library sends it (the floor of an async client on this machine).
ASYNC = os.environ.get("BENCH_RAW_ASYNC") == "1"


async def _enqueue_async(n: int, stmt: str) -> float:
    c = await psycopg.AsyncConnection.connect(DSN, autocommit=True)
    cur = c.cursor()
    t0 = time.perf_counter()
    for _ in range(n):
        await cur.execute(stmt, (json.dumps({"t": time.time()}),))
    dt = time.perf_counter() - t0
    await c.close()
    return dt


def enqueue(n: str) -> None:
    stmt = INSERT_NOTIFY if NOTIFY else INSERT
    if ASYNC:
        import asyncio

        dt = asyncio.run(_enqueue_async(int(n), stmt))
        emit(n=int(n), seconds=dt, rate=int(n) / dt)
        return
    with _conn() as c:
        t0 = time.perf_counter()
        for _ in range(int(n)):
            c.execute(stmt, (json.dumps({"t": time.time()}),))
        dt = time.perf_counter() - t0
    emit(n=int(n), seconds=dt, rate=int(n) / dt)


def bulk(n: str) -> None:
    with _conn() as c, c.cursor() as cur:
        t0 = time.perf_counter()
        for s in range(0, int(n), 1000):
            rows = [(json.dumps({"t": time.time()}),) for _ in range(min(1000, int(n) - s))]
            cur.executemany("INSERT INTO raw_jobs (body) VALUES (%s)", rows)
        dt = time.perf_counter() - t0
    emit(n=int(n), seconds=dt, rate=int(n) / dt)


def latency(n: str, rate: str) -> None:
    with _conn() as c:
        t0 = time.perf_counter()
        for i in range(int(n)):
            d = t0 + i / float(rate) - time.perf_counter()
            if d > 0:
                time.sleep(d)
            c.execute("INSERT INTO raw_jobs (body) VALUES (%s)", (json.dumps({"t": time.time()}),))
            c.execute("NOTIFY raw_jobs")
    emit(ok=True)


def worker() -> None:
    claim = (
        "DELETE FROM raw_jobs WHERE id = (SELECT id FROM raw_jobs ORDER BY id "
        "FOR UPDATE SKIP LOCKED LIMIT 1) RETURNING body"
    )
    with _conn() as c, _conn() as listener:
        listener.execute("LISTEN raw_jobs")
        while True:
            row = c.execute(claim).fetchone()
            if row is None:
                for _ in listener.notifies(timeout=1.0, stop_after=1):
                    pass
                continue
            record(json.loads(row[0])["t"])


def worker_cmd() -> list[str]:
    return [sys.executable, os.path.abspath(__file__), "worker"]


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])
