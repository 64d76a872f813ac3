"""The dashboard's failed-jobs page as failed jobs pile up (bench/README.md, "Dashboard").

    .venv/bin/python bench/dashboard_failed.py                    # 1,000 and 5,000 rows
    .venv/bin/python bench/dashboard_failed.py --rows 1000 10000 --size 50000

For each row count: a fresh SQLite database whose failed-jobs table holds that many
failures with an exception of ``--size`` bytes each, and a dashboard on it. Measured in
this process: the page time of ``GET /failed`` (the median of ``--reps``), its response
size, and the peak of Python memory allocated while serving it (tracemalloc). The last
column reads every failed job, as the dashboard did before it paged at the store, for
contrast. Exits 1 when the page's memory or time at the largest count is more than
twice that at the smallest: both should stay flat.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from haze import App, define_database_config, define_queue_config
from haze.connectors.migrations import ensure_queue_tables
from haze.dashboard import create_app
from haze.dashboard._data import FailedFilter, failed_jobs
from starlette.testclient import TestClient


def _app(db: Path) -> App:
    return App(
        queue=define_queue_config(default="main", connections={"main": {"driver": "database"}}),
        database=define_database_config(
            default="db", connections={"db": {"url": f"sqlite:///{db}"}}
        ),
    )


async def _fill(db: Path, rows: int, size: int) -> None:
    async with _app(db) as app:
        await ensure_queue_tables(app)
        text = "ValueError: failed\n" + "x" * size
        params = [
            (
                f"bench{i:07d}",
                "main",
                "default",
                json.dumps({"v": 1, "id": f"bench{i:07d}", "job": "bench", "payload": {"i": i}}),
                text,
                1_700_000_000.0 + i,
            )
            for i in range(rows)
        ]
        await app.database().executemany(
            "INSERT INTO failed_jobs (uuid, connection, queue, payload, exception, failed_at) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            params,
        )


def _peak(fn: Any) -> tuple[Any, float]:
    """``fn()`` and the peak of Python memory it allocated, in MiB."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    try:
        result = fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak / 2**20


def measure(rows: int, size: int, reps: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="haze-bench-dash-") as tmp:
        db = Path(tmp) / "q.db"
        asyncio.run(_fill(db, rows, size))
        app = _app(db)
        with TestClient(create_app(app, authorize=lambda request: True)) as client:
            client.get("/failed")  # warm: templates, connections
            times = []
            for _ in range(reps):
                start = time.perf_counter()
                page = client.get("/failed")
                times.append(time.perf_counter() - start)
                assert f"{rows} failed job(s) match." in page.text, page.text[:400]
            _, page_mib = _peak(lambda: client.get("/failed"))
            assert client.portal is not None
            flt = FailedFilter(connection="main")
            _, all_mib = _peak(
                lambda: client.portal.call(failed_jobs, app, flt)  # type: ignore[union-attr]
            )
            client.portal.call(app.stop)
        return {
            "rows": rows,
            "page_ms": statistics.median(times) * 1000,
            "page_kib": len(page.content) / 1024,
            "page_mib": page_mib,
            "all_mib": all_mib,
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--size", type=int, default=10_000, help="exception bytes per row")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    results = []
    for rows in sorted(args.rows):
        print(f"measuring {rows} failed jobs of {args.size} bytes...", file=sys.stderr)
        results.append(measure(rows, args.size, args.reps))
    print("| failed jobs | GET /failed | page size | page peak memory | reading every job |")
    print("|---:|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r['rows']:,} | {r['page_ms']:.1f} ms | {r['page_kib']:.0f} KiB "
            f"| {r['page_mib']:.1f} MiB | {r['all_mib']:.1f} MiB |"
        )
    small, large = results[0], results[-1]
    grew = [
        what
        for what in ("page_ms", "page_mib")
        if large[what] > 2 * max(small[what], 1.0 if what == "page_mib" else 5.0)
    ]
    if grew:
        print(f"grew with the failed jobs: {', '.join(grew)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
