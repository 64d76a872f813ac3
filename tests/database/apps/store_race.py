"""One contender in tests/database/test_faults.py's multi-process DatabaseStore race.

    python store_race.py URL TABLE INDEX INCREMENTS LOCKS GO_FILE

Waits for GO_FILE to exist (so every process starts together), then, with 8 concurrent
tasks, increments ``race:counter`` INCREMENTS times and tries ``add`` on each of LOCKS
keys once. Prints one JSON line: {"index", "last": [values seen], "won": [lock keys]}.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time


async def main() -> None:
    url, table, index, increments, locks, go = sys.argv[1:7]
    from haze import App, define_database_config
    from haze.stores.database import DatabaseStore

    app = App(database=define_database_config(default="main", connections={"main": {"url": url}}))
    store = DatabaseStore("race", {"driver": "database", "connection": "main", "table": table}, app)
    await store.get("race:warmup")  # connect and create the table before the start line
    deadline = time.monotonic() + 30
    while not os.path.exists(go):
        if time.monotonic() > deadline:
            raise SystemExit("no start signal")
        await asyncio.sleep(0.01)

    seen: list[int] = []
    won: list[str] = []
    sem = asyncio.Semaphore(8)

    async def inc() -> None:
        async with sem:
            seen.append(await store.increment("race:counter"))

    async def add(k: int) -> None:
        async with sem:
            if await store.add(f"race:lock:{k}", f"owner-{index}", 60):
                won.append(f"race:lock:{k}")

    jobs = [inc() for _ in range(int(increments))] + [add(k) for k in range(int(locks))]
    random.Random(int(index)).shuffle(jobs)  # adds and increments interleaved
    await asyncio.gather(*jobs)
    print(json.dumps({"index": int(index), "seen": seen, "won": won}), flush=True)
    await app.database().close()


if __name__ == "__main__":
    asyncio.run(main())
