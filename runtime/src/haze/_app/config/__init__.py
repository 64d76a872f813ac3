"""Configuration: ``define_*_config`` helpers, ``env()`` and validation.

``schema`` holds what a config file writes and what it becomes, ``environment`` the
``env()`` reads, ``checks`` the checks of one value, ``validate`` each file's checks.

A ``define_*_config`` call only records the raw mapping and where it was written;
the app validates it at start, so every error can name the file and the key::

    # config/queue.py
    from haze import define_queue_config, env
    config = define_queue_config(default=env("QUEUE_CONNECTION", "memory"),
                                 connections={"memory": {"driver": "memory", "concurrency": 2}})
"""

from __future__ import annotations

from haze._app.config.checks import MAX_CONNECTION_NAME
from haze._app.config.environment import EnvValue, env, env_source, read_env
from haze._app.config.schema import (
    CacheConfig,
    ConfigSpec,
    DatabaseConfig,
    HazeConfig,
    QueueConfig,
    RedisConfig,
    define_cache_config,
    define_database_config,
    define_haze_config,
    define_queue_config,
    define_redis_config,
)
from haze._app.config.validate import (
    validate_cache,
    validate_database,
    validate_haze,
    validate_queue,
    validate_redis,
)

__all__ = [
    "MAX_CONNECTION_NAME",
    "CacheConfig",
    "ConfigSpec",
    "DatabaseConfig",
    "EnvValue",
    "HazeConfig",
    "QueueConfig",
    "RedisConfig",
    "define_cache_config",
    "define_database_config",
    "define_haze_config",
    "define_queue_config",
    "define_redis_config",
    "env",
    "env_source",
    "read_env",
    "validate_cache",
    "validate_database",
    "validate_haze",
    "validate_queue",
    "validate_redis",
]
