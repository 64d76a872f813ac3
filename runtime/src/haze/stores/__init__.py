"""Stores: ``memory`` now; ``redis``, ``database`` and ``kv`` load lazily by driver name."""

from __future__ import annotations

import importlib
from typing import Any

from ..errors import ConfigError
from .base import Store

__all__ = ["Store", "create_store"]

# driver name -> (module, class). Imported only when a config names the driver.
_STORES = {
    "memory": ("haze.stores.memory", "MemoryStore"),
    "redis": ("haze.stores.redis", "RedisStore"),
    "database": ("haze.stores.database", "DatabaseStore"),
    "kv": ("haze_cloudflare.kv", "KVStore"),
}


def create_store(name: str, options: dict[str, Any], app: Any, source: str) -> Store:
    driver = options["driver"]
    module_name, cls_name = _STORES[driver]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and module_name.startswith(e.name):
            raise ConfigError(
                f"the {driver!r} store is not available in this version of haze",
                source=source,
                key=f"stores.{name}.driver",
            ) from None
        raise
    cls = getattr(module, cls_name)
    store: Store = cls(name, options, app) if driver != "memory" else cls(name, options)
    return store
