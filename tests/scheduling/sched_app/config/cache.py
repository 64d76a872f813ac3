"""The tick claims and the leader lease live in the backend under test."""

import os

from haze import define_cache_config, env

if os.environ.get("SCHED_BACKEND") == "redis":
    store = {"driver": "redis", "connection": "default", "prefix": env("SCHED_PREFIX", "hzsched")}
else:
    store = {"driver": "database", "connection": "main"}

config = define_cache_config(default="shared", stores={"shared": store})
