"""Buffers a PostgreSQL claim reads after N jobs were done, autovacuum off, before and
after the worker's own VACUUM (bench/README.md, "A PostgreSQL backlog").

    .venv/bin/python bench/pg_vacuum_claim.py [--done 10000,100000,1000000]

For each N: the jobs table emptied, N jobs done (inserted due, claimed, deleted: the
dead row versions and index entries a worker leaves behind, made in three statements
instead of N claims), 200 due jobs queued behind them; then ``EXPLAIN (ANALYZE,
BUFFERS)`` of the claim statement (8 rows, no lapsed-lease look), twice (the first one
marks the dead entries it steps over; the second is a worker's steady state), then the
driver's own VACUUM (``maintain()``), then the claim again. The database is
``BENCH_VAC_DSN`` (default ``haze_bench_vacuum``); its table has autovacuum off, whatever
the server's setting.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from typing import Any

import psycopg
from haze import App, define_database_config, define_queue_config
from haze.connectors.migrations import ensure_queue_tables
from haze.drivers.sql import DatabaseDriver
from haze.drivers.sql.claim import _branches

ADMIN = os.environ.get("BENCH_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")
DSN = os.environ.get("BENCH_VAC_DSN", "postgresql://postgres@127.0.0.1:5432/haze_bench_vacuum")
TABLE = "vac_jobs"


def _prepare() -> None:
    name = psycopg.conninfo.conninfo_to_dict(DSN)["dbname"]
    with psycopg.connect(ADMIN, autocommit=True) as c:
        if not c.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            c.execute(f'CREATE DATABASE "{name}"')


def _done_jobs(n: int) -> None:
    """N jobs done: due, claimed, deleted, in that order (as a worker leaves them)."""
    now = time.time()
    with psycopg.connect(DSN, autocommit=True) as c:
        c.execute(f"TRUNCATE {TABLE}")
        c.execute(
            f"INSERT INTO {TABLE} (queue, payload, attempts, available_at, created_at, turn) "
            "SELECT 'default', '{}', 0, %s + g * 1e-4, %s, %s + g * 1e-4 "
            "FROM generate_series(1, %s) g",
            (now - 3600, now, now - 3600, n),
        )
        c.execute(f"UPDATE {TABLE} SET reserved_at = %s, attempts = 1", (now,))
        c.execute(f"DELETE FROM {TABLE}")
        c.execute(
            f"INSERT INTO {TABLE} (queue, payload, attempts, available_at, created_at, turn) "
            "SELECT 'default', '{}', 0, %s, %s, %s FROM generate_series(1, 200)",
            (now - 1, now, now - 1),
        )
        c.execute("SELECT pg_stat_force_next_flush()")
        c.execute("SELECT 1")


async def _claim_buffers(driver: DatabaseDriver) -> tuple[int, float]:
    now = time.time()
    params = (*_branches("default", now, 8, 0.0), now, now)
    rows = await driver.db.fetchall(
        f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {driver.sql['claim_many']}", params
    )
    plan: Any = rows[0][0]
    plan = json.loads(plan) if isinstance(plan, str) else plan
    top = plan[0]["Plan"]
    return int(top["Shared Hit Blocks"]) + int(top["Shared Read Blocks"]), float(
        plan[0]["Execution Time"]
    )


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--done", default="10000,100000")
    args = ap.parse_args()
    _prepare()
    conn = {"driver": "database", "connection": "main", "table": TABLE}
    conn["failed_table"] = f"{TABLE}_failed"
    app = App(
        queue=define_queue_config(default="db", connections={"db": conn}),
        database=define_database_config(default="main", connections={"main": {"url": DSN}}),
    )
    async with app:
        await ensure_queue_tables(app)
        await app.database().execute(f"ALTER TABLE {TABLE} SET (autovacuum_enabled = false)")
        driver = app.driver("db")
        assert isinstance(driver, DatabaseDriver)
        print(
            "| jobs done | buffers a claim, first | steady (no VACUUM) | ms | "
            "after the worker's VACUUM | ms | VACUUM s |"
        )
        print("|---|---|---|---|---|---|---|")
        for n in (int(x) for x in args.done.split(",")):
            _done_jobs(n)
            first, _ = await _claim_buffers(driver)
            steady, ms = await _claim_buffers(driver)
            t0 = time.perf_counter()
            assert await driver.maintain(), "the driver did not vacuum"
            took = time.perf_counter() - t0
            after, ms_after = await _claim_buffers(driver)
            print(
                f"| {n:,} | {first:,} | {steady:,} | {ms:.2f} | {after:,} | "
                f"{ms_after:.2f} | {took:.1f} |",
                flush=True,
            )
    print(f"\n1-min load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    asyncio.run(main())
