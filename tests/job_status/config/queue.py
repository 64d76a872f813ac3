"""The job-status test's worker app: a ``database`` (SQLite file) and a ``redis``
connection, each with the same backend's shared store for status records and cancel
markers, pointed by environment variables at the test's files and Redis prefix (see
``test_cancel_procs.py``)."""

from haze import define_queue_config, env

config = define_queue_config(
    default=env("JSTAT_CONNECTION", "db"),
    store=env("JSTAT_STORE", "db"),
    connections={
        "db": {
            "driver": "database",
            "connection": "main",
            "retry_after": "30s",
            "sleep": "100ms",
            "max_sleep": "200ms",
        },
        "r": {
            "driver": "redis",
            "url": env("JSTAT_REDIS_URL", "redis://127.0.0.1:6379/0"),
            "prefix": env("JSTAT_PREFIX", "jstat"),
        },
    },
)
