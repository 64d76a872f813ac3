"""Durable-workflow benchmark: steps/s of a 10-step no-op workflow on PostgreSQL and
Redis, beside DBOS on the same PostgreSQL, and haze's per-step cost against a plain job
and against one raw ``INSERT`` + ``COMMIT``.

    python bench/workflows.py [--runs 200] [--only haze-postgres,dbos,...]

Every row is sequential (one worker slot, one run or job at a time), so the rows
compare the cost of one step, not how far each scales:

* ``haze-<backend>``: ``Workflow.start`` of RUNS runs of ``ten_steps`` (ten
  ``run.step`` calls of a no-op), one in-process worker with ``concurrency`` 1, clock
  from the first start to the last run's ``done``; µs/step = wall / (10 × RUNS).
* ``haze-job-<backend>``: 10 × RUNS no-op jobs through the same worker (dispatched
  first, untimed; clock from the worker's start to the queue being empty): the cost of
  one plain job, the baseline a step is held against.
* ``raw-insert``: 10 × RUNS single-row ``INSERT`` + ``COMMIT`` on PostgreSQL with
  psycopg (one connection): the least a step that records its result can cost there.
* ``dbos``: RUNS DBOS workflows of ten ``@DBOS.step`` no-ops, started and awaited one
  at a time (``peers/dbos_peer.py``, in bench/.venvs/dbos from ``setup_peers.sh``).

On this shared 2-core machine the numbers move from run to run: read them as a rough
comparison, never as a pass/fail.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# bench/redis.py would shadow the redis client: this folder is not an import root here
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
PG_ADMIN = os.environ.get("BENCH_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")
PG_DSN = os.environ.get("BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/haze_wf_bench")
DBOS_DSN = os.environ.get("BENCH_DBOS_DSN", "postgresql://postgres@127.0.0.1:5432/dbos_bench")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/13")
DBOS_PY = HERE / ".venvs" / "dbos" / "bin" / "python"
STEPS = 10
#: Plain no-op jobs run so far (the job row's clock stops when all have run).
DONE = [0]


def _ensure_db(dsn: str) -> None:
    import psycopg

    name = dsn.rsplit("/", 1)[1]
    with psycopg.connect(PG_ADMIN, autocommit=True) as c:
        if not c.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            c.execute(f'CREATE DATABASE "{name}"')


def _app(backend: str) -> Any:
    from haze import (
        App,
        define_cache_config,
        define_database_config,
        define_queue_config,
        define_redis_config,
    )

    if backend == "postgres":
        _ensure_db(PG_DSN)
        conn = {"driver": "database", "connection": "main", "concurrency": 1}
        return App(
            queue=define_queue_config(default="q", connections={"q": conn}, store="db"),
            database=define_database_config(default="main", connections={"main": {"url": PG_DSN}}),
            cache=define_cache_config(
                default="db", stores={"db": {"driver": "database", "connection": "main"}}
            ),
        )
    import redis

    redis.Redis.from_url(REDIS_URL).flushdb()
    conn = {"driver": "redis", "url": REDIS_URL, "concurrency": 1}
    return App(
        queue=define_queue_config(default="q", connections={"q": conn}, store="r"),
        cache=define_cache_config(
            default="r", stores={"r": {"driver": "redis", "connection": "r"}}
        ),
        redis=define_redis_config(default="r", connections={"r": {"url": REDIS_URL}}),
    )


@functools.cache
def _definitions() -> tuple[Any, Any]:
    from haze import define_job, workflow

    def noop(i: int) -> int:
        return i

    @workflow(name="bench.ten_steps")
    async def ten_steps(run: Any) -> int:
        total = 0
        for i in range(STEPS):
            total += await run.step(f"step {i}", noop, i)
        return total

    @define_job(name="bench.noop_job")
    async def noop_job(payload: Any) -> None:
        DONE[0] += 1

    return ten_steps, noop_job


async def _haze(backend: str, runs: int, jobs: bool) -> dict[str, float]:
    from haze import Workflow
    from haze._workers.worker import Worker
    from haze.connectors.migrations import ensure_queue_tables

    ten_steps, noop_job = _definitions()
    DONE[0] = 0
    app = _app(backend)
    async with app:
        if backend == "postgres":
            await ensure_queue_tables(app)
        if jobs:
            for _ in range(runs * STEPS):
                await noop_job.dispatch({})
        worker = Worker(app, "q", None, 1, sleep=0.01, max_sleep=0.02)
        start, cpu = time.perf_counter(), time.process_time()
        worker.start()
        if jobs:
            while DONE[0] < runs * STEPS:
                await asyncio.sleep(0.002)
        else:
            ids = [await Workflow.start(ten_steps) for _ in range(runs)]
            for rid in ids:
                status = await Workflow.wait(rid, timeout=600)
                assert status.state == "done", status
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        await worker.stop()
    return {"steps": runs * STEPS, "wall": wall, "cpu": cpu}


def _raw_insert(runs: int) -> dict[str, float]:
    import psycopg

    _ensure_db(PG_DSN)
    with psycopg.connect(PG_DSN) as c:
        c.execute("CREATE TABLE IF NOT EXISTS bench_raw_step (id bigserial, result text)")
        c.execute("TRUNCATE bench_raw_step")
        c.commit()
        start, cpu = time.perf_counter(), time.process_time()
        for i in range(runs * STEPS):
            c.execute("INSERT INTO bench_raw_step (result) VALUES (%s)", (str(i),))
            c.commit()
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return {"steps": runs * STEPS, "wall": wall, "cpu": cpu}


def _dbos(runs: int) -> dict[str, float]:
    if not DBOS_PY.exists():
        raise RuntimeError("bench/.venvs/dbos is missing: run bench/setup_peers.sh")
    _ensure_db(DBOS_DSN)
    out = subprocess.run(
        [str(DBOS_PY), str(HERE / "peers" / "dbos_peer.py"), str(runs), DBOS_DSN],
        capture_output=True,
        text=True,
        timeout=1200,
        check=True,
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


ROWS: dict[str, tuple[str, Callable[[int], dict[str, float]]]] = {
    "haze-postgres": (
        "10-step workflow, 1 slot",
        lambda n: asyncio.run(_haze("postgres", n, False)),
    ),
    "haze-redis": ("10-step workflow, 1 slot", lambda n: asyncio.run(_haze("redis", n, False))),
    "dbos": ("10-step workflow, awaited in turn", _dbos),
    "haze-job-postgres": (
        "plain no-op job, 1 slot",
        lambda n: asyncio.run(_haze("postgres", n, True)),
    ),
    "haze-job-redis": ("plain no-op job, 1 slot", lambda n: asyncio.run(_haze("redis", n, True))),
    "raw-insert": ("INSERT + COMMIT, one connection", _raw_insert),
}


def table(results: dict[str, dict[str, float] | str]) -> str:
    def us(name: str) -> float | None:
        r = results.get(name)
        return r["wall"] / r["steps"] * 1e6 if isinstance(r, dict) else None

    lines = [
        "| row | what | steps/s | µs/step (wall) | µs/step (cpu) | vs plain job | vs raw INSERT |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        what = ROWS[name][0]
        if not isinstance(r, dict):
            lines.append(f"| {name} | {what} | error: {r} | | | | |")
            continue
        per = us(name) or 0.0
        backend = name.rsplit("-", 1)[-1]
        job, raw = us(f"haze-job-{backend}"), us("raw-insert")
        vs_job = f"{per / job:.2f}×" if job and name.startswith("haze-") else ""
        vs_raw = f"{per / raw:.2f}×" if raw and name != "raw-insert" else ""
        lines.append(
            f"| {name} | {what} | {r['steps'] / r['wall']:,.0f} | {per:,.0f} | "
            f"{r['cpu'] / r['steps'] * 1e6:,.0f} | {vs_job} | {vs_raw} |"
        )
    lines.append(f"\nload average {os.getloadavg()[0]:.1f}; sequential rows, one run at a time.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=200, help="workflow runs per row (200)")
    parser.add_argument("--only", default="", help="rows, comma-separated")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(ROWS)
    results: dict[str, dict[str, float] | str] = {}
    for name in names:
        print(f"running {name} ...", file=sys.stderr, flush=True)
        try:
            results[name] = ROWS[name][1](args.runs)
        except Exception as e:  # a row that cannot run here is shown, not fatal
            results[name] = f"{type(e).__name__}: {str(e)[:120]}"
    print(table(results))
    return 1 if any(isinstance(r, str) for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
