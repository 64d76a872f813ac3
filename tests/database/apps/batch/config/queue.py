"""The batch-claim tests' worker app: one ``database`` connection, pointed by environment
variables at each test's database and tables."""

from haze import define_queue_config, env

config = define_queue_config(
    default="db",
    connections={
        "db": {
            "driver": "database",
            "connection": "main",
            "table": env("DBX_TABLE", "jobs"),
            "failed_table": env("DBX_FAILED_TABLE", "failed_jobs"),
            "retry_after": env("DBX_RETRY_AFTER", "90s"),
            "sleep": "100ms",
            "max_sleep": "500ms",
        }
    },
)
