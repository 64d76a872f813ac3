"""The workflow storm's worker app: one ``database`` and one ``redis`` connection, each with
its own shared store for workflow state, pointed by environment variables at the test's
database, tables and Redis prefix (see ``tests/workflow_storm/test_workflow_storm.py``)."""

from haze import define_queue_config, env

config = define_queue_config(
    default=env("WST_CONNECTION", "db"),
    store=env("WST_STORE", "db"),
    connections={
        "db": {
            "driver": "database",
            "connection": "main",
            "table": env("WST_TABLE", "wst_jobs"),
            "failed_table": env("WST_FAILED_TABLE", "wst_failed_jobs"),
            "retry_after": env("WST_RETRY_AFTER", "3s"),
            "sleep": "100ms",
            "max_sleep": "500ms",
        },
        "r": {
            "driver": "redis",
            "url": env("WST_REDIS_URL", "redis://127.0.0.1:6379/0"),
            "prefix": env("WST_PREFIX", "wst"),
            "queues": ["default"],
            "retry_after": env("WST_RETRY_AFTER", "3s"),
        },
    },
)
