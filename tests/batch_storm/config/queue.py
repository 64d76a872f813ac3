"""The batch storm's worker app: one ``database`` and one ``redis`` connection, each with
its own shared store for batch state, pointed by environment variables at the test's
database, tables and Redis prefix (see ``tests/batch_storm/test_batch_storm.py``)."""

from haze import define_queue_config, env

config = define_queue_config(
    default=env("BST_CONNECTION", "db"),
    store=env("BST_STORE", "db"),
    connections={
        "db": {
            "driver": "database",
            "connection": "main",
            "table": env("BST_TABLE", "bst_jobs"),
            "failed_table": env("BST_FAILED_TABLE", "bst_failed_jobs"),
            "retry_after": env("BST_RETRY_AFTER", "3s"),
            "sleep": "100ms",
            "max_sleep": "500ms",
        },
        "r": {
            "driver": "redis",
            "url": env("BST_REDIS_URL", "redis://127.0.0.1:6379/0"),
            "prefix": env("BST_PREFIX", "bst"),
            "queues": ["default"],
            "retry_after": env("BST_RETRY_AFTER", "3s"),
        },
    },
)
