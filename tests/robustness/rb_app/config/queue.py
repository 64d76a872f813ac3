"""The robustness tests' worker app: a ``database`` connection ``db`` and a ``redis``
connection ``r``, pointed by environment variables at the test's own tables or key
prefix (see ``tests/robustness/rb_harness.py``)."""

from haze import define_queue_config, env

config = define_queue_config(
    default="db",
    connections={
        "db": {
            "driver": "database",
            "connection": "main",
            "table": env("RB_TABLE", "jobs"),
            "failed_table": env("RB_FAILED_TABLE", "failed_jobs"),
            "retry_after": env("RB_RETRY_AFTER", "90s"),
            "sleep": "100ms",
            "max_sleep": "300ms",
        },
        "r": {
            "driver": "redis",
            "url": env("RB_REDIS_URL", "redis://127.0.0.1:6379/0"),
            "prefix": env("RB_PREFIX", "rb"),
            "queues": ["default"],
            "retry_after": env("RB_RETRY_AFTER", "30s"),
        },
    },
)
