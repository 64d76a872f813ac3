"""DBOS peer for bench/workflows.py: N runs of a 10-step no-op workflow on PostgreSQL.

Runs in bench/.venvs/dbos (``bench/setup_peers.sh``). Each workflow is started with
``DBOS.start_workflow`` and awaited in turn, with async steps (DBOS checkpoints each
step's output to its system database before the next one starts, as haze records each
step). Prints one JSON line: ``{"runs": N, "steps": 10 * N, "wall": s, "cpu": s}``.

    python peers/dbos_peer.py N DSN
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from dbos import DBOS, DBOSConfig

STEPS = 10


@DBOS.step()
async def noop(i: int) -> int:
    return i


@DBOS.workflow()
async def ten_steps() -> int:
    total = 0
    for i in range(STEPS):
        total += await noop(i)
    return total


async def main(n: int) -> dict[str, float]:
    for _ in range(20):  # warm-up: connections, prepared statements
        await (await DBOS.start_workflow_async(ten_steps)).get_result()
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        handle = await DBOS.start_workflow_async(ten_steps)
        assert await handle.get_result() == sum(range(STEPS))
    return {
        "runs": n,
        "steps": n * STEPS,
        "wall": time.perf_counter() - start,
        "cpu": time.process_time() - cpu,
    }


if __name__ == "__main__":
    n, dsn = int(sys.argv[1]), sys.argv[2]
    config: DBOSConfig = {"name": "haze-bench", "system_database_url": dsn, "log_level": "WARNING"}
    DBOS(config=config)
    DBOS.launch()
    try:
        print(json.dumps(asyncio.run(main(n))))
    finally:
        DBOS.destroy()
