from haze import define_queue_config, env

config = define_queue_config(
    default="db",
    connections={
        "db": {
            "driver": "database",
            "connection": "main",
            "retry_after": "60s",
            "sleep": "1s",
            "concurrency": env("BENCH_CONCURRENCY", 8),
        },
    },
)
