"""Fuzz the config loader: what ``config/queue.py``, ``cache.py``, ``redis.py`` and
``database.py`` define (``define_*_config``), checked as an ``App`` reads it. Config
files are Python, so any value can reach any option. A config is taken, or refused
with one ``ConfigError`` line naming the file and the key.
"""

from __future__ import annotations

from typing import Any

from fuzzing import fuzz, integers, json_values, one_line, outcome
from haze import drivers, stores
from haze._app.config import (
    define_cache_config,
    define_database_config,
    define_queue_config,
    define_redis_config,
    validate_cache,
    validate_database,
    validate_queue,
    validate_redis,
)
from haze._kernel.errors import ConfigError
from hypothesis import example, given
from hypothesis import strategies as st

NAMES = ["main", "q", "r", "", "a b", "x" * 300, "0"]
COMMON = {"driver", "max_message_size", "concurrency", "queues"}
#: Every option some driver or store class declares (the kv store's is the cloudflare
#: adapter's), then one none does.
QUEUE_OPTIONS = sorted(
    COMMON.union(*(drivers.driver_class(d).options for d in drivers.REGISTRY.names())) | {"other"}
)
CACHE_OPTIONS = sorted(
    {"driver", "binding"}.union(*(stores.store_class(s).options for s in stores.REGISTRY.names()))
    | {"other"}
)
REDIS_OPTIONS = ["url", "host", "port", "db", "username", "password", "key_prefix", "ssl",
                 "socket_timeout", "socket_keepalive", "other"]  # fmt: skip
DB_OPTIONS = ["url", "auth_token", "api_token", "pool_size", "options", "busy_timeout", "other"]
#: Values that mean something to some option, then anything.
option_values = (
    st.sampled_from(
        ["memory", "redis", "database", "sqs", "cloudflare", "failover", "sync", "kv", "30s",
         "0", "-1s", "7d", "redis://127.0.0.1:6379/0", "sqlite:///x.db", "postgres://u:p@h/db",
         "main", "q", ["q"], ["main", "q"], [], True, 0, -1, 10**400]
    )
    | json_values
    | integers
)  # fmt: skip


def _connections(options: list[str]) -> st.SearchStrategy[Any]:
    one = st.dictionaries(st.sampled_from(options), option_values, max_size=5)
    return st.dictionaries(st.sampled_from(NAMES), one, max_size=3) | json_values


def _extra(draw: st.DrawFn) -> dict[str, Any]:
    keys = st.sampled_from(["telemetry", "track", "keep_result", "x"])
    extra: dict[str, Any] = draw(st.dictionaries(keys, option_values))
    return extra


@st.composite
def specs(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "queue": define_queue_config(
            default=draw(st.sampled_from(NAMES) | json_values),
            connections=draw(_connections(QUEUE_OPTIONS)),
            store=draw(st.none() | st.sampled_from(NAMES)),
            batches=draw(st.none() | st.dictionaries(st.sampled_from(["store", "ttl", "x"]), option_values)),
            run_in_server=draw(st.booleans() | json_values),
            **_extra(draw),
        ),
        "cache": define_cache_config(
            default=draw(st.none() | st.sampled_from(NAMES)), stores=draw(_connections(CACHE_OPTIONS))
        ),
        "redis": define_redis_config(
            default=draw(st.none() | st.sampled_from(NAMES)), connections=draw(_connections(REDIS_OPTIONS))
        ),
        "database": define_database_config(
            default=draw(st.none() | st.sampled_from(NAMES)), connections=draw(_connections(DB_OPTIONS))
        ),
    }  # fmt: skip


@fuzz(150)
@given(specs())
@example(
    {
        "queue": define_queue_config(
            default="q", connections={"q": {"driver": "redis", "retry_after": 10**400}}
        ),
        "cache": None,
        "redis": None,
        "database": None,
    }
)
@example(
    {
        "queue": define_queue_config(default="q", connections={"0\n": False}),  # type: ignore[dict-item]
        "cache": None,
        "redis": None,
        "database": None,
    }
)
def test_a_config_is_taken_or_refused_in_one_line(spec: dict[str, Any]) -> None:
    for check, value in (
        (validate_queue, spec["queue"]),
        (validate_cache, spec["cache"]),
        (validate_redis, spec["redis"]),
        (validate_database, spec["database"]),
    ):
        _, error = outcome(ConfigError, check, value)
        assert error is None or one_line(error), error
