from haze import define_queue_config, env

config = define_queue_config(
    default="db",
    connections={
        "db": {
            "driver": "database",
            "connection": "main",
            "table": env("EDGE_TABLE", "jobs"),
            "failed_table": env("EDGE_FAILED_TABLE", "failed_jobs"),
            "retry_after": "90s",
            "sleep": "100ms",
            "max_sleep": "500ms",
        }
    },
)
