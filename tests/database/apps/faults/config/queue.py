"""The fault tests' worker app: one ``database`` connection, tuned by environment
variables so each test points it at its own database and tables."""

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
            "sleep": env("DBX_SLEEP", "200ms"),
            "max_sleep": env("DBX_MAX_SLEEP", "1s"),
        }
    },
)
