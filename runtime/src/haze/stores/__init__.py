"""Stores: ``memory`` now; ``redis``, ``database`` and ``kv`` load lazily by driver name."""

from __future__ import annotations

from typing import Any

from haze._kernel.deps import load_by_name
from haze.contracts.store import Store

__all__ = ["Store", "create_store"]

# driver name -> (module, class). Imported only when a config names the driver.
_STORES = {
    "memory": ("haze.stores.memory", "MemoryStore"),
    "redis": ("haze.stores.redis", "RedisStore"),
    "database": ("haze.stores.database", "database_store"),
    "kv": ("haze_cloudflare.kv", "KVStore"),
}


def create_store(name: str, options: dict[str, Any], app: Any, source: str) -> Store:
    driver = options["driver"]
    module_name, cls_name = _STORES[driver]
    cls = load_by_name(
        module_name,
        cls_name,
        what=f"the {driver!r} store",
        source=source,
        key=f"stores.{name}.driver",
    )
    store: Store = cls(name, options, app) if driver != "memory" else cls(name, options)
    return store
