"""Queue drivers, one module each, loaded by driver name when a connection is first used."""

from __future__ import annotations

import importlib
from typing import Any

from ..errors import ConfigError
from .base import Driver, FailedJob, FailedJobStore, Reserved

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
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and module_name.startswith(e.name):
            raise ConfigError(
                f"the {kind!r} driver is not available in this version of haze",
                source=source,
                key=f"connections.{name}.driver",
            ) from None
        raise
    driver: Driver = getattr(module, cls_name)(name, options, app)
    return driver
