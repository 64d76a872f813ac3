from haze import define_queue_config, env

config = define_queue_config(
    default=env("QUEUE_CONNECTION", "database"),
    connections={
        # The embedded default: jobs in a SQLite table, worked by `haze queue:work`.
        "database": {
            "driver": "database",
            "connection": "main",
            "retry_after": "90s",
            "sleep": "100ms",
            "queues": ["high", "default"],
        },
        # Deploy targets (infra/examples): SQS behind Lambda, Cloudflare Queues in a Worker.
        # In the Worker (haze.config.py's vars) DATABASE_URL is the D1 binding, so final
        # failures land in D1's failed_jobs and the locks and batches (store= below) in D1.
        "sqs": {
            "driver": "sqs",
            "queue_url": env(
                "SQS_URL", "https://sqs.eu-west-1.amazonaws.com/000000000000/haze-example-{queue}"
            ),
            "queues": ["high", "default"],
        },
        "cloudflare": {"driver": "cloudflare", "binding": "QUEUE", "failed_store": "main"},
        # Vercel Queues: `QUEUE_CONNECTION=vercel haze build --preset vercel` adds the
        # consumer function api/queue.py; DATABASE_URL (PostgreSQL) keeps failures.
        "vercel": {
            "driver": "vercel",
            "topic": "haze-example-{queue}",
            "region": env("VERCEL_REGION", "iad1"),
            "failed_store": "main",
            "queues": ["high", "default"],
        },
        "memory": {"driver": "memory", "concurrency": 2},
        "sync": {"driver": "sync"},
    },
    # Locks and batch state must be shared by the web process and the workers.
    store="database",
    batches={"ttl": "7d"},
)
