"""Queue drivers, one module each, loaded by driver name when a connection is first used.

The built-in drivers are in ``REGISTRY``. Any other name is a plugin (``haze._base.plugins``):
one registered in this process with ``register_driver``, or an installed distribution's
entry point in the ``haze.drivers`` group::

    [project.entry-points."haze.drivers"]
    mine = "my_package.driver:MyDriver"     # config/queue.py: {"driver": "mine", ...}

A driver class is called ``cls(connection_name, options, context)``: ``context`` is a
``DriverContext`` (``haze.drivers.context``), never the App.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from haze._base import plugins
from haze.contracts.driver import Driver, FailedJob, FailedJobStore, Reserved

if TYPE_CHECKING:
    from haze.drivers.context import DriverContext

__all__ = [
    "GROUP",
    "REGISTRY",
    "Driver",
    "DriverContext",
    "FailedJob",
    "FailedJobStore",
    "Reserved",
    "create_driver",
    "driver_class",
    "register_driver",
]

#: The entry point group of third-party queue drivers.
GROUP = plugins.DRIVERS

# driver name -> (module, class). A missing optional client raises
# MissingDependencyError from inside the module, naming the haze-jobs[extra] to install.
REGISTRY = plugins.Registry(
    GROUP,
    {
        "sync": ("haze.drivers.sync", "SyncDriver"),
        "memory": ("haze.drivers.memory", "MemoryDriver"),
        "redis": ("haze.drivers.redis", "RedisDriver"),
        "database": ("haze.drivers.sql", "DatabaseDriver"),
        "sqs": ("haze.drivers.sqs", "SqsDriver"),
        "cloudflare": ("haze.drivers.cloudflare", "CloudflareDriver"),
        "failover": ("haze.drivers.failover", "FailoverDriver"),
        "vercel": ("haze.drivers.vercel", "VercelDriver"),
    },
    taken="{name!r} is a built-in queue driver; register under another name",
    what="the {name!r} driver",
    unknown="no queue driver is named {name!r} (known: {known}); a package adds one "
    "through the {group!r} entry point group",
)


def register_driver(name: str, target: object) -> None:
    """Make ``{"driver": name}`` use ``target``: a driver class, or ``"module:Class"``
    (imported on first use). A built-in driver's name is not taken over."""
    REGISTRY.register(name, target)


def driver_class(kind: str, *, source: str = "", key: str = "driver") -> Any:
    """The class of the queue driver named ``kind`` (built in, then plugins)."""
    return REGISTRY.load(kind, source=source, key=key)


def create_driver(
    name: str, options: dict[str, Any], context: DriverContext | None, source: str
) -> Driver:
    """Build connection ``name``'s driver, handing it ``context`` (None: built alone)."""
    cls = driver_class(options["driver"], source=source, key=f"connections.{name}.driver")
    driver: Driver = cls(name, options, context)
    return driver


def __getattr__(name: str) -> Any:
    # DriverContext loads on first use: importing haze (an App) loads no drivers module
    if name == "DriverContext":
        return importlib.import_module("haze.drivers.context").DriverContext
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
