"""Redis test support shared by the contract suites and ``tests/drivers``.

The contract files load this module by path (``runpy.run_path``), as they do for
``tests/database/sqld.py``; they take ``SPEC`` (the ``redis`` entry of the driver
contract's ``DRIVERS``) and ``STORE`` (the ``redis`` entry of the store contract).

Every app or store gets its own key prefix, and its keys are deleted afterwards.
``HAZE_TEST_REDIS_URL`` points the tests at another server (default
``redis://127.0.0.1:6379/0``). Without a reachable Redis the tests are skipped,
except under CI (``CI`` set), where they fail.
"""

from __future__ import annotations

import os
import socket
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from services import needs_server

REDIS_URL = os.environ.get("HAZE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def redis_reachable(url: str = REDIS_URL) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 6379), 0.5):
            return True
    except OSError:
        return False


#: Skips without a Redis server; fails under CI=true (tests/services.py).
needs_redis = needs_server("Redis", REDIS_URL)


def unique_prefix(kind: str = "t") -> str:
    return f"hz{kind}-{uuid.uuid4().hex[:12]}"


def delete_prefix(prefix: str, url: str = REDIS_URL) -> int:
    """Delete every key under ``prefix`` (synchronously: spec hooks are sync)."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        n = 0
        batch: list[bytes] = []
        for key in client.scan_iter(match=f"{prefix}*", count=1000):
            batch.append(key)
            if len(batch) >= 500:
                n += int(client.delete(*batch))
                batch.clear()
        if batch:
            n += int(client.delete(*batch))
        return n
    finally:
        client.close()


# --------------------------------------------------------------------------- driver contract

_prefixes: list[str] = []


def _setup() -> Callable[[], None]:
    prefix = unique_prefix("c")
    _prefixes.append(prefix)

    def undo() -> None:
        _prefixes.remove(prefix)
        delete_prefix(prefix + ":")

    return undo


def _connection(tmp: Path) -> dict[str, Any]:
    contract = sys.modules["haze_contract_conftest"]
    queues = getattr(contract, "_DATABASE_QUEUES", contract.QUEUES)
    return {"driver": "redis", "url": REDIS_URL, "prefix": _prefixes[-1], "queues": list(queues)}


def _driver_spec() -> Any:
    contract = sys.modules.get("haze_contract_conftest")
    if contract is None:
        return None
    return contract.DriverSpec(
        "redis",
        connection=_connection,
        capabilities=contract.FULL | {"remote"},
        setup=_setup,
        marks=(needs_redis,),
    )


SPEC = _driver_spec()


# --------------------------------------------------------------------------- store contract


async def _redis_store(tmp: Path) -> Any:
    from haze import App, define_redis_config
    from haze.stores.redis import RedisStore

    prefix = unique_prefix("s") + ":"

    class CleanRedisStore(RedisStore):
        async def close(self) -> None:
            await super().close()
            delete_prefix(prefix)

    app = App(
        redis=define_redis_config(
            default="default", connections={"default": {"url": REDIS_URL, "key_prefix": prefix}}
        )
    )
    return CleanRedisStore("contract", {"driver": "redis", "prefix": "store:"}, app)


STORE = ("redis", _redis_store, (needs_redis,))
