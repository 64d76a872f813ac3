from haze import define_queue_config, env

config = define_queue_config(
    default=env("QUEUE_CONNECTION", "memory"),
    connections={
        "memory": {"driver": "memory", "concurrency": 2},
        "sync": {"driver": "sync"},
    },
    batches={"ttl": "7d"},
)
