"""Queue drivers, one module each, loaded by driver name when a connection is first used."""

from __future__ import annotations

from typing import Any

from haze._kernel.deps import load_by_name
from haze.contracts.driver import Driver, FailedJob, FailedJobStore, Reserved

__all__ = ["Driver", "FailedJob", "FailedJobStore", "Reserved", "create_driver"]

# driver name -> (module, class). A missing optional client raises
# MissingDependencyError from inside the module, naming the haze[extra] to install.
_DRIVERS = {
    "sync": ("haze.drivers.sync", "SyncDriver"),
    "memory": ("haze.drivers.memory", "MemoryDriver"),
    "redis": ("haze.drivers.redis", "RedisDriver"),
    "database": ("haze.drivers.database", "DatabaseDriver"),
    "sqs": ("haze.drivers.sqs", "SqsDriver"),
    "cloudflare": ("haze.drivers.cloudflare", "CloudflareDriver"),
    "failover": ("haze.drivers.failover", "FailoverDriver"),
}


def create_driver(name: str, options: dict[str, Any], app: Any, source: str) -> Driver:
    kind = options["driver"]
    module_name, cls_name = _DRIVERS[kind]
    cls = load_by_name(
        module_name,
        cls_name,
        what=f"the {kind!r} driver",
        source=source,
        key=f"connections.{name}.driver",
    )
    driver: Driver = cls(name, options, app)
    return driver
