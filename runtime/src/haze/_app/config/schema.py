"""The config files' shapes: ``define_*_config`` (what a file writes) and the checked
config each becomes (``QueueConfig``, ``CacheConfig``, ...)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from haze._base.errors import ConfigError
from haze._base.routes import JobRoutes

__all__ = [
    "CacheConfig",
    "ConfigSpec",
    "DatabaseConfig",
    "HazeConfig",
    "QueueConfig",
    "RedisConfig",
    "define_cache_config",
    "define_database_config",
    "define_haze_config",
    "define_queue_config",
    "define_redis_config",
    "expect_kind",
]


@dataclass
class ConfigSpec:
    """A raw config mapping plus the place it was defined (file:line)."""

    kind: str
    raw: dict[str, Any]
    source: str

    def __repr__(self) -> str:
        return f"<{self.kind} config from {self.source}>"


def _caller_source(depth: int = 2) -> str:
    try:
        frame = sys._getframe(depth)
    except ValueError:  # pragma: no cover - no such frame
        return "<unknown>"
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


def define_queue_config(
    *,
    default: str | None = None,
    connections: Mapping[str, Mapping[str, Any]] | None = None,
    store: str | None = None,
    batches: Mapping[str, Any] | None = None,
    middleware: list[Any] | None = None,
    run_in_server: bool | Mapping[str, Any] = False,
    routes: Mapping[str, Mapping[str, str]] | None = None,
    **extra: Any,
) -> ConfigSpec:
    """Describe ``config/queue.py``: connections, the lock store, batches, global
    middleware, and ``routes`` (job-name glob -> its queue and/or connection).

    >>> config = define_queue_config(default="memory",
    ...     connections={"memory": {"driver": "memory", "concurrency": 2}},
    ...     routes={"mail.*": {"queue": "mail"}})
    """
    raw: dict[str, Any] = {
        "default": default,
        "connections": connections,
        "store": store,
        "batches": batches,
        "middleware": middleware,
        "run_in_server": run_in_server,
    }
    if routes is not None:
        raw["routes"] = routes
    raw.update(extra)
    return ConfigSpec("queue", raw, _caller_source())


def define_cache_config(
    *,
    default: str | None = None,
    stores: Mapping[str, Mapping[str, Any]] | None = None,
    **extra: Any,
) -> ConfigSpec:
    """Describe ``config/cache.py``: the stores that hold locks, middleware state and batches."""
    return ConfigSpec("cache", {"default": default, "stores": stores, **extra}, _caller_source())


def define_redis_config(
    *,
    default: str | None = None,
    connections: Mapping[str, Mapping[str, Any]] | None = None,
    **extra: Any,
) -> ConfigSpec:
    """Describe ``config/redis.py``: named Redis connections (``url``, ``key_prefix``)."""
    raw = {"default": default, "connections": connections, **extra}
    return ConfigSpec("redis", raw, _caller_source())


def define_database_config(
    *,
    default: str | None = None,
    connections: Mapping[str, Mapping[str, Any]] | None = None,
    **extra: Any,
) -> ConfigSpec:
    """Describe ``config/database.py``: named SQL connections by URL."""
    raw = {"default": default, "connections": connections, **extra}
    return ConfigSpec("database", raw, _caller_source())


def define_haze_config(*, cloudflare: Mapping[str, Any] | None = None, **extra: Any) -> ConfigSpec:
    """Describe ``haze.config.py``: build settings (e.g. the ``cloudflare.wrangler`` section)."""
    return ConfigSpec("haze", {"cloudflare": cloudflare, **extra}, _caller_source())


@dataclass
class QueueConfig:
    default: str
    connections: dict[str, dict[str, Any]]
    store: str | None
    batches_store: str | None
    batches_ttl: float
    middleware: list[Callable[..., Any]]
    run_in_server: dict[str, Any] | None
    source: str = "<default>"
    #: OpenTelemetry: True, False, or "auto" (on when the app has set an SDK provider).
    telemetry: bool | str = "auto"
    #: connection -> queue -> ``{"max", "release_after", "expire_after"}``, from the dict
    #: form of a connection's ``queues``; enforced by ``middleware.queue_limits``.
    queue_limits: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    #: Keep a status record for every job that does not say ``track=False``
    #: (``Queue.status``/``wait``); ``keep_result``: also keep results that long.
    track: bool = False
    keep_result: float | None = None
    #: ``routes``: job-name glob -> queue/connection (see ``haze._base.routes``).
    routes: JobRoutes = field(default_factory=JobRoutes)


@dataclass
class CacheConfig:
    default: str
    stores: dict[str, dict[str, Any]]
    source: str = "<default>"
    #: ``default=`` was given: it then names the lock and batch store (see App.queue_store).
    default_named: bool = False


@dataclass
class RedisConfig:
    default: str
    connections: dict[str, dict[str, Any]]
    source: str = "<default>"


@dataclass
class DatabaseConfig:
    default: str
    connections: dict[str, dict[str, Any]]
    source: str = "<default>"


@dataclass
class HazeConfig:
    cloudflare: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)
    source: str = "<default>"


def expect_kind(spec: object, kind: str, source: str) -> ConfigSpec:
    if not isinstance(spec, ConfigSpec):
        raise ConfigError(
            f"expected the result of define_{kind}_config(...), got {type(spec).__name__}",
            source=source,
            key="config",
        )
    if spec.kind != kind:
        raise ConfigError(
            f"expected define_{kind}_config(...), got define_{spec.kind}_config(...)",
            source=source,
            key="config",
        )
    return spec
