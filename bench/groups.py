"""Tenant groups on the database and redis drivers: the cost of the group claim against
the plain claim, on the same backend in the same run.

    .venv/bin/python bench/groups.py [--n 5000] [--backends postgres,sqlite,redis] [--batch 8]

For each backend, two queues of N no-op rows are drained by one consumer loop
(``reserve_many(batch)`` then ``ack_and_claim``, the worker's own calls, without job
code) and timed from the first claim to the last ack:

* ``plain``: rows without a group, claimed in due order;
* ``groups``: the same N rows in 51 groups, one with 80% of them (the starving tenant)
  and 50 with the rest, claimed in turn order.

The ``drain ratio`` is groups/s over plain/s (the target is at least 0.8). Enqueue is
timed too (single dispatches, first 500 rows): a group's row reads its group's last turn
first. Prints one markdown table; the load (``uptime``) goes under it.

On ``redis`` (``BENCH_REDIS_URL``, default db 9; keys under a prefix of this run, deleted after) the
loop is the worker's own too: ``reserve`` then ``ack``, which claims the next job in the
same script call (the batch does not apply). Grouped jobs wait in BullMQ's prioritized
set with their turn as the priority; plain ones in the wait list.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# bench/ holds a redis.py: its folder on sys.path would shadow redis-py
HERE = Path(__file__).resolve().parent
sys.path[:] = [x for x in sys.path if Path(x or ".").resolve() != HERE]

from haze import App, Queue, define_database_config, define_job, define_queue_config  # noqa: E402
from haze.connectors.migrations import ensure_queue_tables  # noqa: E402

PG_URL = os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
URLS = {"postgres": PG_URL, "sqlite": "sqlite:////tmp/haze_bench_groups.db"}
#: the benchmarks' Redis database (not db 0, which the test suites use)
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/9")


@define_job(name="bench_groups_noop")
async def noop(payload: dict[str, Any]) -> None:
    return None


def _tenant(i: int) -> str | None:
    return "big" if i % 5 else f"t{i % 50}"


async def _fill(n: int, grouped: bool) -> float:
    """Queue n rows (500 single dispatches timed, the rest in bulk); enqueue seconds/row."""
    single = min(500, n)
    t0 = time.perf_counter()
    for i in range(single):
        p = noop.with_({"i": i})
        if grouped:
            p.in_group(_tenant(i) or "")
        await p.dispatch()
    per_row = (time.perf_counter() - t0) / single
    rest = []
    for i in range(single, n):
        p = noop.with_({"i": i})
        rest.append(p.in_group(_tenant(i) or "") if grouped else p)
        if len(rest) == 1000:
            await Queue.bulk(rest)
            rest = []
    if rest:
        await Queue.bulk(rest)
    return per_row


async def _drain(driver: Any, n: int, batch: int) -> float:
    t0 = time.perf_counter()
    jobs = await driver.reserve_many(["default"], batch, 0)
    seen = len(jobs)
    while jobs:
        _, jobs = await driver.ack_and_claim(jobs, "default", batch)
        seen += len(jobs)
    elapsed = time.perf_counter() - t0
    assert seen == n, f"drained {seen} of {n}"
    return elapsed


async def _drain_redis(driver: Any, n: int) -> float:
    t0 = time.perf_counter()
    seen = 0
    while job := await driver.reserve(["default"], 0):
        seen += 1
        await driver.ack(job)
    elapsed = time.perf_counter() - t0
    assert seen == n, f"drained {seen} of {n}"
    return elapsed


async def run_redis(n: int) -> dict[str, float]:
    prefix = f"benchgroups{os.getpid()}"
    conn = {"driver": "redis", "url": REDIS_URL, "prefix": prefix}
    app = App(queue=define_queue_config(default="r", connections={"r": conn}))
    out: dict[str, float] = {}
    async with app:
        try:
            for kind in ("plain", "groups"):
                out[f"{kind}_enqueue"] = 1 / await _fill(n, kind == "groups")
                out[f"{kind}_drain"] = n / await _drain_redis(app.driver("r"), n)
        finally:
            client = app.driver("r")._link().client  # type: ignore[attr-defined]
            keys = [k async for k in client.scan_iter(match=f"{prefix}:*", count=1000)]
            for i in range(0, len(keys), 1000):
                await client.delete(*keys[i : i + 1000])
    return out


async def run(backend: str, n: int, batch: int) -> dict[str, float]:
    if backend == "redis":
        return await run_redis(n)
    table = f"bench_groups_{os.getpid()}"
    conn = {"driver": "database", "connection": "main", "table": table,
            "failed_table": f"{table}_failed"}  # fmt: skip
    app = App(
        queue=define_queue_config(default="db", connections={"db": conn}),
        database=define_database_config(
            default="main", connections={"main": {"url": URLS[backend]}}
        ),
    )
    out: dict[str, float] = {}
    async with app:
        db = app.database()
        for t in (table, f"{table}_failed"):
            await db.execute(f"DROP TABLE IF EXISTS {t}")
        await ensure_queue_tables(app)
        try:
            for kind in ("plain", "groups"):
                out[f"{kind}_enqueue"] = 1 / await _fill(n, kind == "groups")
                if backend == "postgres":
                    await db.execute(f"ANALYZE {table}")
                out[f"{kind}_drain"] = n / await _drain(app.driver("db"), n, batch)
        finally:
            for t in (table, f"{table}_failed"):
                await db.execute(f"DROP TABLE IF EXISTS {t}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--backends", default="postgres,sqlite,redis")
    args = parser.parse_args()
    print(f"N={args.n}, claim batch {args.batch}\n")
    print(
        "| backend | plain drain/s | groups drain/s | drain ratio "
        "| plain enqueue/s | groups enqueue/s |"
    )
    print("|---|---|---|---|---|---|")
    for backend in args.backends.split(","):
        r = asyncio.run(run(backend, args.n, args.batch))
        ratio = r["groups_drain"] / r["plain_drain"]
        print(
            f"| {backend} | {r['plain_drain']:,.0f} | {r['groups_drain']:,.0f} | {ratio:.2f}x "
            f"| {r['plain_enqueue']:,.0f} | {r['groups_enqueue']:,.0f} |"
        )
    print("\nload:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
