"""The ``redis`` store shared by several processes: add, increment and owner-checked
delete stay atomic when separate processes race on the same keys.

(The single-process behaviour is the store contract: tests/contract/test_store_contract.py.)
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter

from redis_spec import REDIS_URL, delete_prefix, needs_redis, unique_prefix

pytestmark = needs_redis

PROCESSES = 4
KEYS = 40
INCREMENTS = 150

CHILD = r"""
import asyncio, json, os, sys, time
from haze import App, define_redis_config
from haze.stores.redis import RedisStore

url, key_prefix, keys, increments = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])

async def main():
    app = App(redis=define_redis_config(default="default",
              connections={"default": {"url": url, "key_prefix": key_prefix}}))
    store = RedisStore("race", {"driver": "redis", "prefix": "s:"}, app)
    me = f"p{os.getpid()}"
    await store.increment("ready", 1, 120)
    while await store.get("go") is None:  # start together
        await asyncio.sleep(0.001)
    won = [i for i in range(keys) if await store.add(f"lock:{i}", me, 30)]
    seen = await asyncio.gather(*(store.increment("count", 1, 60) for _ in range(increments)))
    deleted = [i for i in range(keys) if await store.delete(f"lock:{i}", owner=me)]
    await store.close()
    print(json.dumps({"me": me, "won": won, "seen": seen, "deleted": deleted}))

asyncio.run(main())
"""


async def test_processes_race_add_increment_and_delete() -> None:
    from haze import App, define_redis_config
    from haze.stores.redis import RedisStore

    key_prefix = unique_prefix("m") + ":"
    try:
        procs = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                CHILD,
                REDIS_URL,
                key_prefix,
                str(KEYS),
                str(INCREMENTS),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            for _ in range(PROCESSES)
        ]
        app = App(
            redis=define_redis_config(
                default="default",
                connections={"default": {"url": REDIS_URL, "key_prefix": key_prefix}},
            )
        )
        store = RedisStore("race", {"driver": "redis", "prefix": "s:"}, app)
        for _ in range(6000):  # the children import haze and connect, then all go at once
            if await store.get("ready") == PROCESSES:
                break
            await asyncio.sleep(0.01)
        await store.put("go", True, 60)
        outputs = await asyncio.wait_for(asyncio.gather(*(p.communicate() for p in procs)), 60)
        results = []
        for (out, err), p in zip(outputs, procs, strict=True):
            assert p.returncode == 0, err.decode()
            results.append(json.loads(out.decode().strip().splitlines()[-1]))

        # add: every lock was won by exactly one process
        winners = Counter(i for r in results for i in r["won"])
        assert sorted(winners) == list(range(KEYS))
        assert set(winners.values()) == {1}
        # increment: nothing lost, and every caller saw a distinct value
        assert await store.get("count") == PROCESSES * INCREMENTS
        seen = [v for r in results for v in r["seen"]]
        assert sorted(seen) == list(range(1, PROCESSES * INCREMENTS + 1))
        ttl = await store.ttl("count")
        assert ttl is not None
        assert 0 < ttl <= 60  # set by the one increment that created the key
        # owner-checked delete: each process deleted exactly the locks it won
        for r in results:
            assert r["deleted"] == r["won"]
        assert await store.get_many([f"lock:{i}" for i in range(KEYS)]) == [None] * KEYS
        await store.close()
    finally:
        delete_prefix(key_prefix)
