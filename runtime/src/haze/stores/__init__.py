"""Stores: ``memory`` now; ``redis`` and ``database`` load lazily by driver name.

Any other driver name is a plugin (``haze._kernel.plugins``): registered in this process
with ``register_store``, or an installed distribution's entry point in the
``haze.stores`` group (the Cloudflare adapter's ``kv``). A store class is called
``cls(store_name, options, app)``.
"""

from __future__ import annotations

from typing import Any

from haze._kernel import plugins
from haze.contracts.store import Store

__all__ = ["GROUP", "REGISTRY", "Store", "create_store", "register_store", "store_class"]

#: The entry point group of third-party stores.
GROUP = plugins.STORES

# driver name -> (module, class). Imported only when a config names the driver.
REGISTRY = plugins.Registry(
    GROUP,
    {
        "memory": ("haze.stores.memory", "MemoryStore"),
        "redis": ("haze.stores.redis", "RedisStore"),
        "database": ("haze.stores.database", "database_store"),
    },
    taken="{name!r} is a built-in store; register under another name",
    what="the {name!r} store",
    unknown="no store is named {name!r} (known: {known}); a package adds one through "
    "the {group!r} entry point group",
)


def register_store(name: str, target: object) -> None:
    """Make ``{"driver": name}`` in ``config/cache.py`` use ``target``: a store class, or
    ``"module:Class"`` (imported on first use). A built-in store's name is not taken over."""
    REGISTRY.register(name, target)


def store_class(driver: str, *, source: str = "", key: str = "driver") -> Any:
    """The class (or factory) of the store named ``driver`` (built in, then plugins)."""
    return REGISTRY.load(driver, source=source, key=key)


def create_store(name: str, options: dict[str, Any], app: Any, source: str) -> Store:
    cls = store_class(options["driver"], source=source, key=f"stores.{name}.driver")
    store: Store = cls(name, options, app)
    return store
