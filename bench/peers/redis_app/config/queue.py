from haze import define_queue_config, env

# The driver's defaults (concurrency 1, retry_after 30s, prefix "haze"); the worker's
# --concurrency picks the variant. BENCH_REDIS_URL: a database of the benchmark's own.
config = define_queue_config(
    default="redis",
    connections={
        "redis": {
            "driver": "redis",
            "url": env("BENCH_REDIS_URL", "redis://127.0.0.1:6379/9"),
            "queues": ["bench"],
        },
    },
)
