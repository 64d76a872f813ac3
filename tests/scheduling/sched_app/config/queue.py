"""The scheduler process test's app: one ``postgres`` or ``redis`` connection chosen by
SCHED_BACKEND, pointed at the test's own database or key prefix."""

import os

from haze import define_queue_config, env

if os.environ.get("SCHED_BACKEND") == "redis":
    connection = {
        "driver": "redis",
        "url": env("SCHED_REDIS_URL", "redis://127.0.0.1:6379/0"),
        "prefix": env("SCHED_PREFIX", "hzsched"),
    }
else:
    connection = {"driver": "database", "connection": "main", "sleep": "100ms"}

config = define_queue_config(default="q", connections={"q": connection})
